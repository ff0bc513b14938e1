"""Intra-op threads for torch processes that share one machine's CPUs.

torch starts as many OpenMP threads as the process may use CPUs (torch/csrc/Parallel docs: `get_num_threads`
defaults to the physical cores), and OpenMP's threads spin at every parallel region's barrier before they sleep
(libgomp's GOMP_SPINCOUNT). Two such processes on the same cores each wait on threads the other has descheduled: on
this project's 2-core test machine two tests that take 20 s together took 613 s each (estimator/LOG.md). So every
pool of torch processes gives each its share of the CPUs, and never more than OMP_NUM_THREADS says.
This module does not import torch at import time (hpcmem.trace's package rule); `share_cpus` does, in the worker.
"""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a SLURM task or `taskset` may give fewer than the machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


def threads_per_process(processes: int, cpus: int | None = None) -> int:
    """Each of `processes` torch processes' share of `cpus` (default: the usable ones), at least 1, and no more than
    an OMP_NUM_THREADS already set in the environment."""
    share = max(1, (usable_cpus() if cpus is None else cpus) // max(1, processes))
    given = os.environ.get("OMP_NUM_THREADS", "")
    return min(share, int(given)) if given.isdigit() and int(given) > 0 else share


def share_cpus(processes: int) -> None:
    """A pool worker's initializer: set its torch threads (and its own children's, through the environment) to its
    share of the CPUs among `processes` workers."""
    n = threads_per_process(processes)
    os.environ["OMP_NUM_THREADS"] = str(n)
    import torch

    torch.set_num_threads(n)
