"""The names of the estimate's phases and components, as the breakdown prints them and its readers match them."""

from __future__ import annotations

FORWARD = "forward"
BACKWARD = "backward"               # every backward phase's name starts with it
OPTIMIZER_STEP = "optimizer step"
OPTIMIZER_STATES = "optimizer states"
GRADIENTS = "gradients"
ACTIVATIONS = "activations"          # saved tensors (under checkpointing: the layers' inputs)
OPTIMIZER_TEMPORARIES = "optimizer step temporaries"
AUTOCAST_CACHE = "autocast weight cache"
CHECKPOINT_SAVE = "checkpoint save"
EVALUATION = "evaluation"
BLOCK_TAILS = "allocator block tails"
CUBLAS_WORKSPACES = "cuBLAS workspaces"
