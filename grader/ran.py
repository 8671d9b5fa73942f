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

"The exercise's code" is the function or class itself (every method), and the notebook's functions and classes it
names (directly, or through a module-level table of functions); lines run while another exercise was checked do not count (each exercise is
judged on its own checks, so `pytest -k` gives the same verdict as the whole run).

Switches (`grader.ran_switch.Switch`): a comparison by order, a `min`/`max`, `sorted((a, b))`, `bool(x)`, a table's key,
a quotient or a slice by a size of the code's own must come out more than one way while the checks run — a switch
needs no branch (`* (j < 512)`, `max(block, n - 1024)`, `_FAR[j // 512]`, `n // 8192`, `p[:64]`). `compile_cell` puts a probe around each, and the trace function records what each saw.

Lines are recorded by a trace function (`sys.settrace`) that every call into the notebook's code runs under
(`grader.child_observe.Scope`), observed or not, so no call can tell; it does work only in frames of the cells' code.
Arms inside one line (`a if c else b`, `c and f(x)`) are told apart by the instructions that ran (opcode events,
switched on only in frames whose code holds such an arm) and the positions Python records for each instruction.
"""
from __future__ import annotations

import ast
import secrets
import sys

import numpy as _numpy

import grader.ran_plan as _plan_module
import grader.ran_switch as _switch_module
from grader.ran_plan import Arm, FunctionPlan, Taint, function_nodes, inside
from grader.fingerprint import compiled_twice
from grader.ran_switch import OTHER, Probes, Switch, module_tables, pick_aliases, quotient_seen, slice_seen


class LinesRun:
    """The records (held in the trace function's closure, out of the notebook's reach: asking for the trace function
    is a verdict) and the judgement of what did not run."""

    def __init__(self, child):
        self.child = child
        self.by_index: dict[int, str] = {}  # a cell's index -> the text compiled from it
        self._trees: dict[str, tuple] = {}
        lines: dict = {}  # (exercise, file name) -> line numbers that ran
        counted: dict = {}  # exercise -> [how many lines of the cells' code it ran, in all]
        offsets: dict = {}  # (exercise, code) -> instruction offsets that ran (codes that hold an arm only)
        fine: dict = {}  # code -> whether its frames need opcode events (None: not the cells' code)
        cell_files, plan_of = child.cell_files, self._needs_opcodes
        frame_type = type(sys._getframe())
        probes: dict = {}  # id(code) -> (key, kind, code): the probes `compile_cell` put around comparisons and min/max
        outcomes: dict = {}  # (exercise, key) -> what the probe saw: True/False, the argument min/max took, or OTHER
        token = secrets.token_hex(4)  # in the probes' parameter names: the notebook's source cannot know it
        table: list = []  # key -> (file name, span, kind)

        def probed(frame, key, kind):
            seen = outcomes.get((child.current_root, key))
            if seen is None:
                seen = outcomes[(child.current_root, key)] = set()
            names = frame.f_code.co_varnames
            if kind == "key":
                value = frame.f_locals.get(names[0])
                seen.add(value if type(value) in (int, str, bool, float) else OTHER)
                return None
            if kind in ("//", ">>", "%"):
                seen.add(quotient_seen(kind, frame.f_locals.get(names[0]), frame.f_locals.get(names[1])))
                return None
            if kind.startswith("slice"):
                seen.add(slice_seen(kind, frame.f_locals.get(names[0]), frame.f_locals.get(names[1])))
                return None
            if kind == "compare":
                value = frame.f_locals.get(names[0])
                kind_of = type(value)
                seen.add(value if kind_of is bool else bool(value) if kind_of.__module__ == "numpy" and kind_of.__name__
                         in ("bool", "bool_") else OTHER)
                return None

            def picked(frame, event, arg):
                if event == "return" and kind == "order":
                    here = frame.f_locals
                    fn, args = here.get(names[0]), here.get(names[1], ())
                    items = args[0] if len(args) == 1 and type(args[0]) in (tuple, list) else None
                    if fn is not sorted or items is None or type(arg) is not list or len(arg) != len(items):
                        seen.add(OTHER)
                    else:  # where each item went, by identity
                        seen.add(tuple(next((i for i, a in enumerate(items) if a is r), -1) for r in arg))
                elif event == "return":
                    here = frame.f_locals
                    fn, args, kwargs = here.get(names[0]), here.get(names[1], ()), here.get(names[2])
                    if kwargs or len(args) < 2 or not (fn is min or fn is max or (any(fn is f for f in _NUMPY_PICKS) and all(
                            type(a) in (int, float) or (isinstance(a, _numpy.generic) and type(a).__module__ == "numpy")
                            for a in (*args, arg)))):
                        seen.add(OTHER)
                    elif fn is min or fn is max:  # by identity: they return one of their arguments, whatever its type
                        seen.update(i for i, a in enumerate(args) if a is arg)
                    else:  # numpy's on scalars make a new scalar: the arguments equal to it
                        seen.update(i for i, a in enumerate(args) if bool(a == arg))
                return picked
            return picked

        def register(code) -> None:
            """The probes inside `code` (a cell's compiled code), found by the token in their parameter's name."""
            for const in code.co_consts:
                if hasattr(const, "co_code"):
                    name = const.co_varnames[0] if const.co_varnames else ""
                    if const.co_name == "<lambda>" and name.startswith(f"__ran{token}_") and name.endswith("__"):
                        key = int(name[len(f"__ran{token}_"):-2])
                        if key < len(table):
                            probes[id(const)] = (key, table[key][2], const)
                            continue
                    register(const)

        def trace(frame, event, arg):
            if type(frame) is not frame_type:
                return None
            code = frame.f_code
            probe = probes.get(id(code))
            if probe is not None and probe[2] is code:
                return probed(frame, probe[0], probe[1])
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
            tally = counted.get(root)
            if tally is None:
                tally = counted[root] = [0]
            if not kind:
                def line(frame, event, arg):
                    if event == "line":
                        add(frame.f_lineno)
                        tally[0] += 1
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
                    tally[0] += 1
                    mark(frame.f_lasti)
                return opcode
            return opcode

        self.trace = trace
        self._probe_table, self._register, self._token, self._tables = table, register, token, None
        self._aliases: dict | None = None
        self._outcomes = lambda root, key: frozenset(outcomes.get((root, key), ()))
        self.python_lines = lambda root: int(counted.get(root, [0])[0])  # lines of the cells run for `root`
        self._lines = lambda root, filename: frozenset(lines.get((root, filename), ()))
        self._offsets = lambda root, code: frozenset(offsets.get((root, code), ()))

    # --- at load --------------------------------------------------------------------------------------------------
    def remember(self, cells) -> None:
        """The text each cell is compiled from (as `grader.notebook.run_cells` compiles it), kept before any of the
        notebook's code runs (linecache is the notebook's to change)."""
        for index, _grade_id, source in cells:
            self.by_index[int(index)] = "\n".join(ln for ln in str(source).splitlines()
                                                  if not ln.lstrip().startswith(("%", "!")))

    def compile_cell(self, text: str, filename: str):
        """A cell's code as `compile` makes it, with each comparison (but `is`) and each call of `min`/`max` of two or
        more arguments put through a probe — `(lambda p: p)(a < b)`, `(lambda f, *a, **k: f(*a, **k))(min, a, b)` —
        whose frames the trace function reads (what the comparison gave, which argument was taken) for
        `unreached`'s switches. The probes are the same for every call, observed or not; their parameter names hold a
        token drawn for this process."""
        tree = ast.parse(text, filename)
        if self._tables is None:  # the tables every cell binds (cells are remembered before any is compiled)
            cells = self._parsed_cells()
            self._tables = set().union(*(module_tables(t) for t in cells))
            self._aliases = {k: v for t in cells for k, v in pick_aliases(t).items()}  # `pick = max`: maxima too
        tree = Probes(self._token, self._probe_table, filename, self._tables, self._aliases).visit(tree)
        code = compile(ast.fix_missing_locations(tree), filename, "exec")
        self._register(code)
        compiled_twice(code, compile(text, filename, "exec"))  # lib's code pasted in a cell is still lib's
        return code

    def _parsed_cells(self) -> list:
        out = []
        for source in self.by_index.values():
            try:
                out.append(ast.parse(source))
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
        return out

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
            got = self._trees[filename] = (tree, function_nodes(tree), {}, Taint(self._all_trees(tree)))
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
        return any(inside(pos, span) for pos in code.co_positions() for span in spans)

    def _plan_of(self, code) -> FunctionPlan | None:
        """The plan of the function whose body holds `code` (itself, or the function a comprehension or lambda of
        it belongs to)."""
        tree, by_line, plans, taint = self._tree(code.co_filename)
        nodes = by_line.get(code.co_firstlineno, [])
        if not nodes:  # a comprehension, lambda or class body: the innermost function around its first line
            around = [n for ns in by_line.values() for n in ns
                      if n.lineno <= code.co_firstlineno <= (n.end_lineno or n.lineno)]
            nodes = sorted(around, key=lambda n: n.lineno)[-1:]
        if not nodes:  # a lambda outside every function (`_tile = lambda n, b: ...` in a cell): judged as a function
            nodes = [_as_function(n) for n in _outer_lambdas(tree) if n.lineno == code.co_firstlineno][:1]
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
        names or reaches through a module-level table (defaults, closures, `__wrapped__`, bases included)."""
        module = self.child.module
        if module is None:
            return []
        cells = self.child.cell_files
        compiled = getattr(getattr(self.child, "guard", None), "compiled", set())
        files = _Either(cells, compiled)
        space = vars(module)
        others = set(exercises) - {name}

        def codes_of(obj, seen=None) -> list:
            """The code of `obj` defined in the cells, and of what hangs from it: a function's `__wrapped__` (as well
            as, never instead of, the function: a student sets it to anything), defaults and closure; a class's
            methods and properties, its bases' in the cells too (a base made with `type(...)` included)."""
            seen = set() if seen is None else seen
            if id(obj) in seen:
                return []
            seen.add(id(obj))
            out = []
            if isinstance(obj, type):
                for klass in type.__dict__["__mro__"].__get__(obj):
                    if klass is object:
                        continue
                    for member in type.__dict__["__dict__"].__get__(klass).values():
                        if isinstance(member, property):
                            out += [c for f in (member.fget, member.fset, member.fdel) if f is not None
                                    for c in codes_of(f, seen)]
                        elif isinstance(member, (staticmethod, classmethod)):
                            out += codes_of(member.__func__, seen)
                        elif isinstance(member, _FUNCTION):
                            out += codes_of(member, seen)
                return out
            if not isinstance(obj, _FUNCTION):
                return out
            code = obj.__code__
            if code.co_filename in files:
                out.append(code)
            hanging = [vars(obj).get("__wrapped__"), *(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()]
            for cell in obj.__closure__ or ():
                try:
                    hanging.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
            for value in hanging:
                items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
                for item in items:
                    if isinstance(item, (type, _FUNCTION)):
                        out += codes_of(item, seen)
            return out

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
        found = []  # (file, line, statement, Arm or _Flat)
        plans: dict[int, tuple] = {}  # id(plan) -> (plan, [its code objects])
        keys: dict = {}  # (file name, span, kind) -> the probes' keys (a cell compiled twice has two)
        for key, where in enumerate(self._probe_table):
            keys.setdefault(where, []).append(key)
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
            if getattr(plan.node, "name", None) in plan.taint.decorators:  # a decorator runs as the cells load
                ran = ran | self._lines(None, filename)
            done = [any(line in ran for line in own) for _, own, _ in plan.statements]
            if getattr(plan.node, "name", None) in _DISPLAY and not any(done):
                continue  # a `__repr__` nothing called: it shows the object, it computes nothing graded
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
                        if inside(pos, span)]
                if not mine or any(off in offsets[code] for code, off in mine):
                    continue  # it ran (or has no instruction of its own: folded away)
                if arm.held and not any(line in ran for line in range(arm.node.lineno, (arm.node.end_lineno or 0) + 1)):
                    continue  # the statement holding it did not run: reported (or exempt) as a statement
                found.append((filename, arm.node.lineno, arm))
            for switch in plan.switches:
                if switch.node.lineno in missed or not all(g in entered for g in switch.path):
                    continue
                seen = set()
                for key in keys.get((filename, switch.span(), switch.kind), ()):
                    seen |= self._outcomes(root, key)
                if switch.kind in ("pick", "order") and OTHER in seen:
                    continue  # a key, or not the builtin min/max
                seen.discard(OTHER)  # a comparison that gave a tensor at times: its plain outcomes are still judged
                if not seen:
                    continue  # never evaluated (a short-circuit, an optional group), or never a plain bool (a mask)
                if switch.kind == "order" and len(seen) == 1:
                    found.append((filename, switch.node.lineno, _Flat(
                        f"`{ast.unparse(switch.node)}` put its items in the same order every time")))
                elif switch.kind == "key" and len(seen) == 1:
                    found.append((filename, switch.node.lineno, _Flat(
                        f"the table was looked up by `{ast.unparse(switch.node)}` = {next(iter(seen))!r} every time")))
                elif switch.kind == "compare" and len(seen) == 1:
                    found.append((filename, switch.node.lineno, _Flat(f"the comparison `{ast.unparse(switch.node)}` "
                                                                      f"was {next(iter(seen))} every time")))
                elif switch.kind in ("//", ">>") and seen == {0}:
                    found.append((filename, switch.node.lineno, _Flat(f"`{ast.unparse(switch.node)}` was 0 every time")))
                elif switch.kind == "%" and seen == {"same"}:
                    found.append((filename, switch.node.lineno, _Flat(
                        f"`{ast.unparse(switch.node)}` never wrapped (it was its left operand every time)")))
                elif switch.kind.startswith("slice") and "part" not in seen:
                    took = " or ".join(sorted({"whole": "all", "none": "none"}[w] for w in seen))
                    found.append((filename, switch.node.lineno, _Flat(
                        f"the slice `{ast.unparse(switch.node)}` took {took} of its sequence every time, never a part")))
                elif switch.kind == "pick" and len(seen) < len(switch.node.args):
                    taken = ", ".join(str(i + 1) for i in sorted(seen))
                    found.append((filename, switch.node.lineno, _Flat(
                        f"`{ast.unparse(switch.node)}` took only argument {taken} of {len(switch.node.args)}")))
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
            elif isinstance(what, _Flat):
                shown.append(f"{what.what} on {where}")
            else:
                shown.append(f"{where} (`{text}`)")
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        return (f"has code that never ran while its checks ran: {'; '.join(shown)}{more}. A route the checks never "
                f"run cannot be graded, and one that switches on only above the sizes they draw (a branch, a "
                f"comparison that always came out the same, a `min`/`max` that always took the same argument) is how "
                f"wrong work passes: remove code the checks do not reach (a branch for other sizes, an unused helper, "
                f"a bound that never binds), or make a branch that cannot happen raise. Lines that only raise, and branches on what the caller passes or "
                f"on a zero or empty value (`x is None`, `isinstance`, the dtype, `n == 0`), may go unrun")


