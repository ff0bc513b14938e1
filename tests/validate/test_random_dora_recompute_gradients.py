"""Random DoRA jobs whose stored traces peak in the last layer's recompute at down_proj, held once the recompute
instant holds down_proj's DoRA output gradients (hpcmem.estimate.lora_variants `recompute_output_gradients`) instead
of the fused head's returned gradient, and each linear's weight-norm instant leaves out its own saved terms not made
yet (LoraLayout `saved_after_weight_norm`).

Expected values: the stored traces of the real TRL/peft code (estimator/random/trace.jsonl).
- s1-572 (RLOO, IQuestCoder widths H 5,120, I 27,648, bf16 + autocast, DoRA r 25 all-linear, dropout 0.05, 62,426
  tokens): at its peak, 82,910,993,408 B, four [tokens, H] blocks autograd's backward made — two fp32, two bf16,
  3,835 MB; the rule that counted the arriving gradient and the head's fp32 gradient with its cast named 2,557 MB and
  read −1.01 %.
- s1-182 (DPO, EXAONE widths H 4,096, I 14,336, lora_dropout 0, 8,576 tokens): peak 9,055,400,960 B at down_proj's eye
  in the recompute, where lora_A's input cast, lora_B's output and DoRA's products do not exist yet; the rule that
  counted them read +2.73 %."""

from __future__ import annotations

from hpcmem.validate.random_trace import score
from tests.helpers.random_records import stored_trace_record


def test_rloo_dora_last_layer_recompute_is_not_under_its_trace() -> None:
    s = score(stored_trace_record("s1-572"))
    assert 0.0 <= s["err_pct"] <= 1.0, s


def test_dpo_dora_without_dropout_is_within_1_percent_of_its_trace() -> None:
    s = score(stored_trace_record("s1-182"))
    assert abs(s["err_pct"]) <= 1.0, s
