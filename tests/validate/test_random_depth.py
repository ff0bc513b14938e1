"""Random jobs from seed DEEP_FROM on draw their cut's depth (3, 6 or 12 decoder layers) from a stream of their own:
the jobs of earlier seeds are the same jobs (their stored records replay: tests/validate/test_validate_random.py
`test_recorded_cases_replay`), and no other choice of a job moves with the depth."""

from __future__ import annotations

import random

from hpcmem.validate.random_jobs import DEEP_FROM, DEPTHS, LAYERS_FOR, RANDOM_LAYERS, choices, depth


def test_earlier_seeds_keep_three_layers():
    for seed in range(1, DEEP_FROM):
        for index in range(40):
            c = choices(seed, index)
            assert c["layers"] == LAYERS_FOR.get(c["model_type"], RANDOM_LAYERS)


def test_later_seeds_draw_every_depth_from_their_own_stream():
    seen = set()
    for index in range(60):
        c = choices(DEEP_FROM, index)
        expected = random.Random(f"{DEEP_FROM}:{index}:depth").choice(DEPTHS)     # the depth stream, by hand
        assert c["layers"] == min(expected, LAYERS_FOR.get(c["model_type"], expected))
        seen.add(c["layers"])
    assert set(DEPTHS) <= seen
    assert depth(DEEP_FROM, 0, "longcat_flash") <= LAYERS_FOR["longcat_flash"]


def test_deepest_seeds_cut_at_sixteen_layers() -> None:
    """Seed 8 cuts every job at 16 decoder layers (the coverage sweep's depth), but where a type's trace is capped; the
    seeds around it keep the depths their own stream draws (seed 11's jobs, which the properties test draws, did not
    move)."""
    from hpcmem.validate.random_jobs import DEEPEST_SEEDS

    assert DEEPEST_SEEDS == {8}
    for index in range(20):
        assert depth(8, index, "llama") == 16
        for seed in (7, 9, 11):
            assert depth(seed, index, "llama") == random.Random(f"{seed}:{index}:depth").choice(DEPTHS)
    assert depth(8, 0, "recurrent_gemma") == LAYERS_FOR["recurrent_gemma"]
