"""In the student's process: which lines of the notebook's code ran while each exercise was checked, and which of
an exercise's code never did.

Why: a check runs the notebook's code at the sizes it draws. A route that switches on only above them — a tiled
forward that materializes the N×N scores past N = 1024, a cache that falls back to `torch.cat` past 300 positions,
speculative decoding that stops calling the draft past 100 tokens, GPTQ that rounds to nearest for layers wider than
512 — passes every check and is wrong where the technique matters. Whatever sizes the checks draw, a threshold can
sit above them. So the rule is about the code, not the sizes: **the code of an exercise must run while its checks run** —
its straight-line code, the handlers of its `try`, and everything under a test that could hold a size threshold
(`Taint.could_scale`: a number other than 0 and ±1, a product, power, shift, quotient or remainder, a sum of three
or more terms, a call of the notebook's own function or of a library function that is not a plain test, reduction
or conversion, a module-level value, an attribute some code sets to such a value, or a name bound to one) — with the
arms of conditional expressions, `and`/`or` and comprehensions under such tests, and every lambda's body.

Not required: a block that ends in `raise` (bad input gets an error; the checks need not trigger each), statements
with no code, and a block under a test that could not hold a threshold (`if x is None`, `if not chunked and n < left`,
`if float(resid.sum()) <= 0`, `if q.dim() == 3`, a loop over what the input holds): such a block is an *optional
group*, which need not run — but once any of its statements ran, all of it must, so a test of the caller's choice at
the top of a function exempts nothing the checks run.

"The exercise's code" is the function or class itself (every method), the notebook's functions and classes it names
(directly, or through a module-level table of functions), and every other function or class defined in the same
cell that is not an exercise itself; lines run while another exercise was checked do not count (each exercise is
judged on its own checks, so `pytest -k` gives the same verdict as the whole run).

Lines are recorded by a trace function (`sys.settrace`) that every call into the notebook's code runs under
(`grader.child_observe.Scope`), observed or not, so no call can tell; it does work only in frames of the cells' code.
Arms inside one line (`a if c else b`, `c and f(x)`) are told apart by the instructions that ran (opcode events,
switched on only in frames whose code holds such an arm) and the positions Python records for each instruction.
"""
from __future__ import annotations

import ast
import sys

_settrace, _gettrace = sys.settrace, sys.gettrace

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


