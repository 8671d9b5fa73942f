"""Code copied from the answer key, found in the notebook's source: lib's functions and the instructor's solution (and,
in week 20, gguf-py's quantizers and writer, the oracle its checks compare bytes with: `grader.copies`).

What it guards: **a renamed, reworded or padded copy of the reference is not the student's work.** The bytecode
fingerprints (`grader.fingerprint`) recognise lib's code exactly, in the student's process; this module reads
the submitted source in the trusted process, where nothing the student runs can interfere, and measures how
much of a reference's code the submission contains, in a form that renaming, reordering, swapped operands,
reworded comments and docstrings, changed constants and added statements do not change.

Normalised form (`_Normalise`): the code's own names become `_` — locals, parameters, the functions and classes
the same file or notebook defines, the attributes a class or function sets (`self.k = ...`) and the methods it
defines —, numbers and strings placeholders; commutative operands are sorted (`b * a` is `a * b`), `a > b` is
`b < a`, `x += y` is `x = x + y`, keywords are sorted, `torch.matmul(a, b)` is `a @ b`; docstrings, `pass`,
annotations, decorators and signatures are dropped. torch's names and the attributes of other objects stay.

Two measures of how much a submission S and a reference R share, each on that form:
- **tokens**, as MOSS and JPlag do: token sequences of `K` tokens are hashed and winnowed (of every `WINDOW`
  consecutive hashes the smallest is kept: any run of `K + WINDOW - 1` tokens the two share is seen). The token share
  is the larger of the share of R's fingerprints found among S's k-grams (padding S does not dilute it) and the share
  of S's fingerprints found among R's (leaving out R's options and checks does not dilute it). Robust to edits inside
  statements.
- **statements**: each statement (a compound one by its header) hashed; the share of R's statements S has too.
Idiom (what many functions of lib and of the solutions share) is no evidence: taken out of both sides (`common`).

The units compared: every function and method alone; every class as a whole (all its methods: methods of a few lines
are judged together); every function or class with the functions of the same file or notebook it calls by name,
however deep, or reaches through a module-level table or a name in a string (`_OPS = {"t": _tile}`,
`globals()["_tile"]`) (a copy split across helpers; another exercise's graded function is not counted in). The code
the release itself gives (outside `### BEGIN/END SOLUTION`) is taken out of both sides. A unit with
`TOKEN_THRESHOLD` of the tokens of a reference unit (the side the share is of having at least `MIN_FINGERPRINTS`
fingerprints), or `THRESHOLD` of the statements of one of at least `MIN_STATEMENTS`, is a copy (`ratio` >= 1):
`reference_use`, and the exercise scores 0 like any use of lib's implementation. Smaller references (a two-line
mask) are not judged: independent solutions of a few lines coincide. Thresholds sized on honest variants written
from the release notebooks alone and on reworded copies (tests/fixtures/, tests/test_similarity.py; grader/README.md,
"Reference use"); the token threshold raised for references honest variants came near (`grader.copy_thresholds`)."""
from __future__ import annotations

import ast
import hashlib
import re
import sys
from collections import Counter
from grader.copy_thresholds import statement_threshold, token_threshold

THRESHOLD = 0.8  # statements
MIN_STATEMENTS = 12
TOKEN_THRESHOLD = 0.6  # winnowed token k-grams
MIN_FINGERPRINTS = 60
K = 9
WINDOW = 4
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_COMMUTATIVE = (ast.Add, ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor)
_FLIPPED = {ast.Gt: ast.Lt, ast.GtE: ast.LtE}
_BODIES = ("body", "orelse", "finalbody", "handlers")
_DATA = ("names", "fp_len", "st_len", "fp_min", "fp_index", "kg_index", "st_index")  # `References.data`


