"""What `grader.ran`'s probes watch (its rule's "switches"): a comparison, a `min`/`max`, `sorted((a, b))`, `bool(x)` or a
table's key in a notebook's function, which must come out more than one way while the checks run — `Switch`, and
the tests that find them in a function's source (`switch`, `table_key`, ...)."""
from __future__ import annotations

import ast


def number(node) -> float | None:
    """The value of a number literal (`4096`, `-1`), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = number(node.operand)
        return None if inner is None else -inner if isinstance(node.op, ast.USub) else inner
    return None


class Switch:
    """A comparison (`j < 512`, `len(live) > 8`) or a `min`/`max` (`max(block, n - 1024)`) that could hold a size
    threshold, wherever it stands — a test, a factor, an index, a loop's count: while the checks run, the comparison
    must come out both ways and `min`/`max` must take each of its arguments, or it is a switch they never flip."""

    __slots__ = ("node", "path", "kind")

    def __init__(self, node: ast.AST, path: tuple, kind: str | None = None):
        self.node, self.path = node, path
        # "key": the key a table of the cells' (a display, or a module-level name bound to one) is looked up by
        self.kind = kind or ("compare" if isinstance(node, ast.Compare) or truth(node) or spelled_order(node) else
                             "order" if sorted_display(node) else "pick")

    def span(self) -> tuple:
        n = self.node
        return (n.lineno, n.col_offset, n.end_lineno, n.end_col_offset)


def switch(node, aliases: dict | None = None) -> bool:
    """What `grader.ran`'s probes watch: a comparison but `is`/`is not`, a `min`/`max` of two or more arguments
    (`aliases`: names the cells bind to one, `pick_aliases`)."""
    if isinstance(node, ast.Compare):
        return not all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
    return truth(node) or sorted_display(node) or spelled_order(node, aliases) or pick(node, aliases)


# a maximum or minimum by any name: the builtins (also as `builtins.max`), numpy's elementwise ones on scalars
PICKS = frozenset(("min", "max", "maximum", "minimum", "fmax", "fmin"))
# a comparison by order spelled as a call: `operator.lt(j, 512)`, `j.__lt__(512)`, `np.greater(n, 4096)`
ORDER_CALLS = frozenset(("lt", "le", "gt", "ge", "less", "less_equal", "greater", "greater_equal",
                         "__lt__", "__le__", "__gt__", "__ge__"))


def _called(node, aliases: dict | None = None) -> str | None:
    f = getattr(node, "func", None) if isinstance(node, ast.Call) else None
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return (aliases or {}).get(name, name) if isinstance(f, ast.Name) else name


def pick_aliases(tree) -> dict[str, str]:
    """{name: the maximum, minimum or comparison it is bound to} for the names `tree` binds to one under another name:
    `pick = max`, `pick = builtins.max`, `top = np.maximum`, `less = operator.lt`, `from builtins import max as pick`,
    `pick, low = max, min`. A call of such a name is probed like one of the function's own; what it calls at run time
    decides, as for any `max` (another function there is no switch: OTHER)."""
    known = PICKS | ORDER_CALLS
    found: dict[str, str] = {}
    for n in ast.walk(tree):
        pairs = []
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    pairs.append((t.id, n.value))
                elif isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) and len(t.elts) == len(n.value.elts):
                    pairs += [(e.id, v) for e, v in zip(t.elts, n.value.elts) if isinstance(e, ast.Name)]
        elif isinstance(n, ast.ImportFrom):
            pairs = [(a.asname, ast.Name(a.name)) for a in n.names if a.asname]
        for name, value in pairs:
            what = value.id if isinstance(value, ast.Name) else value.attr if isinstance(value, ast.Attribute) else None
            if what in known and name not in known:
                found.setdefault(name, what)
    return found


def pick(node, aliases: dict | None = None) -> bool:
    """A call named like a maximum or minimum (`max`, `builtins.max`, `np.maximum`, `fmin`, ...; or a name `aliases`
    binds to one) of two or more plain arguments: at run time the probe tells which argument it gave (by identity for
    the builtins, by value for numpy's on scalars); any other function of that name is no switch (OTHER)."""
    return (_called(node, aliases) in PICKS and len(node.args) >= 2 and not node.keywords
            and not any(isinstance(a, ast.Starred) for a in node.args))


def spelled_order(node, aliases: dict | None = None) -> bool:
    """A comparison by order spelled as a call (`operator.lt(j, 512)`, `j.__gt__(4096)`, `np.less(n, 4096)`; or a name
    `aliases` binds to one: `less = operator.lt`)."""
    name = _called(node, aliases)
    return (name in ORDER_CALLS and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)
            and len(node.args) == (1 if name.startswith("__") and isinstance(node.func, ast.Attribute) else 2))


