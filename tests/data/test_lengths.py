"""Fast tier of the length profiler: the pure rules, statistics, profile schema and `tokens_per_micro_batch`,
checked against hand calculation. No datasets/trl needed except where a test builds a whole SFT profile."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpcmem.data.batches import kept_rows, micro_batches, nearest_rank, round_up, summarize
from hpcmem.data.errors import ProfileError
from hpcmem.data.profile import SCHEMA, decode_lengths, encode_lengths, tokens_per_micro_batch
from hpcmem.data.render import bins, report
from hpcmem.data.stats import candidates, expand, histogram, length_stats, recommend


def test_stats_of_one_to_a_thousand_are_the_nearest_rank_percentiles():
    stats = length_stats(list(range(1, 1001)))
    assert (stats["count"], stats["total_tokens"], stats["min"], stats["max"]) == (1000, 500500, 1, 1000)
    assert stats["mean"] == 500.5
    # pXX = the smallest length with at least XX % of the values ≤ it: ceil(XX/100 · 1000)-th value
    assert [stats[p] for p in ("p50", "p90", "p95", "p99", "p99.9")] == [500, 900, 950, 990, 999]


def test_nearest_rank_is_not_fooled_by_float_rounding():
    values = list(range(1, 101))
    assert nearest_rank(values, 0.95) == 95      # 0.95 · 100 = 95.00000000000001 in floating point
    assert nearest_rank(values, 0.999) == 100
    assert nearest_rank([7], 0.5) == 7


def test_histogram_round_trips_to_the_sorted_lengths():
    lengths = [5, 3, 5, 9, 3, 5]
    assert histogram(lengths) == [[3, 2], [5, 3], [9, 1]]
    assert expand(histogram(lengths)) == sorted(lengths)


def test_lengths_blob_round_trips():
    values = [0, 1, 4096, 2**31, 17] * 1000
    assert decode_lengths(encode_lengths(values)) == values


def test_sft_truncation_cuts_to_max_length_and_counts_lost_tokens():
    kept = kept_rows("sft", {"length": [10, 20, 30, 40]}, 25)
    assert (kept.rows, kept.rows_per_example) == ([10, 20, 25, 25], 1)
    assert (kept.num_truncated, kept.num_dropped, kept.tokens_total, kept.tokens_lost) == (2, 0, 100, 20)
    assert kept_rows("sft", {"length": [10, 20]}, None).tokens_lost == 0


def test_sft_prompt_completion_drops_examples_whose_prompt_fills_max_length():
    kept = kept_rows("sft", {"length": [10, 40, 30], "prompt": [5, 25, 20]}, 25)
    assert kept.rows == [10, 25]                            # the 2nd example's prompt alone is 25 tokens: dropped
    assert (kept.num_truncated, kept.num_dropped, kept.tokens_lost) == (1, 1, 40 + 5)


def test_dpo_cuts_each_sequence_and_drops_long_prompts():
    parts = {"prompt": [5, 20, 3], "chosen": [30, 22, 8], "rejected": [10, 21, 9]}
    kept = kept_rows("dpo", parts, 20)
    assert (kept.rows, kept.rows_per_example) == ([20, 10, 8, 9], 2)
    assert (kept.num_truncated, kept.num_dropped, kept.tokens_total, kept.tokens_lost) == (1, 1, 100, 10 + 43)


def test_reward_drops_pairs_longer_than_max_length_instead_of_cutting():
    kept = kept_rows("reward", {"chosen": [10, 30, 5], "rejected": [12, 4, 20]}, 20)
    assert kept.rows == [10, 12, 5, 20]
    assert (kept.num_truncated, kept.num_dropped, kept.tokens_lost) == (0, 1, 34)


def test_grpo_never_cuts_prompts():
    assert kept_rows("grpo", {"prompt": [100, 7]}, 10).rows == [100, 7]


def test_padded_and_padding_free_micro_batches_by_hand():
    rows = [3, 5, 2, 7, 1]
    # padded, B=2: [3,5] → 2×5, [2,7] → 2×7, [1] → 1×1
    assert micro_batches(rows, 2, flatten=False, pad_to_multiple_of=None) == [(8, 10), (9, 14), (1, 1)]
    # pad_to_multiple_of=4 rounds the padded length: 2×8, 2×8, 1×4
    assert micro_batches(rows, 2, flatten=False, pad_to_multiple_of=4) == [(8, 16), (9, 16), (1, 4)]
    # padding-free: one row of the sum, rounded: 8, 9→12, 1→4
    assert micro_batches(rows, 2, flatten=True, pad_to_multiple_of=4) == [(8, 8), (9, 12), (1, 4)]
    summary = summarize(micro_batches(rows, 2, flatten=False, pad_to_multiple_of=None), num_rows=5)
    assert summary["padding_fraction"] == pytest.approx((25 - 18) / 25)
    assert (summary["worst_tokens_per_micro_batch"], summary["typical_tokens_per_micro_batch"]) == (14, 10)


def test_preference_micro_batches_pad_chosen_and_rejected_together():
    kept = kept_rows("dpo", {"prompt": [1, 1, 1], "chosen": [4, 3, 9], "rejected": [6, 2, 1]}, None)
    # B=2 examples → 4 rows (chosen and rejected of both) padded to the longest: 4×6; then 2 rows × 9
    assert micro_batches(kept.rows, 2 * kept.rows_per_example, flatten=False, pad_to_multiple_of=None) == \
        [(15, 24), (10, 18)]
    assert round_up(9, 8) == 16 and round_up(16, 8) == 16 and round_up(5, None) == 5


def test_candidates_are_powers_of_two_around_the_data_plus_p95_and_p99():
    stats = {"p50": 500, "p95": 590, "p99": 598, "max": 600}
    assert candidates(stats) == [(256, "2^8"), (512, "2^9"), (590, "p95"), (598, "p99"), (1024, "2^10")]
    merged = candidates({"p50": 300, "p95": 512, "p99": 700, "max": 700}, extra=[700, 333])
    assert merged == [(256, "2^8"), (333, "asked"), (512, "p95 · 2^9"), (700, "asked · p99"), (1024, "2^10")]


def _row(max_length, *, truncated, dropped=0, lost=0, padding=0.5, bfd_lost=0):
    summary = {"rows": 100, "padding_fraction": padding, "worst_tokens_per_micro_batch": 999, "tokens_lost": lost}
    packed = {"rows": 40, "padding_fraction": 0.0, "worst_tokens_per_micro_batch": 800, "tokens_lost": bfd_lost}
    return {"max_length": max_length, "label": "x", "examples": 100, "truncated_examples": truncated,
            "dropped_examples": dropped, "tokens_total": 10_000, "tokens_lost": lost,
            "strategies": {"padded": summary, "bfd": packed, "bfd_split": {**packed, "tokens_lost": 0}}}


def test_recommendation_takes_the_shortest_max_length_cutting_at_most_one_percent():
    rows = [_row(None, truncated=0), _row(256, truncated=30, lost=900), _row(512, truncated=1, lost=10, padding=0.05)]
    rec = recommend("sft", rows, {})
    assert (rec["max_length"], rec["packing"]) == (512, False)
    assert "512" in rec["reason"] and "1.0%" in rec["reason"]


def test_recommendation_packs_when_padding_wastes_much_and_splits_when_bfd_cuts_much():
    rec = recommend("sft", [_row(None, truncated=0), _row(512, truncated=1, padding=0.4, bfd_lost=10)], {})
    assert (rec["packing"], rec["packing_strategy"], rec["padding_free"]) == (True, "bfd", True)
    rec = recommend("sft", [_row(None, truncated=0), _row(512, truncated=1, padding=0.4, bfd_lost=500)], {})
    assert rec["packing_strategy"] == "bfd_split"
    assert recommend("dpo", [_row(None, truncated=0), _row(512, truncated=0, padding=0.4)], {})["packing"] is False


def test_terminal_histogram_bins_cover_every_length_once():
    hist = histogram([1, 2, 2, 3, 50, 99, 100])
    for log_x in (False, True):
        out = bins(hist, log_x=log_x, num_bins=5)
        assert sum(c for _, _, c in out) == 7
        assert out[0][0] == 1 and out[-1][1] == 100
        assert all(a[1] + 1 == b[0] for a, b in zip(out, out[1:]))
    assert bins([[7, 3]], log_x=False) == [(7, 7, 3)]


def _fake_profile(trainer="sft", parts=None, candidates_=()):
    parts = parts or {"length": [3, 5, 2, 7, 1]}
    names = {"sft": ["length"], "dpo": ["chosen", "rejected"], "reward": ["chosen", "rejected"], "grpo": ["prompt"]}
    rows = [n for ex in zip(*(parts[k] for k in names[trainer])) for n in ex]
    return {"schema": SCHEMA, "source": {"trainer": trainer}, "histogram": histogram(rows),
            "order": {"encoding": "zlib+base64 uint32le", "parts": {k: encode_lengths(v) for k, v in parts.items()}},
            "candidates": list(candidates_)}


def _ask(profile, **kw):
    args = {"max_length": None, "per_device_train_batch_size": 2, "packing": False, "packing_strategy": "bfd",
            "padding_free": False, "pad_to_multiple_of": None, **kw}
    return tokens_per_micro_batch(profile, **args)


def test_tokens_per_micro_batch_from_ordered_lengths_by_hand():
    profile = _fake_profile()
    assert _ask(profile) == 14                                         # [2, 7] padded: 2 × 7
    assert _ask(profile, max_length=4) == 8                            # cut to 4: 2 × 4
    assert _ask(profile, padding_free=True) == 9                       # 2 + 7 in one row
    assert _ask(profile, per_device_train_batch_size=3, pad_to_multiple_of=4) == 24   # [3,5,2] → 3 × 8
    assert _ask(profile, per_device_train_batch_size=5, padding_free=True) == 18


def test_tokens_per_micro_batch_without_order_is_an_upper_bound_from_the_histogram():
    profile = {**_fake_profile(), "order": None}
    assert _ask(profile) == 2 * 7                                      # B × longest
    assert _ask(profile, padding_free=True) == 7 + 5                   # the two longest together
    assert _ask(profile, max_length=4, padding_free=True) == 8
    ordered = _fake_profile()
    for kw in ({}, {"padding_free": True}, {"max_length": 4}, {"per_device_train_batch_size": 3}):
        assert _ask(profile, **kw) >= _ask(ordered, **kw)


def test_tokens_per_micro_batch_packing_uses_stored_rows_else_bounds_by_max_length():
    cand = {"max_length": 8, "strategies": {"bfd": {"row_lengths": encode_lengths([8, 7, 6, 2])},
                                            "bfd_split": {"same_as": "bfd"},
                                            "wrapped": {"row_lengths": encode_lengths([8, 8, 2])}}}
    profile = _fake_profile(candidates_=[cand])
    assert _ask(profile, packing=True, max_length=8) == 15             # bfd is padding-free: 8 + 7
    assert _ask(profile, packing=True, max_length=8, packing_strategy="bfd_split") == 15
    assert _ask(profile, packing=True, max_length=8, packing_strategy="wrapped") == 16      # padded 2 × 8
    assert _ask(profile, packing=True, max_length=8, packing_strategy="wrapped", padding_free=True) == 16
    assert _ask(profile, packing=True, max_length=100) == 200          # not profiled: B × max_length
    assert _ask(profile, packing=True, max_length=100, packing_strategy="wrapped", pad_to_multiple_of=64) == 256


def test_tokens_per_micro_batch_trainer_rules():
    dpo = _fake_profile("dpo", {"prompt": [2, 9], "chosen": [6, 12], "rejected": [4, 10]})
    assert _ask(dpo) == 4 * 12
    assert _ask(dpo, max_length=10) == 4 * 10
    assert _ask(dpo, max_length=9) == 2 * 6                            # 2nd example dropped (prompt 9 ≥ 9)
    assert _ask(dpo, padding_free=True) == 4 * 12                      # DPO falls back to padding
    reward = _fake_profile("reward", {"chosen": [6, 12], "rejected": [4, 10]})
    assert _ask(reward, max_length=11) == 2 * 6
    grpo = _fake_profile("grpo", {"prompt": [30, 7, 9]})
    assert _ask(grpo, max_length=5) == 2 * 30                          # prompts are never cut
    with pytest.raises(ProfileError, match="SFTTrainer"):
        _ask(dpo, packing=True, max_length=8)


def test_tokens_per_micro_batch_rejects_what_is_not_a_profile():
    with pytest.raises(ProfileError, match="hpcmem.lengths/1"):
        _ask({"schema": "something/2"})
    with pytest.raises(ProfileError, match="packing_strategy"):
        _ask(_fake_profile(), packing=True, max_length=8, packing_strategy="greedy")


def test_profile_module_is_stdlib_only():
    code = ("import sys, hpcmem.data.profile, hpcmem.data.stats, hpcmem.data.render, hpcmem.data; "
            "heavy = {'datasets', 'trl', 'transformers', 'torch', 'numpy', 'matplotlib', 'pyarrow'} "
            "& set(sys.modules); "
            "print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.torch
def test_report_names_every_strategy_and_the_recommendation():
    pytest.importorskip("trl")
    from hpcmem.data.profiler import build_profile

    lengths = [100] * 90 + [1000] * 10
    profile = build_profile({"length": lengths}, source={"trainer": "sft", "data": "x.jsonl", "split": "train",
                                                         "tokenizer": "tok", "format": "text",
                                                         "dataset_text_field": "text"},
                            per_device_train_batch_size=4, pad_to_multiple_of=None)
    text = report(json.loads(json.dumps(profile)))
    for needle in ("p99.9", "padded", "padding-free", "packing bfd", "packing wrapped", "recommendation:", "2^10"):
        assert needle in text


def test_load_profile_reads_checks_and_names_the_problem(tmp_path):
    from hpcmem.data.profile import load_profile

    good = tmp_path / "p.json"
    good.write_text(json.dumps(_fake_profile()))
    assert _ask(load_profile(str(good))) == 14
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not JSON"):
        load_profile(str(tmp_path / "bad.json"))
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(str(tmp_path / "missing.json"))


def test_a_profile_answers_only_for_its_own_trainer():
    assert _ask(_fake_profile(), trainer="sft") == 14
    with pytest.raises(ProfileError, match="made for sft, not dpo"):
        _ask(_fake_profile(), trainer="dpo")
    assert _ask(_fake_profile("grpo", {"prompt": [30, 7]}), trainer="rloo") == 60