_NUMPY_PICKS = (_numpy.maximum, _numpy.minimum, _numpy.fmax, _numpy.fmin)


def _outer_lambdas(tree) -> list:
    """The lambdas of `tree` in no function (a cell's or a class body's)."""
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and id(n) not in inner]


_MADE: dict = {}  # id(lambda node) -> the function made of it (one per node: plans are kept by the node's id)


def _as_function(lam: ast.Lambda) -> ast.FunctionDef:
    made = _MADE.get(id(lam))
    if made is None or made[0] is not lam:
        body = ast.copy_location(ast.Return(value=lam.body), lam.body)
        fn = ast.copy_location(ast.FunctionDef(name="<lambda>", args=lam.args, body=[body], decorator_list=[],
                                               returns=None, type_comment=None), lam)
        made = _MADE[id(lam)] = (lam, fn)
    return made[1]


class _Either:
    """`x in _Either(a, b)`: in either collection."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __contains__(self, x) -> bool:
        return x in self.a or x in self.b


class _Flat:
    """A switch (`grader.ran_switch.Switch`) that went one way only, said in words."""

    def __init__(self, what: str):
        self.what = what


class _Compiled:
    def __init__(self, code):
        self.code = code


_FUNCTION = type(lambda: None)
_DISPLAY = frozenset(("__repr__", "__str__", "__format__", "_repr_html_", "_repr_pretty_", "__rich_repr__"))


def _defined_here(value, key: str) -> bool:
    """A function or class the cell defined under this name (not one it imported or aliased)."""
    return isinstance(value, (type, _FUNCTION)) and getattr(value, "__name__", None) == key


def _cell(filename: str) -> str:
    # "week17_flash.ipynb[cell 12]" -> "cell 12"
    if "[" in filename and "]" in filename:
        return filename[filename.index("[") + 1:filename.index("]")]
    return filename


# the grader's code here that the child's guard compares by identity, besides this module (`grader.child_identity.grader_code`)
PLAN = (LinesRun, _plan_module, _switch_module, Taint, FunctionPlan, Arm, Switch)
