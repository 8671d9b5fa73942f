"""The grader's own code in the student's process, and the lists of it that the guard compares by identity.

`OWN` holds the grader's modules as they were loaded before the notebook's code ran (they leave `sys.modules`:
`grader.child._hide_modules`), and lib's memory meter. `grader_code` lists the grader's code here,
`observer_machinery` what its observers run on that is not the grader's (torch's dispatch-mode machinery,
FlopCounterMode and its formulas, lib's meter), `runtime_functions` the functions of Python's and torch's that the
grader's code here calls by plain names: each entry is (label, the live mapping that holds it, name, the object).
`grader.child_guard._Guard` takes the lists before the cells run and compares them, by identity, after every request:
one entry replaced is a verdict.
"""
from __future__ import annotations

import sys

# The grader's own modules in this process, as they were loaded before the notebook's code ran: taken from here, not
# from sys.modules, which they leave (`grader.child._hide_modules`) so that the notebook's `import grader.child` finds
# a fresh copy of the file rather than this process's records. Also lib's memory meter, which a check may ask to
# measure a call.
OWN: dict = {}
# The child's own modules (its runtime, its codec, its guard and these lists): each, with every class it defines, is
# the grader's code (`grader_code`).
CHILD_OWN = ("grader.child", "grader.child_wire", "grader.child_guard", "grader.child_identity")
# The modules whose functions the grader's code here calls by plain names; one of their functions replaced by the
# notebook's code is a verdict (`runtime_functions`): it could change what the grader's code does in this process.
_RUNTIME_MODULES = ("builtins", "os", "posix", "posixpath", "io", "select", "struct", "pickle", "_pickle", "ast",
                    "types", "marshal", "sys", "collections", "hashlib")
# ... and of torch's, those the grader's code here calls (torch.equal judges whether a call changed its arguments);
# not all of torch's: torch._dynamo, once imported, wraps some of them itself (torch.manual_seed)
_RUNTIME_TORCH = ("equal", "no_grad", "frombuffer", "empty", "empty_strided", "zeros", "ones_like", "arange", "max",
                  "allclose", "device", "get_rng_state", "set_rng_state", "is_tensor", "Generator")


def grader_code() -> list:
    """The grader's code here: [(label, the live mapping that holds it, name, the object)] — compared by
    identity later (`grader.child_guard`), with the objects themselves kept (an id can be reused)."""
    observe, fingerprint, wire, notebook, observers, calls, triton = (OWN[f"grader.{m}"] for m in (
        "observe", "fingerprint", "wire", "notebook", "observers", "child_observe", "triton_watch"))
    out = []
    reads, reach, ran = OWN["grader.reads"], OWN["grader.reach"], OWN["grader.ran"]  # ran: with LinesRun
    own = []  # the child's own modules, each with the classes it defines (`_Child`, `_ChildPickler`, `_Guard`, ...)
    for name in CHILD_OWN:
        module = OWN.get(name) or sys.modules.get(name)
        if module is not None:
            own += [module] + [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == name]
    for holder in (*own, observe, fingerprint, wire, notebook, observe.OpRecorder, observe.Observation,
                   observe.Recording, observers, observers.Observers, observers.HostMeter, calls, calls.Scope,
                   calls.Calls, calls.Job, calls.Rerun, vars(calls)["_Entry"], vars(calls)["_Copier"], triton,
                   triton.TritonWatch, reads, reads.Visits, reads.ReadCounter, reach, reach.Reach, ran, *ran.PLAN):
        mapping, name = vars(holder), getattr(holder, "__name__", str(holder))
        out += [(f"{name}.{k}", mapping, k, v) for k, v in mapping.items()
                if callable(v) or isinstance(v, (staticmethod, classmethod, property))]
    out += [(f"OWN[{k!r}]", OWN, k, v) for k, v in OWN.items()]  # what the grader's code here takes its modules from
    # the judge of compiled code (the audit hook's): its constants too (`MIN_STATEMENTS`, `THRESHOLD`, ...)
    similarity = OWN["grader.similarity"]
    out += [(f"grader.similarity.{k}", vars(similarity), k, v) for k, v in vars(similarity).items()
            if not k.startswith("__")]
    # the table the recorder classifies ops by: its tables too (an op moved among ELEMENTWISE goes unmeasured)
    op_table = OWN["grader.op_table"]
    out += [(f"grader.op_table.{k}", vars(op_table), k, v) for k, v in vars(op_table).items() if not k.startswith("__")]
    for cls in (similarity.Unit, similarity.Source, similarity.References, similarity._Normalise):  # its methods
        out += [(f"grader.similarity.{cls.__name__}.{k}", vars(cls), k, v) for k, v in vars(cls).items()
                if callable(v) or isinstance(v, (staticmethod, classmethod, property))]
    return out


