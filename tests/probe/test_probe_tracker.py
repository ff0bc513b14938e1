"""ProbeTracker: the trace's storage tracker plus what real runs need (meta tensors, a capacity, in-place resizes)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from hpcmem.probe.meters import ProbeTracker  # noqa: E402


def test_meta_tensors_hold_no_bytes() -> None:
    with ProbeTracker() as tr:
        meta = torch.empty(1000, device="meta")
        real = torch.empty(1000)
        assert tr.current_bytes == 4000
    del meta, real


def test_resized_storages_are_recounted_at_once() -> None:
    """FSDP2 frees and re-allocates unsharded parameters with UntypedStorage.resize_ (no op the mode sees)."""
    with ProbeTracker() as tr:
        t = torch.empty(1000)
        t.untyped_storage().resize_(0)
        assert tr.current_bytes == 0
        t.untyped_storage().resize_(8000)
        assert tr.current_bytes == 8000 and tr.peak_bytes == 8000
    assert torch.UntypedStorage.resize_ is not None
    t.untyped_storage().resize_(16)             # outside the tracker: the original method is back
    assert t.untyped_storage().nbytes() == 16


def test_capacity_raises_once_as_an_oom() -> None:
    with ProbeTracker(capacity_bytes=10_000) as tr:
        keep = torch.empty(2000)                                  # 8 000 B
        with pytest.raises(torch.OutOfMemoryError, match="capacity 10000 B exceeded"):
            torch.empty(1000)                                     # + 4 000 B
        more = torch.empty(1000)                                  # cleanup after the OOM must not raise again
        assert tr.peak_bytes >= 12_000
    del keep, more
