"""What the Triton interpreter did during an observed call: every launch, `tl.dot`, load, store and reduction.

Used by `grader.observe` in the student's process (it needs nothing of the grader's): under
`TRITON_INTERPRET=1` a kernel's programs run as Python with numpy, through the interpreter's builder, so
patching a few of its methods shows what each program read and wrote and which products it took with
`tl.dot`. `TritonWatch` records that and sums it up against the call's arguments and results; what crosses
back to the trusted side is the summary (`Observation.kernel`). `kernel_source_problems` reads a kernel's
source: inside `@triton.jit` only triton.language runs (on a GPU nothing else could), so a kernel that calls
numpy, a plain Python helper or reaches a value's `.handle` is named. A compiled kernel (CUDA) is not seen.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import sys
import textwrap
import types
import weakref

import numpy as np
import torch

from grader.fingerprint import lib_name

# The builtins a kernel may call (Triton's frontend accepts these in a kernel).
INPUT_COPY_LIMIT = 64 << 20  # bytes of tensor arguments copied to see that a kernel read them as passed
KERNEL_BUILTINS = {"range", "float", "int", "bool", "min", "max", "abs", "len", "print", "isinstance", "tuple"}


def _modes_off():
    return torch.utils._python_dispatch._disable_current_modes()


def _element_addresses(t: torch.Tensor) -> np.ndarray:
    """The byte address of each element of `t`, in the order of `t.reshape(-1)`."""
    off = np.zeros(tuple(t.shape), dtype=np.int64)
    for dim, (n, st) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = n
        off = off + (np.arange(n, dtype=np.int64) * st).reshape(shape)
    return (t.data_ptr() + off * t.element_size()).reshape(-1).astype(np.uint64)


def _values(t: torch.Tensor) -> np.ndarray:
    with _modes_off():
        flat = t.detach().reshape(-1)
        if flat.dtype == torch.bfloat16:
            flat = flat.float()
        return flat.numpy().copy()


def _spans(tensors: dict) -> list:
    """(start, end, key) byte ranges of tensors on the CPU (what an interpreted kernel can address)."""
    out = []
    for key, t in tensors.items():
        if t.device.type == "cpu" and t.numel():
            start = t.data_ptr()
            last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
            out.append((start, start + (last + 1) * t.element_size(), key))
    return out


def _where(addresses: np.ndarray, spans: list) -> dict:
    """How many of `addresses` fall in each span (by key), and None: the rest."""
    counts, left = {}, np.ones(addresses.shape, dtype=bool)
    for start, end, key in spans:
        inside = left & (addresses >= start) & (addresses < end)
        n = int(inside.sum())
        if n:
            counts[key] = counts.get(key, 0) + n
            left &= ~inside
    if left.any():
        counts[None] = int(left.sum())
    return counts


class TritonWatch:
    """While active: the interpreter's launches, `tl.dot`s, loads, stores and reductions (if this process has
    imported Triton's interpreter). `dot_scale` != 1 multiplies every product a `tl.dot` takes (its accumulator
    operand excluded): the checks use it to see that the result is made of those products."""

    def __init__(self, dot_scale: float = 1.0):
        self.dot_scale = float(dot_scale)
        self.undo = []
        self.launches, self.dots, self.loads, self.stores = [], [], [], []
        self.problems: list[str] = []
        self.reduce_rank = 0
        self.elementwise = 0  # elements out of the kernels' float binary ops (+, −, ×, ÷) and fmas
        self.live, self.peak_live = 0, 0  # bytes of the kernels' values (the interpreter's arrays) alive at once
        self.depth = 0
        self.checked: set = set()
        self.inputs: dict = {}

    def watch_inputs(self, inputs: dict) -> None:
        """The call's tensor arguments (key: position or name), copied now: every launch must find them intact
        (up to `INPUT_COPY_LIMIT` bytes in all; beyond that nothing is copied or compared)."""
        tensors = {k: t for k, t in inputs.items() if isinstance(t, torch.Tensor) and t.device.type == "cpu"}
        if sum(t.numel() * t.element_size() for t in tensors.values()) > INPUT_COPY_LIMIT:
            return  # no kernel exercise passes this much; a model's weights are not copied for nothing
        with _modes_off():
            self.inputs = {k: (t, t.detach().clone()) for k, t in tensors.items()}

    def _inputs_intact(self) -> bool:
        with _modes_off():
            return all(t.shape == c.shape and torch.equal(t.detach().reshape(-1).view(torch.uint8),
                                                          c.reshape(-1).view(torch.uint8))
                       for t, c in self.inputs.values())

    def __enter__(self):
        interp = sys.modules.get("triton.runtime.interpreter")
        if interp is None:
            return self
        grid_cls, builder_cls, reduce_cls = interp.GridExecutor, interp.InterpreterBuilder, interp.ReduceOps
        originals = {"launch": grid_cls.__call__, "dot": builder_cls.create_dot,
                     "load": builder_cls.create_masked_load, "store": builder_cls.create_masked_store,
                     "reduce": reduce_cls.apply}
        watch = self

        def watched_launch(executor, *args, **kwargs):
            grid = executor.grid
            watch.launches.append((str(getattr(executor.fn, "__name__", "?")),
                                   tuple(int(g) for g in grid) if isinstance(grid, tuple) else ()))
            source = next((orig for orig, new in getattr(interp.InterpretedFunction, "rewritten_fn", {}).items()
                           if new is executor.fn), executor.fn)
            watch.problems += kernel_source_problems(source, watch.checked)
            watch.problems += kernel_argument_problems(getattr(source, "__name__", "?"), args, kwargs)
            if watch.inputs and not watch._inputs_intact():
                watch.problems.append("an input was changed before a kernel read it (the kernel must read the "
                                      "inputs as they were passed)")
            watch.depth += 1
            try:
                return originals["launch"](executor, *args, **kwargs)
            finally:
                watch.depth -= 1

        def watched_dot(builder, a, b, d, *rest, **kw):
            if watch.depth == 0:
                watch.problems.append("a tl.dot was run outside any kernel launch")
            sa, sb = a.data.shape, b.data.shape
            watch.dots.append((int(sa[-2]), int(sa[-1]), int(sb[-1])))
            ret = originals["dot"](builder, a, b, d, *rest, **kw)
            if watch.dot_scale != 1.0:
                acc = np.broadcast_to(d.data, ret.data.shape).astype(ret.data.dtype)
                ret = interp.TensorHandle((acc + (ret.data - acc) * watch.dot_scale).astype(ret.data.dtype), ret.dtype)
            return ret

        def watched_load(builder, ptrs, mask, *rest, **kw):
            if watch.depth == 0:
                watch.problems.append("a load ran outside any kernel launch")
            m = np.broadcast_to(np.asarray(mask.data, dtype=bool), ptrs.data.shape)
            watch.loads.append(np.asarray(ptrs.data, dtype=np.uint64)[m].copy())
            return originals["load"](builder, ptrs, mask, *rest, **kw)

        def watched_store(builder, ptrs, value, mask, *rest, **kw):
            if watch.depth == 0:
                watch.problems.append("a store ran outside any kernel launch")
            m = np.broadcast_to(np.asarray(mask.data, dtype=bool), ptrs.data.shape)
            vals = np.broadcast_to(np.asarray(value.data), ptrs.data.shape)[m]
            watch.stores.append((np.asarray(ptrs.data, dtype=np.uint64)[m].copy(), vals.astype(np.float64)))
            return originals["store"](builder, ptrs, value, mask, *rest, **kw)

        def watched_reduce(op, input):
            for x in (input if isinstance(input, tuple) else (input,)):
                shape = getattr(x, "shape", ())
                watch.reduce_rank = max(watch.reduce_rank, len(shape))
            return originals["reduce"](op, input)

        def refused(what):
            def method(*args, **kwargs):
                watch.problems.append(f"the kernel used an {what}, which these exercises do not need and the checks do "
                                      f"not follow; use tl.load and tl.store")
                raise RuntimeError(f"an {what} is not accepted in these exercises: use tl.load and tl.store")
            return method

        def watched_binary(builder, lhs, rhs, op):
            ret = originals["binary"](builder, lhs, rhs, op)
            if watch.depth and getattr(ret.data, "dtype", None) is not None and ret.data.dtype.kind == "f":
                watch.elementwise += int(ret.data.size)
            return ret

        def watched_fma(builder, x, y, z):
            ret = originals["fma"](builder, x, y, z)
            if watch.depth:
                watch.elementwise += int(np.size(ret.data))
            return ret

        def freed(nbytes):
            watch.live -= nbytes

        def watched_handle_init(handle):
            if original_post_init is not None:
                original_post_init(handle)
            if watch.depth:
                nbytes = int(getattr(handle.data, "nbytes", 0))
                watch.live += nbytes
                watch.peak_live = max(watch.peak_live, watch.live)
                weakref.finalize(handle, freed, nbytes)

        originals["binary"], originals["fma"] = builder_cls.binary_op, builder_cls.create_fma
        original_post_init = interp.TensorHandle.__dict__.get("__post_init__")
        patches = [(grid_cls, "__call__", watched_launch),
                   (builder_cls, "binary_op", watched_binary), (builder_cls, "create_fma", watched_fma),
                   (interp.TensorHandle, "__post_init__", watched_handle_init), (builder_cls, "create_dot", watched_dot),
                   (builder_cls, "create_masked_load", watched_load), (builder_cls, "create_masked_store", watched_store),
                   (reduce_cls, "apply", watched_reduce)]
        # Tensor descriptors load and store through the masked load and store above; atomics do not (and
        # none of these exercises needs one).
        for name in ("create_atomic_rmw", "create_atomic_cas"):
            if hasattr(builder_cls, name):
                patches.append((builder_cls, name, refused(name.replace("create_", "").replace("_", " ") + " operation")))
        for owner, name, new in patches:
            self.undo.append((owner, name, owner.__dict__.get(name, getattr(owner, name, None)), new))
            setattr(owner, name, new)
        return self

    _RECORDS = ("launches", "dots", "loads", "stores", "problems", "reduce_rank", "elementwise", "live", "peak_live",
                "inputs", "dot_scale")

    def begin(self, dot_scale: float = 1.0, inputs: dict | None = None) -> dict:
        """Start one observed call's own records in this (already entered) watch, with its `dot_scale` and tensor
        arguments; returns the records so far, for `end`. The patches stay as they are: a call into the notebook's
        code runs under the same watch whether it is observed or not (`grader.child_observe`)."""
        before = {name: getattr(self, name) for name in self._RECORDS}
        fresh = TritonWatch(dot_scale)
        for name in self._RECORDS:
            setattr(self, name, getattr(fresh, name))
        if inputs and "triton.runtime.interpreter" in sys.modules:
            self.watch_inputs(inputs)
        return before

    def end(self, before: dict) -> TritonWatch:
        """The records since `begin` (as a TritonWatch, for `summary`); the watch goes on with them added to `before`."""
        mine = TritonWatch(self.dot_scale)
        for name in self._RECORDS:
            setattr(mine, name, getattr(self, name))
        for name in ("launches", "dots", "loads", "stores", "problems"):
            setattr(self, name, before[name] + getattr(mine, name))
        self.reduce_rank = max(before["reduce_rank"], mine.reduce_rank)
        self.elementwise = before["elementwise"] + mine.elementwise
        self.peak_live = max(before["peak_live"], mine.peak_live)
        self.inputs, self.dot_scale = before["inputs"], before["dot_scale"]
        return mine

    def __exit__(self, *exc):
        for owner, name, original, new in self.undo:
            if owner.__dict__.get(name) is not new:
                self.problems.append("the grader's watch of the Triton interpreter was replaced during the call")
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        return False

    def summary(self, inputs: dict, outputs: list) -> dict:
        """What the kernels did, measured against the call's tensor arguments (`inputs`, key -> tensor) and the
        tensors it returned (`outputs`): plain data."""
        cpu_outputs = [t for t in outputs if isinstance(t, torch.Tensor) and t.device.type == "cpu"]
        in_spans = _spans({str(k): t for k, t in inputs.items() if isinstance(t, torch.Tensor)})
        out_spans = _spans({f"out{i}": t for i, t in enumerate(cpu_outputs)})
        loaded, widest = {}, 0
        for addresses in self.loads:
            widest = max(widest, int(addresses.size))
            for key, n in _where(addresses, in_spans).items():
                loaded[key] = loaded.get(key, 0) + n
        elsewhere = loaded.pop(None, 0)
        from_outputs = _where(np.concatenate(self.loads), out_spans) if self.loads and elsewhere else {}
        from_outputs.pop(None, None)
        stored_elsewhere, stored = 0, {}
        if self.stores:
            addresses = np.concatenate([a for a, _ in self.stores])
            values = np.concatenate([v for _, v in self.stores])
            stored_elsewhere = _where(addresses, out_spans).get(None, 0)
            # the last value the kernels stored at each address
            rev_a, rev_v = addresses[::-1], values[::-1]
            uniq, first = np.unique(rev_a, return_index=True)
            stored = (uniq, rev_v[first])
        unwritten = 0
        for t in cpu_outputs:
            addr, want = _element_addresses(t), _values(t).astype(np.float64)
            if not stored:
                unwritten += int(addr.size)
                continue
            uniq, last = stored
            at = np.clip(np.searchsorted(uniq, addr), 0, max(uniq.size - 1, 0))
            found = uniq[at] == addr
            got = last[at]
            if t.dtype == torch.bfloat16:  # stored as raw bits by the interpreter: count coverage only
                same = found
            else:
                same = found & ((got == want) | (np.isnan(got) & np.isnan(want)))
            unwritten += int((~same).sum())
        return {"launches": [(n, g) for n, g in self.launches], "dots": list(self.dots),
                "problems": list(dict.fromkeys(self.problems)), "loaded": {str(k): int(v) for k, v in loaded.items()},
                "loaded_elsewhere": int(elsewhere), "loaded_from_outputs": int(sum(from_outputs.values())),
                "widest_load": widest, "stored_elsewhere": int(stored_elsewhere), "outputs_not_stored": unwritten,
                "reduce_rank": int(self.reduce_rank), "elementwise": int(self.elementwise),
                "peak_values": int(self.peak_live)}


MAX_TUPLE = 4  # elements of a tuple argument (a shape, a stride)
MAX_FLOATS = 4  # float arguments of one launch (a scale, a constant)


def _scalar(value) -> bool:
    """A number, a string, None, a Triton dtype, or a tl.constexpr holding one of those."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if type(value).__module__.startswith("triton.language"):
        return _scalar(value.value) if hasattr(value, "value") else True
    return False


