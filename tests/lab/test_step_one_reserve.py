"""hpcmem.lab.step_one_reserve: step one's end-of-step reserve read from a device stream, checked on a stream worked
by hand with the caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp `get_allocation_size`, `get_free_block`,
`should_split`), and a stored random job's re-trace against its stored reserved peak."""

from __future__ import annotations

import pytest

from hpcmem.lab.step_one_reserve import end_of_step_one
from tests.helpers.random_records import stored_trace_record

MIB = 1024**2


def test_the_optimizer_step_maps_a_segment_only_for_the_state_no_freed_block_holds() -> None:
    events = [["phase", "step 1 / forward"],
              30 * MIB,             # a 30 MiB segment (≥ 10 MiB: the request rounded up to 2 MiB)
              12 * MIB,             # a 12 MiB segment
              -2,                   # frees the 30 MiB block (two items back)
              ["phase", "step 1 / optimizer"],
              16 * MIB,             # best fit: the free 30 MiB block, split (14 MiB left > 1 MiB)
              16 * MIB,             # the 14 MiB piece is too small: a new 16 MiB segment
              ["phase", "step 2 / forward"],
              8 * MIB]
    ends = end_of_step_one(events)
    assert ends["rb"] == 30 + 12                    # reserve when the optimizer step begins
    assert ends["r1"] == 30 + 12 + 16               # and at the end of step one
    assert ends["a1"] == 12 + 16 + 16               # step one's allocated peak, after the optimizer step
    assert ends["opt_segments"] == [16]


@pytest.mark.torch
@pytest.mark.slow
def test_the_re_trace_reproduces_the_stored_reserved_peak_s1_471() -> None:
    """nanochat SFT, full fine-tuning with checkpointing: the re-trace's replay reaches the stored record's reserved
    peak, and step one ends with more reserved than allocated (the gap the estimate's `second_step` leaves out)."""
    from hpcmem.lab.step_one_reserve import measure

    rec = stored_trace_record("s1-471")
    row = measure(rec)
    assert row["peak_r_now"] == rec["trace"]["reserved"]["default"] // MIB
    assert row["rb"] <= row["r1"] and row["a1"] < row["r1"]
