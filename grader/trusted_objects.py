"""What the child may ask of the trusted side's objects (`grader.isolation.Session._serve`): the operations a proxy
may request (`CHILD_MAY`), and the rule that the checks' objects — the models above all, shared by every submission
a worker grades — may be read and run by the notebook's code, never changed (`refuse_module_change`)."""
from __future__ import annotations

CHILD_MAY = {"getattr", "setattr", "delattr", "call", "getitem", "setitem", "len", "iter", "next", "bool",
              "float", "int", "index", "repr", "str", "contains", "byvalue"}


# The checks' models (SmolLM2 above all) are shared by every submission a worker grades: the notebook's code may
# run them and read them, never change them (`model.half()`, `model.layers[0] = ...`, a forward hook), or the
# next student would be graded against a broken model. Reads that nn.Module itself defines are listed here;
# every other name nn.Module defines (to, half, apply, register_*, load_state_dict, train, ...) is refused.
_MODULE_READS = {"forward", "parameters", "named_parameters", "buffers", "named_buffers", "children",
                 "named_children", "modules", "named_modules", "state_dict", "training", "extra_repr",
                 "get_submodule", "get_parameter", "get_buffer"}


def refuse_module_change(op: str, target, args: tuple) -> None:
    """The notebook's code may read and run the checks' objects, never change them: no attribute or item
    assignment (an autograd `ctx`, which the student's forward fills, is the one exception), and none of
    torch.nn's own mutators, whether reached on a model or through a wrapper a check put around it."""
    import torch

    if op in ("setattr", "delattr", "setitem"):
        if isinstance(target, torch.autograd.function.FunctionCtx):
            return
        raise AttributeError(f"the checks' objects are read-only to the notebook's code ({op} on a "
                             f"{type(target).__name__} was refused): build your own objects instead")
    if op == "getattr" and isinstance(target, torch.nn.Module) and args[0] not in _MODULE_READS and \
            hasattr(torch.nn.Module, args[0]):
        raise AttributeError(f"the checks' models are read-only to the notebook's code: "
                             f"{type(target).__name__}.{args[0]} is not available to it (run the model, "
                             f"read its config and weights; do not change it)")
    if op == "call":
        owner, func = getattr(target, "__self__", None), getattr(target, "__func__", None)
        if isinstance(owner, torch.nn.Module) and func is not None and target.__name__ not in _MODULE_READS:
            defined = next((c for c in type(owner).__mro__ if target.__name__ in vars(c)), None)
            if defined is not None and defined.__module__.startswith("torch."):
                raise AttributeError(f"the checks' models are read-only to the notebook's code: "
                                     f"{type(owner).__name__}.{target.__name__} is not available to it")