def shifted(node, constants: set = frozenset()) -> bool:
    """A `min`/`max` one of whose arguments shifts a value by a number other than 0 and ±1 (`max(0, n - 1024)`), or
    by a name bound to one (`constants`: `max(0, n - LIMIT)` with `LIMIT = 1024`): a clamp at zero of a shifted size
    is a threshold, not the guard of a degenerate value."""
    return isinstance(node, ast.Call) and any(
        isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub))
        and any(number(side) not in (None, 0, 1, -1) or (isinstance(side, ast.Name) and side.id in constants)
                for side in (n.left, n.right))
        for a in node.args for n in ast.walk(a))


_TABLE_CALLS = frozenset(("dict", "fromkeys", "tuple", "list", "frozenset", "OrderedDict", "defaultdict"))


def module_tables(tree) -> set[str]:
    """Names a cell binds at its top level to a table: a dict, list or tuple display, or `dict(...)`,
    `dict.fromkeys(...)`, `tuple(...)`, `list(...)`."""
    out = set()
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign) and _is_table(node.value, set()):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


def _is_table(node, tables: set) -> bool:
    if isinstance(node, (ast.Dict, ast.List, ast.Tuple)):
        return True
    if isinstance(node, ast.Name):
        return node.id in tables
    f = getattr(node, "func", None)
    return isinstance(node, ast.Call) and (getattr(f, "id", None) or getattr(f, "attr", None)) in _TABLE_CALLS


def table_key(node, tables: set):
    """The key expression of a lookup in a table (`T[key]`, `T.get(key, ...)`) where T is a display or one of
    `tables` (module_tables), or None."""
    if isinstance(node, ast.Subscript) and not isinstance(node.slice, (ast.Slice, ast.Tuple)) and _is_table(
            node.value, tables) and not isinstance(node.value, ast.Call):
        return node.slice
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args
            and not isinstance(node.func.value, ast.Call) and _is_table(node.func.value, tables)):
        return node.args[0]
    return None


def sorted_display(node) -> bool:
    """`sorted((a, b))`: a min and a max at once (`sorted((block, n - 1024))[-1]`)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sorted"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.Tuple, ast.List))
            and 2 <= len(node.args[0].elts) <= 8 and not any(isinstance(e, ast.Starred) for e in node.args[0].elts))


def truth(node) -> bool:
    """`bool(x)`: a comparison with zero by another name (`(block, n)[bool(n // 1025)]`)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bool"
            and len(node.args) == 1 and not node.keywords)


def ordered(node, aliases: dict | None = None) -> bool:
    """A comparison by order (`<`, `<=`, `>`, `>=`): a switch whatever it compares — a threshold hides as well in
    text (`f"{n:08}" > "00004096"`), bytes or an imported constant as in a number — so it is judged with no taint."""
    return spelled_order(node, aliases) or (isinstance(node, ast.Compare)
                                   and any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops))


def emptiness(node) -> bool:
    """A comparison whose other sides are a plain name, attribute or `len` of one (`len(self.queue) > 0`, `n == 0`):
    with a literal 0, ±1 or None (`degenerate`), whether something is empty — no arithmetic to hide a size in."""
    def plain(x):
        if isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and x.func.id == "len" and len(x.args) == 1:
            x = x.args[0]
        return isinstance(x, (ast.Name, ast.Attribute)) or number(x) is not None or isinstance(x, ast.Constant)
    return isinstance(node, ast.Compare) and all(plain(x) for x in [node.left, *node.comparators])


def degenerate(node) -> bool:
    """A comparison with 0, ±1, None or an empty literal (`n % bs == 0`, `budget > 0`); a `min`/`max` with 0 or ±1
    among its arguments (`max(1, 32 // bs)`): a guard for a degenerate value."""
    parts = node.args if isinstance(node, ast.Call) else [node.left, *node.comparators]
    return any(number(p) in (0, 1, -1) or (isinstance(p, ast.Constant) and p.value in (None, "", b""))
               or (isinstance(p, (ast.Tuple, ast.List, ast.Dict, ast.Set)) and not getattr(p, "elts", getattr(p, "keys", ())))
               for p in parts)


OTHER = "other"  # what a probe saw that is no switch: a tensor of comparisons, min/max of tensors or with a key
_QUOTIENTS = {ast.FloorDiv: "//", ast.RShift: ">>", ast.Mod: "%"}
_SEQUENCES = (list, tuple, str, bytes, bytearray, range)


