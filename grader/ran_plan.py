"""What of a function of the notebook's must run while its exercise is checked (`grader.ran`'s rule), read from its
source: `Taint` (what could hold a size threshold in a cell's code), `FunctionPlan` (a function's statements and the
arms inside them, each with the optional groups it sits in), `Arm`, and the helpers `grader.ran` judges with."""
from __future__ import annotations

import ast

from grader.ran_switch import (Switch, degenerate, divided, emptiness, module_tables, number, number_names, ordered,
                               pick, pick_aliases, quotient, shifted, sized, slices, spelled_order, switch, table_key)

_SCALING = (ast.Mult, ast.Pow, ast.LShift, ast.RShift, ast.MatMult, ast.Div, ast.FloorDiv, ast.Mod)

# calls that test, reduce or convert a value without making a new size from it
_PLAIN_CALLS = frozenset(("len", "float", "int", "bool", "abs", "sum", "min", "max", "any", "all", "item", "numel",
                          "amax", "amin", "clamp", "clamp_min", "clamp_max", "isinf", "isnan", "isfinite", "nonzero",
                          "count_nonzero", "clone", "detach", "to", "double", "sub", "neg", "size", "dim",
                          "range", "enumerate", "zip", "reversed", "sorted", "list", "tuple", "set", "dict", "values",
                          "keys", "items", "where", "isclose", "allclose", "equal", "eq", "ne", "lt", "le", "gt", "ge",
                          "logical_not", "logical_and", "logical_or", "contiguous", "cpu", "cuda", "half", "bfloat16",
                          "reshape", "view", "flatten", "squeeze", "unsqueeze", "transpose", "permute", "expand",
                          "as_tensor", "exp", "log", "sqrt", "isinstance", "callable", "type", "is_available",
                          "is_floating_point", "is_complex", "is_grad_enabled", "get", "pop", "popleft", "append",
                          "startswith", "endswith", "copy", "deque", "tensor", "long", "is_tensor"))
_BUILTIN_VALUES = frozenset(("None", "True", "False", "len", "sum", "min", "max", "abs", "float", "int", "any", "all",
                             "range", "enumerate", "zip", "reversed", "sorted", "isinstance", "callable", "type",
                             "str", "bool", "list", "tuple", "dict", "set", "torch", "np", "numpy", "math"))


def _assigned(func: ast.AST) -> dict[str, int]:
    """{name: first line it is bound on} inside `func` (not counting its parameters)."""
    out: dict[str, int] = {}
    for node in ast.walk(func):
        names = []
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names = [node.id]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        for name in names:
            out[name] = min(out.get(name, node.lineno), node.lineno)
    return out


def _indices(expr) -> set[int]:
    """ids of the nodes that are a subscript's index (`x.shape[-1]`, `rows[0]`): a number there is a position."""
    out = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Subscript):
            out.update(id(n) for n in ast.walk(node.slice))
    return out


def _rank_of(node) -> bool:
    """`x.dim()`, `x.ndim`, `len(x.shape)`: how many dimensions, not how large."""
    if isinstance(node, ast.Attribute) and node.attr == "ndim":
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("dim", "ndimension"):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and node.args
            and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "shape")


def _ranks(expr) -> set[int]:
    """ids of the numbers a comparison holds a tensor's rank against (`q.dim() == 3`): a rank is no size."""
    out = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Compare) and any(_rank_of(x) for x in [node.left, *node.comparators]):
            out.update(id(x) for x in [node.left, *node.comparators] if number(x) is not None)
            out.update(id(n) for x in [node.left, *node.comparators] if number(x) is not None for n in ast.walk(x))
    return out


