"""The reshaped streams of hpcmem.lab.schedule_coarsening, worked by hand from the stream format
(hpcmem.trace.events: n ≥ 0 a malloc, -d the free of the malloc d items back) and the allocator's rules (expandable
segments: 20 MiB pages for blocks > 1 MiB, 2 MiB pages for the small pool; tests/estimate/test_trace_allocator.py)."""

from __future__ import annotations

from hpcmem.lab.schedule_coarsening import coarsen_layers, drop_below, merge_runs, variant
from hpcmem.trace.replay import NO_WORKSPACES, replay

MIB = 1024**2
L0 = ["phase", "step 1 / backward / layer 0"]
OPT = ["phase", "step 1 / optimizer"]


def test_the_small_pool_has_pages_of_its_own():
    ev = [["phase", "step 1 / forward"], 30 * MIB, 512, ["phase", "step 2 / forward"], -3, 10 * MIB]
    # 30 MiB maps two 20 MiB pages, 512 B one 2 MiB small page; step 2's 10 MiB takes the freed 30 MiB range
    assert replay(ev, expandable=True, workspaces=NO_WORKSPACES).stats["peak_reserved_bytes"] == 42 * MIB
    large = variant(ev, "large")
    assert large == [["phase", "step 1 / forward"], 30 * MIB, ["phase", "step 2 / forward"], -2, 10 * MIB]
    assert replay(large, expandable=True, workspaces=NO_WORKSPACES).stats["peak_reserved_bytes"] == 40 * MIB
    assert drop_below(ev, 20 * MIB) == [["phase", "step 1 / forward"], 30 * MIB, ["phase", "step 2 / forward"], -2]


def layer() -> list:
    # an 8 MiB and a 16 MiB transient alive together (peak 24 MiB) around a 6 MiB block that outlives the phase
    return [L0, 8 * MIB, 6 * MIB, 16 * MIB, -3, -2, OPT, -5]


def test_transients_become_blocks_of_the_largest_size():
    # ceil(24 / 16) = 2 blocks of 16 MiB at the phase's start, freed (last first) when the next phase begins
    assert coarsen_layers(layer(), "blocks") == [L0, 16 * MIB, 16 * MIB, 6 * MIB, -2, -4, OPT, -4]


def test_transients_become_one_peak_block_at_start_or_end():
    assert coarsen_layers(layer(), "start") == [L0, 24 * MIB, 6 * MIB, -2, OPT, -3]
    assert coarsen_layers(layer(), "end") == [L0, 6 * MIB, 24 * MIB, -1, OPT, -4]


def test_only_layer_phases_are_coarsened():
    ev = [["phase", "step 1 / forward / lm head / loss"], 8 * MIB, 16 * MIB, -2, -2]
    assert coarsen_layers(ev, "blocks") == ev


def test_runs_of_one_lifetime_merge():
    # two blocks born in the forward and freed in the optimizer phase are one 12 MiB block; the 4 MiB block born
    # after the run ends (a free came between) stays itself
    ev = [["phase", "step 1 / forward"], 5 * MIB, 7 * MIB, 3 * MIB, -1, 4 * MIB, OPT, -6, -6, -4]
    assert merge_runs(ev, persistent_only=False) == [["phase", "step 1 / forward"], 12 * MIB, 3 * MIB, -1,
                                                     4 * MIB, OPT, -5, -3]
    # nothing here is a weight or a state kept past the last step
    assert merge_runs(ev, persistent_only=True) == ev


def test_weights_kept_past_the_last_step_merge():
    # 3 + 5 MiB weights allocated before the first step and freed after it: one 8 MiB block, freed once
    ev = [["phase", ""], 3 * MIB, 5 * MIB, ["phase", "step 1 / forward"], 8 * MIB, -1, ["phase", ""], -6, -6]
    assert merge_runs(ev, persistent_only=True) == [["phase", ""], 8 * MIB, ["phase", "step 1 / forward"], 8 * MIB,
                                                    -1, ["phase", ""], -5]