def quotient(node) -> str | None:
    """`n // 8192`, `n >> 13`, `n % 8192`, `divmod(n, 8192)` ("//"): the operator's symbol, or None. A quotient by a size that is 0 every time
    (`step = grp - (grp // 7) * (grp - 1)`), or a remainder that never wraps, is a switch the checks never flipped."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "divmod":
        return "//" if len(node.args) == 2 and not node.keywords and not any(
            isinstance(a, ast.Starred) for a in node.args) else None
    return _QUOTIENTS.get(type(node.op)) if isinstance(node, ast.BinOp) else None


def divided(node):
    """The divisor of a quotient (`quotient`): `n // 8192`'s 8192, `divmod(n, 8192)`'s."""
    return node.right if isinstance(node, ast.BinOp) else node.args[1] if quotient(node) else None


def slices(node) -> list:
    """The slices of a subscript (`p[:64]`, `x[..., -512:]`, `r[8:] = 0.0`) with a bound, each with the dimension it
    cuts (negative: counted from the end, after an Ellipsis) and its place in the key."""
    key = node.slice if isinstance(node, ast.Subscript) else None
    parts = key.elts if isinstance(key, ast.Tuple) else [key] if key is not None else []
    if any(isinstance(p, ast.Constant) and p.value is None for p in parts):
        return []  # a new axis: the dimensions shift
    out, dim, after = [], 0, None
    for pos, part in enumerate(parts):
        if isinstance(part, ast.Constant) and part.value is Ellipsis:
            after = len(parts) - pos - 1
            continue
        here = dim if after is None else -after
        if after is not None:
            after -= 1
        dim += 1
        if isinstance(part, ast.Slice) and (part.lower is not None or part.upper is not None):
            out.append((here, pos if isinstance(key, ast.Tuple) else None, part))
    return out


def _plain(node) -> bool:
    """A name or a chain of attributes of one (`r`, `self.k`): evaluated twice, it gives the same object."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _loaded(node):
    """A copy of a plain target (`_plain`) to read."""
    if isinstance(node, ast.Attribute):
        return ast.copy_location(ast.Attribute(_loaded(node.value), node.attr, ast.Load()), node)
    return ast.copy_location(ast.Name(node.id, ast.Load()), node)


def number_names(tree) -> set[str]:
    """Names `tree` binds to a number literal other than 0 and ±1 (`W = 512`, `BIG: int = 8192`)."""
    return {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign)) and number(n.value) not in
            (None, 0, 1, -1) for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}


def sized(expr, constants: set) -> bool:
    """Whether `expr` (a slice's bound, a divisor) names a size of its own: a number literal other than 0 and ±1, or a
    name bound to one (`constants`) — not a size the caller passes (`t[-n:]`, `n // bs`), which the checks vary."""
    return any(number(n) not in (None, 0, 1, -1) or (isinstance(n, ast.Name) and n.id in constants)
               for n in ast.walk(expr))


def quotient_seen(kind: str, x, y):
    """What a quotient's probe records: the quotient (0 or not) of plain numbers, "same"/"wrapped" for a remainder."""
    if not (type(x) in (int, float) and type(y) in (int, float)) or not y or (kind == ">>" and (y < 0 or type(y) is float)):
        return OTHER
    if kind == "%":
        return "same" if x % y == x else "wrapped"
    value = x // y if kind == "//" else x >> y
    return 0 if value == 0 else 1


def slice_seen(kind: str, seq, key):
    """What a slice's probe records: whether it took all of the dimension it cuts, none of it, or a part."""
    _, dim, pos = kind.split()
    dim = int(dim)
    part = key if pos == "-" else key[int(pos)] if type(key) is tuple and int(pos) < len(key) else None
    if type(part) is not slice or not all(b is None or type(b) is int for b in (part.start, part.stop, part.step)):
        return OTHER
    if type(seq) in _SEQUENCES:
        if dim not in (0, -1):
            return OTHER
        length = len(seq)
    elif type(seq).__name__ in ("Tensor", "ndarray") and type(seq).__module__ in ("torch", "numpy"):
        shape = tuple(seq.shape)
        if not -len(shape) <= dim < len(shape):
            return OTHER
        length = shape[dim]
    else:
        return OTHER
    if not length or part.step == 0:
        return OTHER
    taken = len(range(*part.indices(length)))
    return "whole" if taken == length else "none" if taken == 0 else "part"