def _leaves(node) -> int:
    """How many operands an arithmetic chain of `+` and `-` adds up (`n - d - d - d`: 4)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return _leaves(node.left) + _leaves(node.right)
    return 1


class Taint:
    """What could hold a size threshold in one cell's code: the names of a function bound to such a value (above a
    test, or anywhere in a loop around it), the attributes any code sets to one (`self.limit = 4096`, or to a
    parameter whose default is one), and everything when the code sets attributes by name (`setattr`)."""

    def __init__(self, tree: ast.AST):
        self.attrs: set[str] = set()
        self.own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        self.every_attr = any(isinstance(n, ast.Name) and n.id in ("setattr", "__dict__", "vars")
                              or isinstance(n, ast.Attribute) and n.attr in ("__dict__", "__setattr__")
                              for n in ast.walk(tree))
        self.safe_globals = _constant_globals(tree)
        self.number_globals = number_names(ast.Module([n for n in getattr(tree, 'body', []) if isinstance(n, (ast.Assign, ast.AnnAssign))], []))
        self.tables = module_tables(tree)
        self.aliases = pick_aliases(tree)  # `pick = max`: its calls are maxima too
        self.caught = _caught(tree)
        self.decorators = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", None)
                           for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                           for d in n.decorator_list} - {None}
        self.param_taint: dict[str, set[str]] = {}  # function name -> parameters a call in the cells passes a threshold
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        owner = {}  # id of an assignment -> the function it is in (none: a class body or the module)
        for fn in functions:
            for node in ast.walk(fn):
                owner.setdefault(id(node), fn)
        defs = {n.name: n for n in functions if not isinstance(n, ast.Lambda)}
        class_body = {id(stmt) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for stmt in c.body}
        locals_of = {id(fn): set(_params(fn)) | set(_assigned(fn)) for fn in functions}
        for _ in range(4):  # to a fixed point: an attribute set from another, a parameter passed one
            before = (len(self.attrs), sum(map(len, self.param_taint.values())))
            names_of = {id(fn): self.names(fn, _params(fn)) for fn in functions}
            for node in ast.walk(tree):
                fn = owner.get(id(node))
                local = locals_of[id(fn)] if fn is not None else set()
                names = names_of[id(fn)] if fn is not None else set()
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    in_class_body = id(node) in class_body
                    scaled = (isinstance(node, ast.AugAssign) and isinstance(node.op, _SCALING)) or \
                        self.could_scale(node.value, names, local)
                    if scaled:
                        self.attrs.update(t.attr for tg in targets for t in ast.walk(tg) if isinstance(t, ast.Attribute))
                        if in_class_body:  # `BIG = 4096` in a class body: read as `self.BIG`
                            self.attrs.update(t.id for tg in targets for t in ast.walk(tg) if isinstance(t, ast.Name))
                elif isinstance(node, ast.Call):
                    f = node.func
                    callee = defs.get(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
                    if callee is None:
                        continue
                    positional = [a.arg for a in callee.args.posonlyargs + callee.args.args]
                    if isinstance(f, ast.Attribute) and positional and positional[0] in ("self", "cls"):
                        positional = positional[1:]
                    passed = list(zip(positional, node.args)) + [(k.arg, k.value) for k in node.keywords if k.arg]
                    for param, value in passed:  # a number or a module's value handed over, not a computed tensor
                        index = _indices(value)
                        if any(id(n) not in index and number(n) not in (None, 0, 1, -1) for n in ast.walk(value)) or (
                                isinstance(value, ast.Name) and value.id not in local and value.id not in _BUILTIN_VALUES
                                and value.id not in self.safe_globals):
                            self.param_taint.setdefault(callee.name, set()).add(param)
            if (len(self.attrs), sum(map(len, self.param_taint.values()))) == before:
                break

    def raise_exempt(self, stmt) -> bool:
        """A `raise` ends a block that need not run only when no code of the cells catches what it raises: a caught
        exception carries a result out of the block (`raise _Held(k, v)` ... `except _Held as h: return h.args`)."""
        if isinstance(stmt, ast.Assert):
            return "*" not in self.caught and "AssertionError" not in self.caught
        if not isinstance(stmt, ast.Raise):
            return False
        if stmt.exc is None:
            return True  # a re-raise
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        name = exc.id if isinstance(exc, ast.Name) else exc.attr if isinstance(exc, ast.Attribute) else None
        return "*" not in self.caught and name not in self.caught

    def could_scale(self, expr, tainted: set, local: set) -> bool:
        """Whether `expr` could hold a size threshold: a number other than 0 and ±1 (not an index), a product, power,
        shift, quotient or remainder, a sum of three or more terms, a call of anything but a plain test, reduction
        or conversion (`helper(n)`, `math.prod((d, d, d))`), a tainted name or attribute, or a module-level value."""
        index = _indices(expr) | _ranks(expr)
        called = {id(n.func) for n in ast.walk(expr) if isinstance(n, ast.Call)}
        bases = {id(n.value) for n in ast.walk(expr) if isinstance(n, ast.Attribute)}
        for node in ast.walk(expr):
            if id(node) in index:
                continue
            value = number(node)
            if value is not None and value not in (0, 1, -1):
                return True
            if isinstance(node, ast.BinOp) and (isinstance(node.op, _SCALING) or _leaves(node) >= 3):
                return True
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and ast.dump(node.left) == ast.dump(node.right):
                return True  # doubling (`t + t`): a product by another name
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name not in _PLAIN_CALLS and not self._callers_method(f, tainted, local):
                    return True
                if name in ("int", "float", "len", "ord", "complex", "eval") and any(
                        isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
                    return True  # a number spelled as text (`int("4096")`)
                if name == "len" and node.args and _root(node.args[0]) not in local:
                    return True  # the length of something the module holds (`len(torch.__all__)`)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "cuda" in node.value.lower():
                return True  # the checks run on the CPU: a branch for CUDA is code they never run
            if isinstance(node, ast.Attribute) and node.attr in _DEVICE_ATTRS:
                return True
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and id(node) not in called and (
                    node.attr in self.attrs or (self.every_attr and _root(node) == "self")):
                return True  # an attribute set to a threshold (any object's state, where the cells set attributes by name)
            if isinstance(node, ast.Name):
                if node.id in tainted:
                    return True
                if (node.id not in local and id(node) not in called and id(node) not in bases
                        and node.id not in _BUILTIN_VALUES and node.id not in self.safe_globals):
                    return True  # a value of the module's (`LIMIT = 4096` in a cell)
        return False

    def _callers_method(self, f, tainted: set, local: set) -> bool:
        """A method of an object the function holds (`self.engine.step()`, `cache.append(...)`): what it returns is
        that object's, not a number of the notebook's making — unless the notebook defined a function of that name,
        or the object is held in a name or attribute that could hold a threshold."""
        if not isinstance(f, ast.Attribute) or f.attr in self.own:
            return False
        root = f.value
        while isinstance(root, ast.Attribute):
            if root.attr in self.attrs or self.every_attr:
                return False
            root = root.value
        return isinstance(root, ast.Name) and root.id in local and root.id not in tainted

    def names(self, func, params, before: int | None = None, loops: tuple = ()) -> set[str]:
        """The local names of `func` whose value could hold a threshold, to a fixed point: parameters whose default
        could, and names bound to such a value (with `before`: above that line, or anywhere in the `loops` around
        it)."""
        local = set(params) | set(_assigned(func))
        binds = []  # (names bound, the expression they get)
        passed = self.param_taint.get(getattr(func, "name", None), ())
        binds += [({p}, ast.Constant(4096)) for p in passed]  # a call in the cells passes it a threshold
        ranks = _rank_safe(func)  # `batched = q.dim() == 4`: a rank, whatever q was multiplied by
        args = func.args
        positional = args.posonlyargs + args.args
        for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
            binds.append(({arg.arg}, default))
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            if default is not None:
                binds.append(({arg.arg}, default))
        for node in ast.walk(func):
            line = getattr(node, "lineno", None)
            if before is not None and line is not None and line >= before and not any(a <= line <= b for a, b in loops):
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = _without_ranks(node.value, ranks) if node.value is not None else ast.Constant(None)
                if isinstance(node, ast.AugAssign) and isinstance(node.op, _SCALING):
                    value = ast.BinOp(left=ast.Constant(0), op=node.op, right=value)
                for target in targets:
                    binds += [({n.id for n in ast.walk(t) if isinstance(n, ast.Name)}, v) for t, v in _pairs(target, value)]
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                binds.append(({n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}, node.iter))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                binds.append(({n.id for n in ast.walk(node.optional_vars) if isinstance(n, ast.Name)},
                              node.context_expr))
        tainted: set[str] = set()
        changed = True
        while changed:
            changed = False
            for names, value in binds:
                if not names <= tainted and self.could_scale(value, tainted, local):
                    tainted |= names
                    changed = True
        return tainted


_DEVICE_ATTRS = frozenset(("is_cuda", "cuda", "is_available", "mps", "is_mps", "xpu"))


def _pairs(target, value):
    """`a, b = x, f(y)` as (a, x) and (b, f(y)): each name gets its own value; any other unpacking gets the whole."""
    same = isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
    if same and len(target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred)
                                                                for e in (*target.elts, *value.elts)):
        return [pair for t, v in zip(target.elts, value.elts) for pair in _pairs(t, v)]
    return [(target, value)]


def _root(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _constant_globals(tree) -> set[str]:
    """Module-level names bound only to a boolean, None or a string (`DEBUG = False`): no threshold."""
    body = [n for n in getattr(tree, "body", []) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))]
    safe, unsafe = set(), set()
    for node in body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        plain = (not isinstance(node, ast.AugAssign) and isinstance(node.value, ast.Constant)
                 and (node.value.value is None or isinstance(node.value.value, (bool, str))))
        (safe if plain else unsafe).update(names)
    return safe - unsafe


def _caught(tree) -> set[str]:
    """The exception names an `except` of the cells names ("*": a bare except, Exception or BaseException)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler):
            kinds = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            for kind in kinds:
                name = None if kind is None else kind.id if isinstance(kind, ast.Name) else getattr(kind, "attr", "?")
                out.add("*" if name in (None, "Exception", "BaseException") else name)
    return out