class _Normalise(ast.NodeTransformer):
    """The normalised form (module docstring). `own`: names that become `_`; `attrs`: attribute names that do."""

    def __init__(self, own: set[str], attrs: set[str], checks: bool = True):
        self.own, self.attrs, self.checks = own, attrs, checks

    def visit_Name(self, node):
        return ast.Name(id="_" if node.id in self.own else node.id, ctx=ast.Load())

    def visit_Attribute(self, node):
        return ast.Attribute(value=self.visit(node.value), attr="_" if node.attr in self.attrs else node.attr,
                             ctx=ast.Load())

    def visit_arg(self, node):
        return ast.arg(arg="_", annotation=None)

    def visit_Constant(self, node):
        if isinstance(node.value, (bool, type(None))) or node.value is Ellipsis:
            return ast.Constant(value=node.value)
        return ast.Constant(value="<str>" if isinstance(node.value, (str, bytes)) else 0)

    def visit_JoinedStr(self, node):
        return ast.Constant(value="<str>")

    def visit_Expr(self, node):
        return None if isinstance(node.value, ast.Constant) else self.generic_visit(node)  # docstrings

    def visit_Pass(self, node):
        return None

    def visit_If(self, node):  # without `checks` (a reference's): an argument check is what a copy drops first
        if not self.checks and not node.orelse and node.body and isinstance(node.body[-1], ast.Raise):
            return None
        return self.generic_visit(node)

    def visit_FunctionDef(self, node):
        node = self.generic_visit(node)
        node.name, node.decorator_list, node.returns = "_", [], None
        node.args = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                                  defaults=[])
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node = self.generic_visit(node)
        node.name, node.decorator_list = "_", []
        return node

    def visit_AnnAssign(self, node):
        if node.value is None:
            return None
        return ast.Assign(targets=[self.visit(node.target)], value=self.visit(node.value))

    def visit_AugAssign(self, node):
        target = self.visit(node.target)
        return ast.Assign(targets=[target], value=_canonical(ast.BinOp(left=target, op=node.op,
                                                                         right=self.visit(node.value))))

    def visit_BinOp(self, node):
        if not isinstance(node.op, _COMMUTATIVE):
            return self.generic_visit(node)
        terms, todo = [], [node]  # a chain of one commutative operator, flattened without recursion into it
        while todo:
            n = todo.pop()
            if isinstance(n, ast.BinOp) and type(n.op) is type(node.op):
                todo += [n.left, n.right]
            else:
                terms.append(self.visit(n))
        return _canonical(ast.BinOp(left=terms[0], op=node.op, right=terms[1]) if len(terms) == 2 else
                          _chain(terms, node.op))

    def visit_Compare(self, node):
        node = self.generic_visit(node)
        if len(node.ops) == 1:
            op, right = node.ops[0], node.comparators[0]
            if type(op) in _FLIPPED:
                return ast.Compare(left=right, ops=[_FLIPPED[type(op)]()], comparators=[node.left])
            if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
                left, right = sorted((node.left, right), key=ast.dump)
                return ast.Compare(left=left, ops=[op], comparators=[right])
        return node

    def visit_Call(self, node):
        node = self.generic_visit(node)
        node.keywords.sort(key=lambda k: (k.arg or "", ast.dump(k.value)))
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "matmul" and not node.keywords:
            if isinstance(f.value, ast.Name) and f.value.id == "torch" and len(node.args) == 2:
                return ast.BinOp(left=node.args[0], op=ast.MatMult(), right=node.args[1])
            if len(node.args) == 1:
                return ast.BinOp(left=f.value, op=ast.MatMult(), right=node.args[0])
        return node


def _chain(terms: list, op) -> ast.AST:
    out = terms[0]
    for term in terms[1:]:
        out = ast.BinOp(left=out, op=type(op)(), right=term)
    return out


def _canonical(node: ast.BinOp) -> ast.AST:
    """A chain of one commutative operator with its operands sorted: `c + a + b` is `a + b + c`."""
    if not isinstance(node.op, _COMMUTATIVE):
        return node
    terms, todo = [], [node]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.BinOp) and type(n.op) is type(node.op):
            todo += [n.left, n.right]
        else:
            terms.append(n)
    terms.sort(key=ast.dump)  # each term dumped once: linear in the chain's length
    return _chain(terms, node.op)


