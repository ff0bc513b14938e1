"""The names of the estimate's phases and components and of the verdict's levels: enums whose values are the text the
breakdown prints and its readers match (a str each, so JSON and text show the value)."""

from __future__ import annotations

from enum import Enum


class Name(str, Enum):
    """A name that prints as its value (str() and format() alike, on every Python the package supports)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class PhaseName(Name):
    FORWARD = "forward"
    BACKWARD = "backward"                        # every backward phase's name starts with it
    OPTIMIZER_STEP = "optimizer step"
    CHECKPOINT_SAVE = "checkpoint save"
    EVALUATION = "evaluation"
    HEAD_BACKWARD = "backward (LM head)"         # the LM head's backward: what the forward left, the head's backward


class ComponentName(Name):
    OPTIMIZER_STATES = "optimizer states"
    GRADIENTS = "gradients"
    ACTIVATIONS = "activations"                  # saved tensors (under checkpointing: the layers' inputs)
    OPTIMIZER_TEMPORARIES = "optimizer step temporaries"
    AUTOCAST_CACHE = "autocast weight cache"
    BLOCK_TAILS = "allocator block tails"
    CUBLAS_WORKSPACES = "cuBLAS workspaces"
    PROCESS_BASELINE = "process baseline"         # the host memory of a rank before the model loads
    GATHERED = "gathered parameters"              # ZeRO-3 / FSDP: units all-gathered through every phase
    PREFETCHED_UNIT = "prefetched unit"           # FSDP: the next layer, all-gathered ahead in the backward


class Level(Name):
    """The verdict: the safe bound fits; only the point estimate fits; neither fits."""

    FITS = "fits"
    TIGHT = "tight"
    DOES_NOT_FIT = "does not fit"


FORWARD, BACKWARD, OPTIMIZER_STEP, CHECKPOINT_SAVE, EVALUATION, HEAD_BACKWARD = PhaseName
(OPTIMIZER_STATES, GRADIENTS, ACTIVATIONS, OPTIMIZER_TEMPORARIES, AUTOCAST_CACHE, BLOCK_TAILS, CUBLAS_WORKSPACES,
 PROCESS_BASELINE, GATHERED, PREFETCHED_UNIT) = ComponentName


def is_forward(name: str) -> bool:
    """The forward's phase: "forward", or "forward (layer k)" where a learned profile puts the forward's highest
    instant inside a layer (hpcmem.estimate.learned `_forward_phase`)."""
    return name == FORWARD or name.startswith(f"{FORWARD} (")
