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


def switch(node) -> bool:
    """What `grader.ran`'s probes watch: a comparison but `is`/`is not`, a `min`/`max` of two or more arguments."""
    if isinstance(node, ast.Compare):
        return not all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
    return truth(node) or sorted_display(node) or spelled_order(node) or pick(node)


# a maximum or minimum by any name: the builtins (also as `builtins.max`), numpy's elementwise ones on scalars
PICKS = frozenset(("min", "max", "maximum", "minimum", "fmax", "fmin"))
# a comparison by order spelled as a call: `operator.lt(j, 512)`, `j.__lt__(512)`, `np.greater(n, 4096)`
ORDER_CALLS = frozenset(("lt", "le", "gt", "ge", "less", "less_equal", "greater", "greater_equal",
                         "__lt__", "__le__", "__gt__", "__ge__"))


def _called(node) -> str | None:
    f = getattr(node, "func", None) if isinstance(node, ast.Call) else None
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def pick(node) -> bool:
    """A call named like a maximum or minimum (`max`, `builtins.max`, `np.maximum`, `fmin`, ...) of two or more plain
    arguments: at run time the probe tells which argument it gave (by identity for the builtins, by value for numpy's
    on scalars); any other function of that name is no switch (OTHER)."""
    return (_called(node) in PICKS and len(node.args) >= 2 and not node.keywords
            and not any(isinstance(a, ast.Starred) for a in node.args))


def spelled_order(node) -> bool:
    """A comparison by order spelled as a call (`operator.lt(j, 512)`, `j.__gt__(4096)`, `np.less(n, 4096)`)."""
    name = _called(node)
    return (name in ORDER_CALLS and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)
            and len(node.args) == (1 if name.startswith("__") and isinstance(node.func, ast.Attribute) else 2))


def shifted(node) -> bool:
    """A `min`/`max` one of whose arguments shifts a value by a number other than 0 and ±1 (`max(0, n - 1024)`): a
    clamp at zero of a shifted size is a threshold, not the guard of a degenerate value."""
    return isinstance(node, ast.Call) and any(
        isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub))
        and any(number(side) not in (None, 0, 1, -1) for side in (n.left, n.right))
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


def ordered(node) -> bool:
    """A comparison by order (`<`, `<=`, `>`, `>=`): a switch whatever it compares — a threshold hides as well in
    text (`f"{n:08}" > "00004096"`), bytes or an imported constant as in a number — so it is judged with no taint."""
    return spelled_order(node) or (isinstance(node, ast.Compare)
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