def _rank_safe(func) -> set[str]:
    """Names of `func` no binding of which holds a comparison or a number other than 0 and ±1."""
    bad, seen = set(), set()
    for node in ast.walk(func):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            seen |= names
            index = _indices(node.value)
            if any(isinstance(n, ast.Compare) or (id(n) not in index and number(n) not in (None, 0, 1, -1))
                   for n in ast.walk(node.value)):
                bad |= names
        elif isinstance(node, (ast.For, ast.comprehension, ast.withitem)):
            bad |= {n.id for n in ast.walk(getattr(node, "target", None) or getattr(node, "optional_vars", None)
                                                or ast.Pass()) if isinstance(n, ast.Name)}
    return (seen | set(_params(func))) - bad


def _without_ranks(test, safe: set):
    """`test` with each comparison of a `safe` name's rank (`q.dim() == 3`, `q.ndim`, `len(q.shape)`) read as True."""
    import copy

    def safe_rank(node) -> bool:
        of = node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args else node
        return _rank_of(node) and _root(of) in safe

    class Ranks(ast.NodeTransformer):
        def visit(self, node):
            if isinstance(node, ast.Compare) and any(safe_rank(x) for x in [node.left, *node.comparators]):
                return ast.copy_location(ast.Constant(True), node)  # a rank compared: no size in it
            if safe_rank(node):
                return ast.copy_location(ast.Constant(1), node)
            return self.generic_visit(node)

    return Ranks().visit(copy.deepcopy(test))


