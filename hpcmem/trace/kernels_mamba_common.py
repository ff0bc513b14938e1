"""What the Mamba-1 and Mamba-2 kernel stand-ins share: the autocast dtype the GPU kernel sees, and the refusal
put in place of a torch fallback hpcmem has not mapped."""

from __future__ import annotations

from typing import Any

from hpcmem.trace.kernels_linear import fallback_refusal


def _autocast_dtype() -> Any:
    """CUDA autocast's dtype on the GPU (custom_fwd keeps the caller's autocast), read from the trace's CPU autocast."""
    import torch

    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


def refusal(name: str) -> Any:
    return fallback_refusal(name, "a Mamba mixer", "mamba-ssm and causal-conv1d")