class LinesRun:
    """The records (held in the trace function's closure, out of the notebook's reach: asking for the trace function
    is a verdict) and the judgement of what did not run."""

    def __init__(self, child):
        self.child = child
        self.by_index: dict[int, str] = {}  # a cell's index -> the text compiled from it
        self._trees: dict[str, tuple] = {}
        lines: dict = {}  # (exercise, file name) -> line numbers that ran
        offsets: dict = {}  # (exercise, code) -> instruction offsets that ran (codes that hold an arm only)
        fine: dict = {}  # code -> whether its frames need opcode events (None: not the cells' code)
        cell_files, plan_of = child.cell_files, self._needs_opcodes
        frame_type = type(sys._getframe())

        def trace(frame, event, arg):
            if type(frame) is not frame_type:
                return None
            code = frame.f_code
            try:
                kind = fine[code]
            except KeyError:
                kind = fine[code] = plan_of(code) if code.co_filename in cell_files else None
            if kind is None:
                return None
            root = child.current_root
            ran = lines.get((root, code.co_filename))
            if ran is None:
                ran = lines[(root, code.co_filename)] = set()
            add = ran.add
            if not kind:
                def line(frame, event, arg):
                    if event == "line":
                        add(frame.f_lineno)
                    return line
                return line
            at = offsets.get((root, code))
            if at is None:
                at = offsets[(root, code)] = set()
            mark = at.add
            frame.f_trace_opcodes = True

            def opcode(frame, event, arg):
                if event == "opcode":
                    mark(frame.f_lasti)
                elif event == "line":
                    add(frame.f_lineno)
                    mark(frame.f_lasti)
                return opcode
            return opcode

        self.trace = trace
        self._lines = lambda root, filename: frozenset(lines.get((root, filename), ()))
        self._offsets = lambda root, code: frozenset(offsets.get((root, code), ()))

    # --- at load --------------------------------------------------------------------------------------------------
    def remember(self, cells) -> None:
        """The text each cell is compiled from (as `grader.notebook.run_cells` compiles it), kept before any of the
        notebook's code runs (linecache is the notebook's to change)."""
        for index, _grade_id, source in cells:
            self.by_index[int(index)] = "\n".join(ln for ln in str(source).splitlines()
                                                  if not ln.lstrip().startswith(("%", "!")))

    def source(self, filename: str) -> str:
        index = self.child.cell_files.get(filename)
        return self.by_index.get(index, "") if type(index) is int else ""

    def _tree(self, filename: str):
        got = self._trees.get(filename)
        if got is None:
            try:
                tree = ast.parse(self.source(filename))
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                tree = ast.Module(body=[], type_ignores=[])
            got = self._trees[filename] = (tree, _function_nodes(tree), {}, Taint(self._all_trees(tree)))
        return got

    def _all_trees(self, tree) -> ast.Module:
        """Every cell's code in one tree (an attribute may be set to a threshold in another cell)."""
        body = list(tree.body)
        for source in self.by_index.values():
            try:
                body += ast.parse(source).body
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
        return ast.Module(body=body, type_ignores=[])

    def _needs_opcodes(self, code) -> bool:
        """Whether frames of `code` need opcode events: it holds an arm (its own instructions, not a nested code's)."""
        plan = self._plan_of(code)
        if plan is None:
            return False
        spans = [arm.span() for arm in plan.arms]
        if not spans:
            return False
        return any(_inside(pos, span) for pos in code.co_positions() for span in spans)

    def _plan_of(self, code) -> FunctionPlan | None:
        """The plan of the function whose body holds `code` (itself, or the function a comprehension or lambda of
        it belongs to)."""
        tree, by_line, plans, taint = self._tree(code.co_filename)
        nodes = by_line.get(code.co_firstlineno, [])
        if not nodes:  # a comprehension, lambda or class body: the innermost function around its first line
            around = [n for ns in by_line.values() for n in ns
                      if n.lineno <= code.co_firstlineno <= (n.end_lineno or n.lineno)]
            nodes = sorted(around, key=lambda n: n.lineno)[-1:]
        if not nodes:
            return None
        node = nodes[0]
        if id(node) not in plans:
            plans[id(node)] = FunctionPlan(node, code.co_filename, method=self._is_method(tree, node), taint=taint)
        return plans[id(node)]

    @staticmethod
    def _is_method(tree, node) -> bool:
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and node in cls.body:
                return not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
        return False

    # --- the judgement ---------------------------------------------------------------------------------------------
    def code_of(self, name: str, exercises) -> list:
        """The code objects of exercise `name` (module docstring): its own, the notebook's functions and classes it
        names or reaches through a module-level table, and the rest of its cell that is no exercise."""
        module = self.child.module
        if module is None:
            return []
        cells = self.child.cell_files
        compiled = getattr(getattr(self.child, "guard", None), "compiled", set())
        files = _Either(cells, compiled)
        space = vars(module)
        others = set(exercises) - {name}

        def codes_of(obj) -> list:
            obj = getattr(obj, "__wrapped__", obj)
            if isinstance(obj, type):  # its methods (a class it holds, autograd's `_backward_cls` say: not)
                out = []
                for member in vars(obj).values():
                    if isinstance(member, property):
                        out += [f for f in (member.fget, member.fset, member.fdel) if f is not None]
                    elif not isinstance(member, type):
                        out.append(getattr(member, "__func__", member))
                return [c for m in out if not isinstance(m, type) for c in codes_of(m)]
            code = getattr(obj, "__code__", None)
            return [code] if code is not None and code.co_filename in files else []

        def nested(code) -> list:
            out = [code]
            for const in code.co_consts:
                if hasattr(const, "co_code"):
                    out += nested(const)
            return out

        start = space.get(name)
        if start is None:
            return []
        seen_objs, todo, codes = set(), [start], []
        own_files = set()
        first = codes_of(start)
        own_files.update(c.co_filename for c in first)
        theirs = set()  # what the other exercises name: their helpers, not this one's
        for other in others:
            for code in codes_of(space.get(other)):
                for inner in nested(code):
                    theirs.update(inner.co_names)
        for key, value in space.items():  # the rest of its cell
            if key in others or key == name or key.startswith("__") or key in theirs:
                continue
            if any(c.co_filename in own_files for c in codes_of(value)) and _defined_here(value, key):
                todo.append(value)
        while todo:
            obj = todo.pop()
            if id(obj) in seen_objs:
                continue
            seen_objs.add(id(obj))
            for code in codes_of(obj):
                for inner in nested(code):
                    codes.append(inner)
                    for ref in inner.co_names:
                        if ref in others or ref not in space:
                            continue
                        value = space[ref]
                        if isinstance(value, dict):
                            todo += [v for v in value.values() if codes_of(v)]
                        elif isinstance(value, (list, tuple)):
                            todo += [v for v in value if codes_of(v)]
                        elif codes_of(value):
                            todo.append(value)
        unique, seen = [], set()
        for code in codes:
            if id(code) not in seen:
                seen.add(id(code))
                unique.append(code)
        return unique

    def unreached(self, root: str, exercises) -> str | None:
        """Why exercise `root` has code that never ran while it was checked, or None."""
        found = []  # (file, line, statement or Arm)
        plans: dict[int, tuple] = {}  # id(plan) -> (plan, [its code objects])
        for code in self.code_of(root, exercises):
            plan = self._plan_of(code)
            if plan is not None:
                plans.setdefault(id(plan), (plan, []))[1].append(code)
        for code in self.code_of(root, exercises):
            if code.co_filename not in self.child.cell_files:  # compiled while the notebook ran (`exec`)
                found.append((code.co_filename, code.co_firstlineno, _Compiled(code)))
        for plan, codes in plans.values():
            filename = codes[0].co_filename
            ran = self._lines(root, filename)
            done = [any(line in ran for line in own) for _, own, _ in plan.statements]
            entered = set()  # optional groups of which a statement ran
            for (_, _, path), did in zip(plan.statements, done):
                if did:
                    entered.update(path)
            missed = set()
            for (stmt, _, path), did in zip(plan.statements, done):
                if not did and all(g in entered for g in path):
                    found.append((filename, stmt.lineno, stmt))
                    missed.add(stmt.lineno)
            offsets = {code: self._offsets(root, code) for code in codes}
            for arm in plan.arms:
                if arm.node.lineno in missed or not all(g in entered for g in arm.path):
                    continue
                span = arm.span()
                mine = [(code, i * 2) for code in codes for i, pos in enumerate(code.co_positions())
                        if _inside(pos, span)]
                if not mine or any(off in offsets[code] for code, off in mine):
                    continue  # it ran (or has no instruction of its own: folded away)
                if not any(line in ran for line in range(arm.node.lineno, (arm.node.end_lineno or 0) + 1)):
                    continue  # the statement holding it did not run: reported (or exempt) as a statement
                found.append((filename, arm.node.lineno, arm))
        if not found:
            return None
        found.sort(key=lambda f: (f[0], f[1]))
        shown = []
        for filename, line, what in found[:3]:
            lines = self.source(filename).splitlines()
            text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            text = text if len(text) <= 70 else text[:67] + "..."
            where = f"{_cell(filename)} line {line}"
            if isinstance(what, _Compiled):
                shown.append(f"`{what.code.co_name}`, compiled from text while the notebook ran ({filename!r}): "
                             f"which of its lines run cannot be told, write it in the cell")
            elif isinstance(what, Arm):
                shown.append(f"{what.what} on {where} (`{text}`)")
            else:
                shown.append(f"{where} (`{text}`)")
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        return (f"has code that never ran while its checks ran: {'; '.join(shown)}{more}. A route the checks never "
                f"run cannot be graded, and one that switches on only above the sizes they draw is how wrong work "
                f"passes: remove code the checks do not reach (a branch for other sizes, an unused helper), or make a "
                f"branch that cannot happen raise. Lines that only raise, and branches on what the caller passes or "
                f"on a zero or empty value (`x is None`, `isinstance`, the device, `n == 0`), may go unrun")


class _Either:
    """`x in _Either(a, b)`: in either collection."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __contains__(self, x) -> bool:
        return x in self.a or x in self.b


class _Compiled:
    def __init__(self, code):
        self.code = code


def _defined_here(value, key: str) -> bool:
    """A function or class the cell defined under this name (not one it imported or aliased)."""
    return getattr(getattr(value, "__wrapped__", value), "__name__", None) == key


def _cell(filename: str) -> str:
    # "week17_flash.ipynb[cell 12]" -> "cell 12"
    if "[" in filename and "]" in filename:
        return filename[filename.index("[") + 1:filename.index("]")]
    return filename
