"""How a gloo rank ends once its results are on disk: at once, without the interpreter's finalization.

ProcessGroupGloo's worker threads drop their reference to a finished collective's work — and to the tensors it holds
— a moment after the collective returns to Python (hpcmem.probe.seq_buffers measures that lag). A process group
that something still references outlives `destroy_process_group` (DeepSpeed's comm backend and FSDP2's device mesh
keep theirs), so that drop can land while the interpreter is being torn down; releasing a tensor then needs the GIL
and the rank dies in `std::terminate` ("terminate called without an active exception", SIGABRT) after it wrote its
results. Upstream describes the same finalization crash (pytorch/pytorch pull 179291, an atexit
`destroy_process_group`, abandoned). Seen in CI on two probes at this place, three times; reproduced in 3 of 24
ranks under load on a 2-core machine, then not in 100 more. `os._exit` skips the finalization: nothing is left to
run — files are closed and streams flushed first.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def end_rank(code: int = 0) -> NoReturn:
    """Flush stdout/stderr and leave the process with `code`, skipping interpreter finalization."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed or broken stream: nothing more can reach it
            pass
    os._exit(code)
