"""The learner's per-layer terms from a step's measured instants, and the estimate that adds them up again, on a
two-layer step written out by hand (no torch: the bytes below are the instants a trace would read)."""

from __future__ import annotations

from hpcmem.trace.learn import terms

# A step of two layers that each keep 10 B into backward, make 3 B of gradients there, and — layer 1 only — leave
# 7 B alive past their backward (RecurrentGemma's RG-LRU keeps its recomputed scan's graph in a module attribute).
# states 100; the head holds 5 more in its backward; no head gradients (LoRA).
#   entry(1) = 100 + 5 + 10 + 10                 = 125   (both layers' kept, what the head left)
#   entry(0) = 125 − 10 + 3 + 7                  = 125   (layer 1 freed its 10, made 3 of gradients, left 7)
#   entry(−1) = 125 − 10 + 3                     = 118   (layer 0 freed its 10, made 3)
MEAS = {"start": [100, 110, 120], "entry": [125, 125], "entry_embed": 118, "bwd_peak": [130, 140],
        "fwd_peak": [112, 122], "head_fwd_peak": 130, "head_peak": 130}


KNOWN = {"grads": [3, 3], "base": 100, "head_grads": 0}


def test_what_a_layer_leaves_past_its_backward_is_not_counted_as_kept():
    t = terms({**MEAS, "left": [0, 7]}, KNOWN)
    assert t["kept"] == [10, 10] and t["left"] == [0, 7]
    assert t["entry_other"] == 125 - 100 - 20          # the head's 5: nothing of the layers is left in it
    # without the measurement the learner reads layer 1 as keeping 3 B: at a depth with more such layers the
    # estimate then misses each one's 7 B (RecurrentGemma at 7 layers: LoRA + GC −10.4 % of the trace)
    assert terms(MEAS, KNOWN)["kept"] == [10, 3]