class Probes(ast.NodeTransformer):
    """`LinesRun.compile_cell`'s rewrite: each comparison but `is`/`is not`, and each `min`/`max` of two or more
    plain arguments, through a lambda whose first parameter's name carries the token and the probe's key."""

    def __init__(self, token: str, table: list, filename: str, tables: set = frozenset(), aliases: dict | None = None):
        self.token, self.table, self.filename, self.tables, self.aliases = token, table, filename, tables, aliases

    def _keyed(self, node, key):
        """`node` (a lookup) with its key put through a probe that records it."""
        probe = ast.copy_location(ast.Call(func=self._lambda(key, "key", False), args=[key], keywords=[]), key)
        if isinstance(node, ast.Subscript):
            node.slice = probe
        else:
            node.args[0] = probe
        return node

    def visit_Subscript(self, node):
        self.generic_visit(node)
        key = table_key(node, self.tables)
        if key is not None and isinstance(node.ctx, ast.Load):
            return self._keyed(node, key)
        cuts = slices(node)
        if not cuts or isinstance(node.ctx, ast.Del):
            return node
        dim, pos, _ = cuts[0]
        kind = f"slice {dim} {'-' if pos is None else pos}"
        if isinstance(node.ctx, ast.Load):  # `p[:64]` -> `(lambda F, S: F[S])(p, slice(None, 64))`: one evaluation each
            return ast.copy_location(ast.Call(func=self._pair(node, kind, lambda f, k: ast.Subscript(f, k, ast.Load())),
                                              args=[node.value, node.slice], keywords=[]), node)
        if _plain(node.value):  # `r[8:] = 0.0` -> `r[(lambda F, S: S)(r, slice(8, None))] = 0.0`
            node.slice = ast.copy_location(ast.Call(func=self._pair(node, kind, lambda f, k: k),
                                                    args=[_loaded(node.value), node.slice], keywords=[]), node.slice)
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        kind = quotient(node)
        if kind is None:
            return node
        return ast.copy_location(ast.Call(func=self._pair(node, kind, lambda f, k: ast.BinOp(f, type(node.op)(), k)),
                                          args=[node.left, node.right], keywords=[]), node)

    def _pair(self, node, kind: str, body) -> ast.Lambda:
        """`lambda F, S: body(F, S)`, F's name carrying the token and the probe's key."""
        self.table.append((self.filename, (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset), kind))
        first, second = f"__ran{self.token}_{len(self.table) - 1}__", f"__ran{self.token}_s__"
        args = ast.arguments(posonlyargs=[], args=[ast.arg(first), ast.arg(second)], kwonlyargs=[], kw_defaults=[],
                             defaults=[])
        made = ast.Lambda(args=args, body=body(ast.Name(first, ast.Load()), ast.Name(second, ast.Load())))
        for part in ast.walk(made):
            if "lineno" in getattr(part, "_attributes", ()):
                ast.copy_location(part, node)
        return made

    def _lambda(self, node, kind: str, rest: bool) -> ast.Lambda:
        self.table.append((self.filename, (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset), kind))
        first = f"__ran{self.token}_{len(self.table) - 1}__"
        a, k = f"__ran{self.token}_a__", f"__ran{self.token}_k__"
        args = ast.arguments(posonlyargs=[], args=[ast.arg(first)], kwonlyargs=[], kw_defaults=[], defaults=[],
                             vararg=ast.arg(a) if rest else None, kwarg=ast.arg(k) if rest else None)
        body = (ast.Call(func=ast.Name(first, ast.Load()), args=[ast.Starred(ast.Name(a, ast.Load()), ast.Load())],
                         keywords=[ast.keyword(arg=None, value=ast.Name(k, ast.Load()))])
                if rest else ast.Name(first, ast.Load()))
        made = ast.Lambda(args=args, body=body)
        for part in ast.walk(made):
            if "lineno" in getattr(part, "_attributes", ()):
                ast.copy_location(part, node)
        return made

    def visit_Compare(self, node):
        self.generic_visit(node)
        if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            return node
        return ast.copy_location(ast.Call(func=self._lambda(node, "compare", False), args=[node], keywords=[]), node)

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        key = table_key(node, self.tables)
        if key is not None:
            return self._keyed(node, key)
        if isinstance(f, ast.Name) and f.id == "bool" and len(node.args) == 1 and not node.keywords:
            return ast.copy_location(ast.Call(func=self._lambda(node, "compare", False), args=[node], keywords=[]), node)
        if quotient(node):  # `divmod(n, 8192)`: its quotient, as `n // 8192`'s
            return ast.copy_location(ast.Call(func=self._pair(node, "//", lambda f, k: ast.Call(
                ast.Name("divmod", ast.Load()), [f, k], [])), args=list(node.args), keywords=[]), node)
        if spelled_order(node, self.aliases):  # `operator.lt(j, 512)`, `j.__lt__(512)`: a comparison by another name
            return ast.copy_location(ast.Call(func=self._lambda(node, "compare", False), args=[node], keywords=[]), node)
        if pick(node, self.aliases) or sorted_display(node):
            kind = "order" if sorted_display(node) else "pick"
            return ast.copy_location(ast.Call(func=self._lambda(node, kind, True), args=[f, *node.args], keywords=[]),
                                     node)
        return node


