import os

from hpcmem.trace.threads import threads_per_process

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Each pytest-xdist worker (and what it starts: trace pools, probe subprocesses, SLURM tasks) gets its share of the
# CPUs before torch is imported: torch's default of one OpenMP thread per core in every worker oversubscribes the
# cores, and OpenMP's spinning barriers then slow a step by an order of magnitude (hpcmem.trace.threads).
# Only in a worker: the controller's environment is every worker's, and it does not know the count.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = str(threads_per_process(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)))


def pytest_runtest_setup(item):
    """Once torch is loaded, each test module starts with what is alive moved out of the cyclic collector's view
    (gc.freeze): torch, transformers and TRL leave ~400,000 tracked objects that every full collection walks again
    (~0.3 s each; accelerate's free_memory and the probe collect at least twice per trainer run). Refcounting and
    collections of what the tests create are unchanged; only objects alive at a module's start are never scanned."""
    import gc
    import sys

    module = item.module.__name__
    if os.environ.get("HPCMEM_NOFREEZE") or "torch" not in sys.modules or _FROZEN.get("module") == module:
        return
    _FROZEN["module"] = module
    gc.collect()
    gc.freeze()


_FROZEN: dict[str, str] = {}