def observer_machinery() -> list:
    """What the observers run on that is not the grader's, as `grader_code`: torch's dispatch-mode machinery
    (TorchDispatchMode, the mode stack's functions in torch._C and torch.utils._python_dispatch, OpOverload, the
    Tensor class), FlopCounterMode with its table of formulas, lib's memory meter, the profiler's functions —
    and that each of their modules is still the one `sys.modules` names. The notebook's code that replaced one
    (`torch.utils._python_dispatch._push_mode = ...`: no mode is pushed, nothing is seen) would change what
    every check measures."""
    import torch
    import torch._ops
    import torch.utils._python_dispatch as pd

    flop_counter = sys.modules.get("torch.utils.flop_counter")
    meter = OWN.get("TensorMemoryMeter")
    holders = [torch._C, pd, torch._ops, pd.TorchDispatchMode, torch._ops.OpOverload, torch._ops.OpOverloadPacket,
               torch.Tensor, torch._C.TensorBase]
    if flop_counter is not None:
        holders += [flop_counter, flop_counter.FlopCounterMode, getattr(flop_counter, "_FlopCounterMode", None)]
    if meter is not None:
        holders += [sys.modules.get(meter.__module__), meter]
    out = []
    for holder in holders:
        if holder is None:
            continue
        mapping, name = vars(holder), getattr(holder, "__name__", str(holder))
        if isinstance(holder, type(sys)):
            out.append((f"sys.modules[{name!r}]", sys.modules, name, holder))
        out += [(f"{name}.{k}", mapping, k, v) for k, v in mapping.items()
                if callable(v) or isinstance(v, (staticmethod, classmethod, property))]
    out += [(f"sys.{k}", vars(sys), k, getattr(sys, k)) for k in
            ("setprofile", "getprofile", "settrace", "gettrace", "_getframe", "_current_frames") if hasattr(sys, k)]
    registry = getattr(flop_counter, "flop_registry", None)
    if isinstance(registry, dict):
        out.append(("torch.utils.flop_counter.flop_registry", vars(flop_counter), "flop_registry", registry))
        out += [(f"torch.utils.flop_counter.flop_registry[{k}]", registry, k, v) for k, v in registry.items()]
    return out


def runtime_functions() -> list:
    """As `grader_code`: the functions of the modules the grader's code here calls by plain names
    (`_RUNTIME_MODULES`: builtins, os, io, pickle, ast, ...). The framing and the encoder are bound at import
    (`grader.wire._write`, `grader.child_wire`), but the rest calls `len`, `isinstance`, `ast.parse` as any code does:
    `builtins.len` replaced could silence the audit hook, `ast.parse` the judging of compiled code."""
    out = []
    for name in _RUNTIME_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        mapping = vars(module)
        out.append((f"sys.modules[{name!r}]", sys.modules, name, module))
        out += [(f"{name}.{k}", mapping, k, v) for k, v in list(mapping.items())
                if callable(v) and not (name == "sys" and k.endswith("hook"))]  # sys.excepthook & co. are settings
    import torch

    out += [(f"torch.{k}", vars(torch), k, vars(torch)[k]) for k in _RUNTIME_TORCH if k in vars(torch)]
    from collections import Counter  # what the judging of compiled code counts statements with

    out += [(f"Counter.{k}", vars(Counter), k, v) for k, v in vars(Counter).items() if callable(v)]
    return out