def kernel_argument_problems(name: str, args, kwargs) -> list[str]:
    """A launch's arguments: tensors (pointers), and scalars a kernel needs (sizes, strides, a scale, block
    sizes); data does not come in as numbers — no tuple of more than `MAX_TUPLE` values, at most `MAX_FLOATS`
    floats."""
    problems, floats = [], 0
    for value in list(args) + list(kwargs.values()):
        inner = getattr(value, "value", value) if type(value).__module__.startswith("triton.language") else value
        if isinstance(inner, (tuple, list)):
            if len(inner) > MAX_TUPLE or not all(_scalar(v) for v in inner):
                problems.append(f"kernel {name} was passed a tuple of {len(inner)} values: a kernel reads its data "
                                f"through pointers to the input tensors, not as numbers in its arguments")
        elif isinstance(inner, float):
            floats += 1
        elif isinstance(inner, (np.ndarray, np.generic)) and np.size(inner) > 1:
            problems.append(f"kernel {name} was passed a numpy array: pass tensors (pointers) and scalars")
    if floats > MAX_FLOATS:
        problems.append(f"kernel {name} was passed {floats} float arguments: a kernel reads its data through "
                        f"pointers to the input tensors, not as numbers in its arguments")
    return problems


def _lib_kernel(fn) -> str | None:
    """The lab's name for `fn` if it is one of lib's functions (by file or by fingerprint: grader.fingerprint)."""
    code = getattr(fn, "__code__", None)
    return lib_name(code) if code is not None else None