def _params(func) -> frozenset:
    args = func.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return frozenset(names)


def _raises(block: list, taint: Taint) -> bool:
    """A block that only leads to an error no code of the cells catches: its last statement raises (`raise`,
    `assert False`)."""
    if not block:
        return False
    last = block[-1]
    if isinstance(last, ast.Assert) and not (isinstance(last.test, ast.Constant) and not last.test.value):
        return False
    return taint.raise_exempt(last)


def _returns_empty(block: list) -> bool:
    """A block that only returns an empty list, tuple or dict (`if not outs: return []`): a guard for an input the
    checks may never draw, whose result is no route to credit (an empty answer); the test's own comparisons are still
    judged as switches. Not `return None`: a caller's `if r is None:` is an optional block of its own."""
    if len(block) != 1 or not isinstance(block[0], ast.Return):
        return False
    value = block[0].value
    return (isinstance(value, (ast.List, ast.Tuple)) and not value.elts) or (
        isinstance(value, ast.Dict) and not value.keys)


def _exits(block: list) -> bool:
    return bool(block) and isinstance(block[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def _codeless(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, (ast.Pass, ast.Global, ast.Nonlocal))
            or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)))


def _own_lines(stmt: ast.stmt) -> range:
    """The lines of `stmt` itself: a compound statement's header (up to its first inner statement), a simple one's
    whole extent (a statement split over lines may start its code on any of them)."""
    end = getattr(stmt, "end_lineno", stmt.lineno) or stmt.lineno
    inner = [s for field in ("body", "orelse", "finalbody", "handlers", "cases") for s in getattr(stmt, field, []) or []
             if isinstance(s, ast.AST) and hasattr(s, "lineno")]
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        first = min([d.lineno for d in stmt.decorator_list] + [stmt.lineno])
        body = min(s.lineno for s in stmt.body)
        return range(first, max(first, body - 1) + 1) if body > first else range(first, first + 1)
    if inner:
        end = max(stmt.lineno, min(s.lineno for s in inner) - 1)
    return range(stmt.lineno, end + 1)


