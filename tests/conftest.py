import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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