def _local_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
    return names


def _describe(value) -> str:
    if isinstance(value, types.ModuleType):
        return f"the module {value.__name__}"
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__name__)}"


def _triton_module(value) -> bool:
    return isinstance(value, types.ModuleType) and (value.__name__ == "triton" or value.__name__.startswith("triton.language"))


def kernel_source_problems(fn, checked: set | None = None) -> list[str]:
    """What in `fn`'s source (a kernel, or a @triton.jit function it calls) is not triton.language: a call of a
    Python function or a module other than triton's, a private attribute or a value's `.handle` (the
    interpreter's numpy data), an import. Each found once; jit functions it calls are read too."""
    checked = set() if checked is None else checked
    fn = getattr(fn, "fn", fn)  # an InterpretedFunction / JITFunction wraps the Python function
    if fn in checked:
        return []
    checked.add(fn)
    name = getattr(fn, "__name__", "?")
    reference = _lib_kernel(fn)
    if reference is not None:
        return [f"kernel {name} is the lab's reference ({reference}); write the kernel yourself"]
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return [f"the source of kernel {name} could not be read (define kernels with @triton.jit in a cell)"]
    problems = []
    local = _local_names(tree)
    scope = dict(vars(builtins))
    scope.update(getattr(fn, "__globals__", {}))
    try:
        scope.update(inspect.getclosurevars(fn).nonlocals)
    except (TypeError, ValueError):
        pass
    called_jit = []
    body = tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else tree
    nodes = [n for stmt in getattr(body, "body", []) for n in ast.walk(stmt)]
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)):
            problems.append(f"kernel {name} has an import or global statement; a kernel uses triton.language only")
        elif isinstance(node, ast.Attribute) and (node.attr.startswith("_") or node.attr == "handle"):
            problems.append(f"kernel {name} reads `.{node.attr}`: the interpreter's internals are not part of "
                            f"triton.language (on a GPU they do not exist)")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            if node.id not in scope:
                continue  # an error of the student's own, which the interpreter reports
            value = scope[node.id]
            if node.id in vars(builtins) and value is getattr(builtins, node.id):
                if callable(value) and node.id not in KERNEL_BUILTINS:
                    problems.append(f"kernel {name} uses Python's {node.id}(), which a kernel cannot run")
            elif _triton_module(value):
                pass
            elif hasattr(value, "fn") and hasattr(value, "run") and callable(getattr(value, "fn", None)):
                called_jit.append(value)  # another @triton.jit function
            elif value is None or isinstance(value, (bool, int, float, str)):
                pass
            elif type(value).__module__.startswith("triton.language") and _scalar(value):
                pass  # a tl.constexpr number or a dtype made at module level
            else:
                problems.append(f"kernel {name} uses {node.id} ({_describe(value)}): inside @triton.jit only "
                                f"triton.language operations run — no numpy, torch or Python helpers (a helper the "
                                f"kernel calls must be @triton.jit itself)")
    for node in nodes:  # tl.something.else: only into triton.language's own modules
        if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            chain, cur = [], node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if not isinstance(cur, ast.Name) or cur.id in local or not _triton_module(scope.get(cur.id)):
                continue
            value = scope[cur.id]
            for attr in reversed(chain):
                value = getattr(value, attr, None)
                if isinstance(value, types.ModuleType) and not _triton_module(value):
                    problems.append(f"kernel {name} reaches {value.__name__} through {cur.id}.{'.'.join(reversed(chain))}: "
                                    f"a kernel uses triton.language only")
                    break
                if not isinstance(value, types.ModuleType):
                    break
    for jit in called_jit:
        problems += kernel_source_problems(jit, checked)
    return list(dict.fromkeys(problems))