class Arm:
    """Code inside one statement that need not run when the statement does: an arm of `a if c else b`, a later
    operand of `and`/`or`, a comprehension's element, a lambda's body. `path`: the optional groups it sits in."""

    __slots__ = ("node", "what", "path", "held")

    def __init__(self, node: ast.AST, what: str, path: tuple, held: bool = True):
        self.node, self.what, self.path = node, what, path
        self.held = held  # False: no statement of the body holds it (a default's lambda, made as the cell loads)

    def span(self) -> tuple:
        n = self.node
        return (n.lineno, n.col_offset, n.end_lineno, n.end_col_offset)


def inside(pos, span) -> bool:
    """Whether an instruction's position (`code.co_positions()`: line, end line, column, end column) lies in `span`
    (line, column, end line, end column)."""
    line, end_line, col, end_col = pos
    if line is None or col is None or end_line is None or end_col is None:
        return False
    a0, c0, a1, c1 = span
    return (line, col) >= (a0, c0) and (end_line, end_col) <= (a1, c1)


class FunctionPlan:
    """What must run of one function of the notebook's (its `ast` node, in its cell's file).

    Code under a test that could hold a size threshold (`Taint.could_scale`: `if n > 4096`, `if big` with
    `big = n > LIMIT`, `x if d * d * d < n else y`, a loop over `range(int(n > 4096))`) must run, as must the
    straight-line code of the function and the handlers of its `try`. A block under a test that could not (`if x is
    None`, `if not chunked and n < left`, `if float(resid.sum()) <= 0`, a loop over the blocks of the input) is an
    optional group: it need not run, but once any statement of it ran, all of it must."""

    def __init__(self, node, filename: str, method: bool, taint: Taint):
        self.node, self.filename, self.taint = node, filename, taint
        self.params = _params(node)
        self.local = set(self.params) | set(_assigned(node))
        self.loops: list[tuple] = []  # the line ranges of the loops around the statement being planned
        self.rank_safe = _rank_safe(node)
        self.constants = number_names(node) | self.taint.number_globals  # `W = 512`: a size of the code's own
        self.statements: list[tuple[ast.stmt, range, tuple]] = []  # (statement, its own lines, its groups)
        self.arms: list[Arm] = []
        self.switches: list[Switch] = []
        self.groups = 0
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # a lambda in a default runs as the body's code
            for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
                before = len(self.arms)
                self._exprs(default, ())
                for arm in self.arms[before:]:
                    arm.held = False
        self._block(node.body, ())

    def _free(self, test) -> bool:
        """Whether `test` could not hold a size threshold: either outcome may go unrun. A tensor's rank (`q.dim()`)
        counts as none when the name was never bound to anything holding a comparison or a number (`q = q * scale`
        leaves the rank a rank; `t = torch.zeros([1] * (1 + (n > 4096)))` does not)."""
        if isinstance(test, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops) and all(
                isinstance(c, ast.Constant) and c.value in (None, True, False) for c in test.comparators):
            return True  # `make if make is not None else None`: whatever `make` is bound to
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and any(
                self._flag(v.operand if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not) else v)
                for v in test.values):
            return True  # `if verbose and step % 100 == 0:`: the caller's flag turns it off
        tainted = self.taint.names(self.node, self.params, test.lineno, tuple(self.loops))
        return not self.taint.could_scale(_without_ranks(test, self.rank_safe), tainted, self.local)

    def _flag(self, node) -> bool:
        """A parameter whose default is True, False or None, never rebound (`verbose=False`): the caller's choice."""
        if not isinstance(node, ast.Name) or not isinstance(self.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        args = self.node.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        return node.id not in _assigned(self.node) and any(
            a.arg == node.id and isinstance(d, ast.Constant) and (d.value is None or isinstance(d.value, bool))
            for a, d in pairs)

    def _group(self, path: tuple) -> tuple:
        self.groups += 1
        return path + (self.groups,)

    def _block(self, block, path, header: int | None = None) -> None:
        """`header`: the line of the compound statement that holds the block — a statement on that line (`if c:
        wrong()`) cannot be told to have run by its line, so it is judged as an arm, by its instructions."""
        if _raises(block, self.taint):
            path = None
        for stmt in block:
            if path is not None and header is not None and stmt.lineno == header and not _codeless(stmt):
                self.arms.append(Arm(stmt, "the statement after the colon", path))
                continue
            self._stmt(stmt, path)
            if path is not None and isinstance(stmt, ast.If) and not stmt.orelse and _exits(stmt.body) \
                    and self._free(stmt.test):
                path = self._group(path)  # `if x is None: return a` then `return b`: the rest is the other arm

    def _stmt(self, stmt, path) -> None:
        if isinstance(stmt, ast.Raise) and self.taint.raise_exempt(stmt):
            path = None
        if path is not None and not _codeless(stmt):
            self.statements.append((stmt, _own_lines(stmt), path))
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return  # its body is its own code object: judged on its own plan (never called: its first line)
        if isinstance(stmt, ast.ClassDef):
            self._block(stmt.body, path)
            return
        if isinstance(stmt, ast.If):
            guard = _raises(stmt.body, self.taint) or _raises(stmt.orelse, self.taint)
            self._exprs(stmt.test, path, switches=not guard, test=True)  # `if n > cap: raise`: the other way errs
            free = path is not None and self._free(stmt.test)
            empty = path is not None and not stmt.orelse and _returns_empty(stmt.body)
            self._block(stmt.body, self._group(path) if free or empty else path, stmt.lineno)
            self._block(stmt.orelse, self._group(path) if free else path, stmt.lineno)
            return
        for field in ("test", "iter", "target", "value", "targets", "items", "subject", "exc", "msg", "context_expr"):
            part = getattr(stmt, field, None)
            for expr in part if isinstance(part, list) else [part]:
                if isinstance(expr, ast.withitem):
                    self._exprs(expr.context_expr, path)
                elif isinstance(expr, ast.AST):
                    self._exprs(expr, path, switches=not isinstance(stmt, ast.Assert),
                                test=field == "test")
        loop = isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
        body_path = path
        if loop:
            self.loops.append((stmt.lineno, stmt.end_lineno or stmt.lineno))
            head = stmt.test if isinstance(stmt, ast.While) else stmt.iter
            if path is not None and self._free(head):
                body_path = self._group(path)  # a loop over what the input holds may go round no time
        self._block(getattr(stmt, "body", []) or [], body_path, stmt.lineno)
        for field in ("orelse", "finalbody"):
            self._block(getattr(stmt, field, []) or [], path, stmt.lineno)
        if loop:
            self.loops.pop()
        for handler in getattr(stmt, "handlers", []) or []:
            self._block(handler.body, path, handler.lineno)
        for case in getattr(stmt, "cases", []) or []:
            self._block(case.body, path)

    def _exprs(self, expr, path, switches: bool = True, test: bool = False) -> None:
        """The arms inside an expression under a test that could hold a threshold: they must run whenever the
        statement holding them must; and its switches (`Switch`), unless `switches` is False (an `assert`'s test, the
        test of an `if` one of whose blocks only raises). `test`: `expr` is a statement's test. A comparison with
        0, ±1, None or an empty value that decides a branch (`if n % bs == 0`, `x if d > 0 else y`) is a guard for a
        degenerate value, not a switch (the branch it guards is judged as code); a `min`/`max` with 0 or ±1 is a
        clamp."""
        if path is None:
            return
        tests = set()  # ids of the nodes whose value decides a branch (a test, and the parts of `and`/`or`/`not` in one)
        stack = [expr]
        if test:
            tests.add(id(expr))
        while stack:
            node = stack.pop()
            if isinstance(node, ast.IfExp):
                tests.add(id(node.test))
            elif isinstance(node, ast.comprehension):
                tests.update(id(c) for c in node.ifs)
            if id(node) in tests:
                if isinstance(node, ast.BoolOp):
                    tests.update(id(v) for v in node.values)
                elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                    tests.add(id(node.operand))
            clamp = pick(node, self.taint.aliases) or id(node) in tests
            exempt = not switches and id(node) in tests  # the test of an `if` that raises: only where it decides it
            # an emptiness test anywhere (`return len(self.queue) > 0 or ...`): a plain value of no threshold vs 0
            exempt = exempt or (emptiness(node) and degenerate(node) and self._free(node))
            if switch(node, self.taint.aliases) and not exempt and not (
                    clamp and degenerate(node) and not shifted(node, self.constants)) and (
                    ordered(node, self.taint.aliases) or not self._free(node)):
                self.switches.append(Switch(node, path, "compare" if spelled_order(node, self.taint.aliases) else None))
            key = table_key(node, self.taint.tables)
            if key is not None and not self._free(key) and any(
                    isinstance(n, ast.Name) and n.id in self.local for n in ast.walk(key)):
                self.switches.append(Switch(key, path, "key"))  # `_FAR[j // 512]`, `{0: "a"}.get(n // 1025, "b")`
            op, divisor = quotient(node), divided(node)  # `n // 8192`, `divmod(n, 8192)`, `grp // 7`: 0 every time;
            if op and not exempt and sized(divisor, self.constants) and (  # `n % 8192`: never wrapping
                    op != "%" or number(divisor) is None or abs(number(divisor)) > 64):
                self.switches.append(Switch(node, path, op))
            cuts = slices(node)  # `p[:64]`, `tokens[-512:]`, `r[8:] = 0.0`: all or none of it every time
            if cuts and not exempt and any(b is not None and sized(b, self.constants)
                                           for b in (cuts[0][2].lower, cuts[0][2].upper)):
                self.switches.append(Switch(node, path, f"slice {cuts[0][0]} {'-' if cuts[0][1] is None else cuts[0][1]}"))
            if isinstance(node, ast.IfExp):
                if not self._free(node.test):
                    self.arms += [Arm(node.body, "the first arm of a conditional expression", path),
                                  Arm(node.orelse, "the `else` arm of a conditional expression", path)]
            elif isinstance(node, ast.BoolOp):
                for i, value in enumerate(node.values[1:], 1):
                    if not all(self._free(v) for v in node.values[:i]):
                        word = "and" if isinstance(node.op, ast.And) else "or"
                        self.arms.append(Arm(value, f"operand {i + 1} of an `{word}`", path))
            elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
                heads = [g.iter for g in node.generators] + [c for g in node.generators for c in g.ifs]
                if not all(self._free(h) for h in heads):
                    elt = node.value if isinstance(node, ast.DictComp) else node.elt
                    self.arms.append(Arm(elt, "the element of a comprehension", path))
            elif isinstance(node, ast.Lambda):
                self.arms.append(Arm(node.body, "the body of a lambda", path))
            stack.extend(ast.iter_child_nodes(node))


def function_nodes(tree: ast.AST) -> dict[int, list]:
    """{line: [FunctionDef]} for every function in `tree`, by its `def` line and by its first decorator's line."""
    out: dict[int, list] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for line in {node.lineno, *(d.lineno for d in node.decorator_list)}:
                out.setdefault(line, []).append(node)
    return out