def _fill_empty(tree: ast.AST) -> ast.AST:
    """A body the normalisation emptied (a docstring and `pass` only) gets a `pass`, so the tree still prints."""
    for node in ast.walk(tree):
        for field in ("body", "finalbody"):
            if isinstance(getattr(node, field, None), list) and not getattr(node, field) and (
                    field == "body" or getattr(node, "handlers", None) == []):
                setattr(node, field, [ast.Pass()] if field == "body" else [])
    return tree


def _locals(fn: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, (*_DEFS, ast.ClassDef)) and n is not fn:
            names.add(n.name)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


def _own_attributes(node: ast.AST) -> set[str]:
    """Attribute names `node` sets (`self.k = ...`, `self.n += 1`, `del self.x`) and the methods its classes define."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.attr)
        elif isinstance(n, ast.ClassDef):
            out.update(m.name for m in n.body if isinstance(m, _DEFS))
    return out


def _statements(stmts: list[ast.stmt], out: list[str]) -> None:
    """The hashes of the (normalised) statements, a compound statement counted by its header."""
    for s in stmts:
        if isinstance(s, ast.Pass):
            continue
        head = type(s)(**{f: ([] if f in _BODIES or f == "cases" else getattr(s, f, None)) for f in s._fields})
        if isinstance(s, (*_DEFS, ast.ClassDef)):
            head = ast.Name(id=f"<{type(s).__name__}>", ctx=ast.Load())
        out.append(hashlib.sha1(ast.dump(head).encode()).hexdigest()[:16])
        for f in _BODIES:
            for item in getattr(s, f, None) or []:
                if isinstance(item, ast.ExceptHandler):
                    _statements([ast.Expr(value=item.type or ast.Constant(value=None))], out)
                    _statements(item.body, out)
            body = getattr(s, f, None)
            if isinstance(body, list) and body and not isinstance(body[0], ast.ExceptHandler):
                _statements(body, out)
        for case in getattr(s, "cases", []) or []:
            _statements(case.body, out)


_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\*\*=?|//=?|->|:=|<<=?|>>=?|[=!<>]=|"
                    r"[-+*/%@&|^]=|\S")


def _tokens(tree: ast.AST) -> list[str]:
    """The tokens of the tree as `ast.unparse` prints it (one statement a line; `{` and `}` where the indentation
    goes in and out), read with a pattern bound at import: nothing in the student's process changes how."""
    out, depth = [], 0
    for line in ast.unparse(tree).split("\n"):
        if line.strip():
            level = (len(line) - len(line.lstrip(" "))) // 4
            out += ["{"] * (level - depth) + ["}"] * (depth - level)
            depth = level
            out += _TOKEN.findall(line)
    return out


def _kgrams(tokens: list[str]) -> list[int]:
    return [int.from_bytes(hashlib.blake2b("\x1f".join(tokens[i:i + K]).encode(), digest_size=6).digest(), "big")
            for i in range(len(tokens) - K + 1)]


def _winnow(hashes: list[int]) -> set[int]:
    """Of every WINDOW consecutive hashes the smallest (the rightmost of equals): MOSS's fingerprints."""
    if len(hashes) <= WINDOW:
        return {min(hashes)} if hashes else set()
    out = set()
    for i in range(len(hashes) - WINDOW + 1):
        window = hashes[i:i + WINDOW]
        out.add(min(window))
    return out


class Unit:
    """Normalised code: `kg` every k-gram hash, `fp` the winnowed ones, `st` the statement multiset."""

    __slots__ = ("kg", "fp", "st")

    def __init__(self, kg=frozenset(), fp=frozenset(), st=None):
        self.kg, self.fp, self.st = frozenset(kg), frozenset(fp), st if st is not None else Counter()

    def __add__(self, other: Unit) -> Unit:
        return Unit(self.kg | other.kg, self.fp | other.fp, self.st + other.st)


