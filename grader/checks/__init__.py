"""The milestone checks, one module per week, and what they share."""
import torch


def assert_close(got, want, what: str, atol: float) -> None:
    """`got` is a finite tensor of `want`'s shape, within `atol` of it; else an AssertionError that says which."""
    assert isinstance(got, torch.Tensor), f"{what}: returned {type(got).__name__}, expected a torch.Tensor"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: contains NaN or inf (in a softmax, a row that has seen only -inf gives exp(-inf - -inf) = NaN)"
    err = (got.double() - want.double()).abs().max().item()
    assert err <= atol, f"{what}: differs from the reference by {err:.3g} (allowed {atol:g})"
