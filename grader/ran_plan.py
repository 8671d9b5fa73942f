"""What of a function of the notebook's must run while its exercise is checked (`grader.ran`'s rule), read from its
source: `Taint` (what could hold a size threshold in a cell's code), `FunctionPlan` (a function's statements and the
arms inside them, each with the optional groups it sits in), `Arm`, and the helpers `grader.ran` judges with."""
from __future__ import annotations

import ast

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
                          "startswith", "endswith", "copy", "deque"))
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


def _number(node) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _number(node.operand)
        return None if inner is None else -inner if isinstance(node.op, ast.USub) else inner
    return None


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
            out.update(id(x) for x in [node.left, *node.comparators] if _number(x) is not None)
            out.update(id(n) for x in [node.left, *node.comparators] if _number(x) is not None for n in ast.walk(x))
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
                              or isinstance(n, ast.Attribute) and n.attr == "__dict__" for n in ast.walk(tree))
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        for _ in range(4):  # to a fixed point: an attribute set from another
            before = len(self.attrs)
            for fn in functions:
                params = _params(fn)
                names = self.names(fn, params)
                local = set(params) | set(_assigned(fn))
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        scaled = (isinstance(node, ast.AugAssign) and isinstance(node.op, _SCALING)) or \
                            self.could_scale(node.value, names, local)
                        if scaled:
                            self.attrs.update(t.attr for tg in targets for t in ast.walk(tg) if isinstance(t, ast.Attribute))
            if len(self.attrs) == before:
                break

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
            number = _number(node)
            if number is not None and number not in (0, 1, -1):
                return True
            if isinstance(node, ast.BinOp) and (isinstance(node.op, _SCALING) or _leaves(node) >= 3):
                return True
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name not in _PLAIN_CALLS and not self._callers_method(f, tainted, local):
                    return True
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and (
                    self.every_attr or node.attr in self.attrs):
                return True
            if isinstance(node, ast.Name):
                if node.id in tainted:
                    return True
                if (node.id not in local and id(node) not in called and id(node) not in bases
                        and node.id not in _BUILTIN_VALUES):
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
                value = node.value if node.value is not None else ast.Constant(None)
                names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                if isinstance(node, ast.AugAssign) and isinstance(node.op, _SCALING):
                    value = ast.BinOp(left=ast.Constant(0), op=node.op, right=value)
                binds.append((names, value))
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


def _params(func) -> frozenset:
    args = func.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return frozenset(names)


def _raises(block: list) -> bool:
    """A block that only leads to an error: its last statement raises (`raise`, `assert False`)."""
    if not block:
        return False
    last = block[-1]
    return isinstance(last, ast.Raise) or (isinstance(last, ast.Assert) and isinstance(last.test, ast.Constant)
                                           and not last.test.value)


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

    __slots__ = ("node", "what", "path")

    def __init__(self, node: ast.AST, what: str, path: tuple):
        self.node, self.what, self.path = node, what, path

    def span(self) -> tuple:
        n = self.node
        return (n.lineno, n.col_offset, n.end_lineno, n.end_col_offset)


def _inside(pos, span) -> bool:
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
        self.statements: list[tuple[ast.stmt, range, tuple]] = []  # (statement, its own lines, its groups)
        self.arms: list[Arm] = []
        self.groups = 0
        self._block(node.body, ())

    def _free(self, test) -> bool:
        """Whether `test` could not hold a size threshold: either outcome may go unrun."""
        tainted = self.taint.names(self.node, self.params, test.lineno, tuple(self.loops))
        return not self.taint.could_scale(test, tainted, self.local)

    def _group(self, path: tuple) -> tuple:
        self.groups += 1
        return path + (self.groups,)

    def _block(self, block, path) -> None:
        if _raises(block):
            path = None
        for stmt in block:
            self._stmt(stmt, path)
            if path is not None and isinstance(stmt, ast.If) and not stmt.orelse and _exits(stmt.body) \
                    and self._free(stmt.test):
                path = self._group(path)  # `if x is None: return a` then `return b`: the rest is the other arm

    def _stmt(self, stmt, path) -> None:
        if isinstance(stmt, ast.Raise):
            path = None
        if path is not None and not _codeless(stmt):
            self.statements.append((stmt, _own_lines(stmt), path))
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return  # its body is its own code object: judged on its own plan (never called: its first line)
        if isinstance(stmt, ast.ClassDef):
            self._block(stmt.body, path)
            return
        if isinstance(stmt, ast.If):
            self._exprs(stmt.test, path)
            free = path is not None and self._free(stmt.test)
            self._block(stmt.body, self._group(path) if free else path)
            self._block(stmt.orelse, self._group(path) if free else path)
            return
        for field in ("test", "iter", "target", "value", "targets", "items", "subject", "exc", "msg", "context_expr"):
            part = getattr(stmt, field, None)
            for expr in part if isinstance(part, list) else [part]:
                if isinstance(expr, ast.withitem):
                    self._exprs(expr.context_expr, path)
                elif isinstance(expr, ast.AST):
                    self._exprs(expr, path)
        loop = isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
        body_path = path
        if loop:
            self.loops.append((stmt.lineno, stmt.end_lineno or stmt.lineno))
            head = stmt.test if isinstance(stmt, ast.While) else stmt.iter
            if path is not None and self._free(head):
                body_path = self._group(path)  # a loop over what the input holds may go round no time
        self._block(getattr(stmt, "body", []) or [], body_path)
        for field in ("orelse", "finalbody"):
            self._block(getattr(stmt, field, []) or [], path)
        if loop:
            self.loops.pop()
        for handler in getattr(stmt, "handlers", []) or []:
            self._block(handler.body, path)
        for case in getattr(stmt, "cases", []) or []:
            self._block(case.body, path)

    def _exprs(self, expr, path) -> None:
        """The arms inside an expression under a test that could hold a threshold: they must run whenever the
        statement holding them must."""
        if path is None:
            return
        stack = [expr]
        while stack:
            node = stack.pop()
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


def _function_nodes(tree: ast.AST) -> dict[int, list]:
    """{line: [FunctionDef]} for every function in `tree`, by its `def` line and by its first decorator's line."""
    out: dict[int, list] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for line in {node.lineno, *(d.lineno for d in node.decorator_list)}:
                out.setdefault(line, []).append(node)
    return out