def _unit(node: ast.AST, own: set[str], attrs: set[str], checks: bool = True) -> Unit:
    """The unit of a function, normalised in place (a second parse's node: see `Source`), its checks kept or not."""
    tree = ast.fix_missing_locations(_fill_empty(_Normalise(own, attrs, checks).visit(node)))
    statements: list[str] = []
    _statements(tree.body, statements)
    hashes = _kgrams(_tokens(tree))
    return Unit(hashes, _winnow(hashes), Counter(statements))


def without_magics(source: str) -> str:
    """The cell's code as the grader runs it (`grader.notebook.run_cells`): IPython magics and shell escapes dropped."""
    return "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))


def definitions(tree: ast.AST, prefix: str = "", classes: bool = False) -> dict[str, ast.AST]:
    """qualname (as Python spells `co_qualname`) -> node, for every function and method in `tree` (and class, with
    `classes`), however deep: in a class, in another function (`outer.<locals>.inner`), under `if`, `try`, `with`."""
    found = {}

    def visit(node, qual):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _DEFS):
                found.setdefault(f"{qual}{child.name}", child)
                visit(child, f"{qual}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                if classes:
                    found.setdefault(f"{qual}{child.name}", child)
                visit(child, f"{qual}{child.name}.")
            else:
                visit(child, qual)

    visit(tree, prefix)
    return found


class Source:
    """A file's or a notebook's code as units: `units[qualname]` for each function, method and class (a class's unit
    is its methods together), `calls[qualname]` the names of the source's functions and classes it uses,
    `members[qualname]` a class's methods, `where[qualname]` the key of the text it is in."""

    def __init__(self, texts: list[tuple[object, str]], prefix: str = "", checks: bool = True):
        # ast.parse accepts deeper nesting than the default recursion limit walks (`x + x + ... + x`, 1000 terms)
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 50_000))
        try:
            self._read(texts, prefix, checks)
        finally:
            sys.setrecursionlimit(limit)

    def _read(self, texts: list[tuple[object, str]], prefix: str, checks: bool) -> None:
        trees = []
        for key, text in texts:
            try:  # parsed twice: one tree to read, one that the normalisation rewrites
                trees.append((key, ast.parse(without_magics(text)), ast.parse(without_magics(text))))
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
        found = [(key, definitions(tree, classes=True), definitions(copy, classes=True), _roots(tree))
                 for key, tree, copy in trees]
        names = {q.rsplit(".", 1)[-1] for _, defs, _, _ in found for q in defs}  # what it defines: its own names
        self.units, self.calls, self.members, self.where = {}, {}, {}, {}
        # A function reached through a module-level name (`_OPS = {"t": _tile}`, then `_OPS["t"](...)`): a global a
        # top-level statement fills links to the functions and classes it names; a unit using the global uses them.
        links: dict[str, set[str]] = {}
        skip = names | {(a.asname or a.name).split(".")[0] for _, tree, _ in trees for n in ast.walk(tree)
                        if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}  # and modules
        for stmt in (stmt for _, tree, _ in trees for stmt in tree.body if not isinstance(stmt, (*_DEFS, ast.ClassDef))):
            for g in _bound(stmt) - skip:
                links.setdefault(g, set()).update(_referenced(stmt) & names)
        for key, defs, rewritten, roots in found:
            context = {}  # a definition's names are normalised as those of the outermost one it is in
            for root in roots:
                own, attrs = names | _locals(root), _own_attributes(root)
                context.update({id(n): (own, attrs) for n in ast.walk(root) if isinstance(n, (*_DEFS, ast.ClassDef))})
            # the innermost first: normalising a function rewrites the ones inside it, which the rewrite leaves as
            # they are; a class after its methods (its unit is theirs)
            order = sorted(defs, key=lambda q: (isinstance(defs[q], ast.ClassDef), -q.count(".")))
            for qual in order:
                node, name = defs[qual], f"{prefix}{qual}"
                if name in self.units:
                    continue
                if isinstance(node, ast.ClassDef):
                    self.members[name] = [f"{name}.{m.name}" for m in node.body if isinstance(m, _DEFS)]
                    unit = Unit()
                    for member in self.members[name]:
                        unit = unit + self.units.get(member, Unit())
                else:
                    unit = _unit(rewritten[qual], *context[id(node)], checks)
                self.units[name] = unit
                used = _referenced(node)
                self.calls[name] = (used & names).union(*(links.get(g, ()) for g in used - names))
                self.where[name] = key

    def closure(self, name: str, exclude=frozenset()) -> tuple[Unit, list[str]]:
        """`name`'s unit with those of the functions and classes it uses by name, however deep (`exclude` aside):
        (the unit, the helpers' qualnames)."""
        unit, seen, todo, helpers = self.units[name], {name}, [name], []
        while todo:
            for short in sorted(self.calls.get(todo.pop(), ())):
                if short in exclude:
                    continue
                for q in self.units:
                    if q != short or q in seen or any(s.startswith(f"{q}.") for s in seen):
                        continue  # a function or class of the source, not one `name` is in
                    seen.add(q)
                    unit = unit + self.units[q]
                    helpers.append(q)
                    todo.append(q)
        return unit, helpers


def _referenced(node: ast.AST) -> set[str]:
    """The names `node` uses: its identifiers, and its string constants that are identifiers (a function looked up
    as `globals()["_tile"]` or `getattr(module, "_tile")`)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        and n.value.isidentifier()}


_FILLS = {"update", "append", "extend", "insert", "add", "setdefault", "__setitem__"}  # methods that store into a global


def _bound(stmt: ast.stmt) -> set[str]:
    """The globals a top-level statement fills: assigned (`_OPS = {...}`, `_OPS["t"] = f`, `a, b = f, g`) or changed by
    a method (`_OPS.update(t=f)`, `_OPS.append(f)`); an import or a use is not a binding of what it uses."""
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        targets = [stmt.target]
    else:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        fills = isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in _FILLS
        targets = [call.func.value] if fills else []
    found = set()
    for n in (n for t in targets for n in (ast.walk(t) if isinstance(t, (ast.Tuple, ast.List)) else [t])):
        while isinstance(n, (ast.Subscript, ast.Attribute, ast.Starred)):
            n = n.value
        found |= {n.id} if isinstance(n, ast.Name) else set()
    return found


def _roots(tree: ast.AST) -> list[ast.AST]:
    """The functions and classes of `tree` not inside another one (under `if`, `try`, ... included)."""
    roots = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            (roots.append if isinstance(child, (*_DEFS, ast.ClassDef)) else visit)(child)

    visit(tree)
    return roots


class References:
    """Reference units, indexed, as plain data the child can hold too (`data`; hashes only, nothing of the code can be
    read back): per reference its name, numbers of fingerprints and statements, and the fingerprints it needs to be
    judged on (`fp_min`: MIN_FINGERPRINTS, or its `min_fingerprints`); `fp_index` its winnowed fingerprints, `kg_index`
    all its k-grams, `st_index` its statements. `common` (fingerprints, statements) is idiom, no evidence: taken out of
    the references, and marked in `kg_index` (no references) so that it is taken out of a submission's fingerprints
    too."""

    def __init__(self, units: dict[str, Unit] | None = None, common=(frozenset(), frozenset()), data=None,
                 min_fingerprints: dict[str, int] | None = None):
        if data is not None:  # the child's: what the trusted process indexed
            self.__dict__.update({key: data[key] for key in _DATA})
            return
        self.names, self.fp_len, self.st_len, self.fp_min = [], [], [], []
        self.fp_index, self.kg_index, self.st_index = {}, {}, {}
        common_fp, common_st = common
        for h in common_fp:
            self.kg_index[h] = []
        for name, unit in (units or {}).items():
            fp, st = unit.fp - common_fp, Counter({h: n for h, n in unit.st.items() if h not in common_st})
            least = (min_fingerprints or {}).get(name, MIN_FINGERPRINTS)
            if len(fp) < least and sum(st.values()) < MIN_STATEMENTS:
                continue  # too small to judge, whatever the release gives
            i = len(self.names)
            self.names.append(name)
            self.fp_len.append(len(fp))
            self.st_len.append(sum(st.values()))
            self.fp_min.append(least)
            for h in fp:
                self.fp_index.setdefault(h, []).append(i)
            for h in unit.kg - common_fp:
                self.kg_index.setdefault(h, []).append(i)
            for h, count in st.items():
                self.st_index.setdefault(h, []).append((i, count))

    @property
    def data(self) -> dict:
        return {key: getattr(self, key) for key in _DATA}

    def shares(self, unit: Unit, given: Unit = Unit()) -> dict[int, tuple[float, float, float]]:
        """{reference: (the share of its fingerprints found among the unit's k-grams, the share of the unit's
        fingerprints found among its k-grams, the share of its statements the unit has)}, the code `given` (the
        release's) and the idiom taken out of both sides; 0.0 where the side a share is of is too small."""
        found, given_fp, given_st, matched, mine = Counter(), Counter(), Counter(), Counter(), Counter()
        for h in unit.kg - given.kg:
            found.update(self.fp_index.get(h, ()))
        for h in given.kg:
            given_fp.update(self.fp_index.get(h, ()))
        own = [h for h in unit.fp - given.kg if self.kg_index.get(h, True) != []]  # the unit's, idiom aside
        for h in own:
            mine.update(self.kg_index.get(h, ()))
        for h, count in given.st.items():
            for i, ref_count in self.st_index.get(h, ()):
                given_st[i] += min(count, ref_count)
        for h, count in (unit.st - given.st).items():
            for i, ref_count in self.st_index.get(h, ()):
                matched[i] += max(0, min(count, ref_count - given.st.get(h, 0)))
        out = {}
        for i in set(found) | set(matched) | set(mine):
            fp, st = self.fp_len[i] - given_fp[i], self.st_len[i] - given_st[i]
            out[i] = (found[i] / fp if fp >= self.fp_min[i] else 0.0,
                      mine[i] / len(own) if len(own) >= MIN_FINGERPRINTS else 0.0,
                      matched[i] / st if st >= MIN_STATEMENTS else 0.0)
        return out

    def best(self, unit: Unit, given: Unit = Unit(), key=frozenset()) -> tuple[float, float, str] | None:
        """(token share, statement share, name) of the reference the unit comes nearest to copying — the largest of
        token share / TOKEN_THRESHOLD and statement share / THRESHOLD, where the token share is the larger of its
        two directions (how much of the reference the unit holds, how much of the unit comes from the reference)
        —, or None. A unit made (nearly) wholly of `key`'s k-grams — the answer key graded as itself, or with a
        line or two changed, as the lab's own tests change it to make a mistake — is compared with nothing. `key` is
        empty when a class is graded (`grader.copies`), so this never applies to a student's work."""
        if unit.kg and len(unit.kg & key) >= KEY_SHARE * len(unit.kg):
            return None
        found = [(max(theirs, mine), st, self.names[i]) for i, (theirs, mine, st) in self.shares(unit, given).items()]
        return max(found, key=ratio, default=None)

    def copy_of(self, unit: Unit, given: Unit = Unit(), key=frozenset()) -> tuple[float, float, str] | None:
        """`best`, if it is a copy: its token threshold (`ratio`) of the tokens or THRESHOLD of the statements."""
        return found if (found := self.best(unit, given, key)) is not None and ratio(found) >= 1 else None


KEY_SHARE = 0.9  # of a unit's k-grams from the answer key for it to be graded as the answer key (the lab's tests)


def ratio(found) -> float:
    """How near (token share, statement share[, reference]) is to a copy: 1 or more is one (`copy_thresholds`)."""
    ref = found[2] if len(found) > 2 else None
    return max(found[0] / token_threshold(ref, TOKEN_THRESHOLD), found[1] / statement_threshold(ref, THRESHOLD))


def why_copy(fn_name: str, found: tuple[float, float, str], helpers: list[str] = ()) -> str:
    tok, st, ref_name = found
    what = (f"`{fn_name}` with the functions it calls ({', '.join(f'`{h}`' for h in helpers[:4])}) is a copy of "
            f"{ref_name} split across them: together they hold" if helpers else
            f"`{fn_name}` is a copy of {ref_name}: it holds")
    return (f"{what} {max(tok, st):.0%} of that code ({tok:.0%} of its token sequences, {st:.0%} of its "
            f"statements; names, constants, order and added statements aside)")


_WHY = re.compile(r"is a copy of (.+?)(?: split across them)?: (?:it holds|together they hold) (\d+%) of")


def match_label(why: str) -> str | None:
    """What the instructor's one-line summary and the grades' CSV show of a reason `why_copy` wrote: the reference and
    the share, 'lib.attn.attention.flash_attention_forward 93%' or "the solution's TextStream 88%" (None for another
    reason, such as lib's own code run)."""
    found = _WHY.search(why or "")
    if found is None:
        return None
    ref = re.sub(r" with `.*$", "", found.group(1)).removeprefix("lib's ")
    ref = re.sub(r"^the instructor's solution [(]its `(.+)`[)]$", r"the solution's \1", ref)
    return f"{ref} {found.group(2)}"


def copies_of(source: Source, references: References, given_of, key=frozenset()) -> list[tuple[object, str, str]]:
    """(where, qualname, why) for every function of `source` that is a copy, alone or as a method of a class that is
    one (each of the class's methods is then listed)."""
    out = []
    for name, unit in source.units.items():
        hit = references.copy_of(unit, given_of(source.where[name]), key)
        if hit is not None:
            why = why_copy(name, hit)
            out += [(source.where[name], member, why) for member in source.members.get(name, [name])]
    return out


def copies_in_source(source: str, references: dict) -> dict[str, str]:
    """{qualname: why} for the functions of `source` that are copies of `references` (`reference_units`)."""
    refs = References(data=references)
    return {q: why for _, q, why in copies_of(Source([(0, source)]), refs, lambda _: Unit())}


# --- reaching the grader's objects ---------------------------------------------------------------------------------

# The attributes through which code walks from a function or a frame to the objects behind it: a function's module
# globals and closure, a frame's caller and namespaces. In the student's process every one of them leads to the
# grader's own objects (its records of what ran, what it watches), and no audit event reports reading them. An
# exercise has no use for any of them; the notebook's source (and source it compiles while it runs) may not name them.
INTROSPECTION = ("__globals__", "__closure__", "cell_contents", "f_back", "f_locals", "f_globals", "f_builtins")


def introspection_in_source(source: str) -> list[tuple[int, str]]:
    """(line, name) for each use of an `INTROSPECTION` attribute in `source`: read as an attribute (`f.__globals__`)
    or named by a string (`getattr(f, "__closure__")`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INTROSPECTION:
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in INTROSPECTION:
            out.append((node.lineno, node.value))
    return sorted(set(out))


def introspection_why(name: str, where: str) -> str:
    return (f"reads `{name}` ({where}): through a function's globals or closure, or a frame's caller, code reaches "
            f"the grader's own objects in its process; an exercise has no use for it (remove it)")


def introspection_in_cells(cells) -> list[str]:
    """One reason per cell of `cells` (`grader.notebook.exercise_cells`) whose source uses an `INTROSPECTION`
    attribute (`introspection_in_source`)."""
    out = []
    for index, _, source in cells:
        found = introspection_in_source(source)
        if found:
            line, name = found[0]
            out.append(introspection_why(name, f"cell {index}, line {line}"))
    return out
