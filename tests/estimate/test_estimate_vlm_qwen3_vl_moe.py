"""Qwen3-VL-MoE SFT with images (Qwen3-VL's tower and deepstack mergers on a Qwen3-MoE decoder, the 30B-A3B widths cut
to 2 decoder layers and 4 vision blocks) against the trace of TRL's SFTTrainer with its vision collator and
Qwen3VLProcessor (estimator/traces/vlm-qwen3-vl-moe.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-qwen3-vl-moe.yaml`): full fine-tuning and LoRA (all-linear, q_proj/v_proj), checkpointing on and
off, 448 and 896 px, and the catalog's 30B-A3B at full depth (vlm-qwen3-vl-moe-30b.yaml); and what peft does with
all-linear on this type, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.models.params import peft_default_targets
from tests.helpers.trace_helpers import shipped_case_job

ROOT = Path(__file__).resolve().parents[2]
CASES = "vlm-qwen3-vl-moe.yaml"
HELD_OUT = "vlm-qwen3-vl-moe-30b.yaml"      # the catalog's 30B-A3B at full depth, traced after the cut's estimate


def _records(cases: str) -> dict:
    path = ROOT / "estimator" / "traces" / cases.replace(".yaml", ".jsonl")
    return {r["case"]["id"]: r for r in map(json.loads, path.read_text().splitlines())}


RECORDS = _records(CASES)
FULL_DEPTH = _records(HELD_OUT)
MAX_PCT = 3.0


def test_every_case_is_traced():
    ids = {c["id"] for c in yaml.safe_load((ROOT / "estimator" / "cases" / CASES).read_text())["cases"]}
    assert ids == set(RECORDS)


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(shipped_case_job(CASES, case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


@pytest.mark.parametrize("case_id", sorted(FULL_DEPTH))
def test_full_depth_estimate_within_1_percent_of_the_trace(case_id):
    traced = FULL_DEPTH[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(shipped_case_job(HELD_OUT, case_id)).phases)
    assert abs(estimated - traced) <= 0.01 * traced, (estimated, traced)


def test_all_linear_adapts_the_attention_and_the_tower_not_the_experts():
    """peft 0.21.2 rewrites no target of qwen3_vl_moe (peft/utils/transformers_weight_conversion.py: the type is not in
    `_MODEL_TO_CONVERSION_PATTERN`), so all-linear is every nn.Linear but the head: the decoder's q/k/v/o_proj and the
    tower's, merger's and deepstack mergers' linears; the fused experts are 3-D parameters and the router a bare
    weight, neither an nn.Linear. No ParamWrapper: TRL's lora_dropout 0.05 is accepted. By hand at r = 16 on the
    decoder (2 layers, hidden 2048, 32 query heads and 4 KV heads of 128): q 16·(2048 + 4096), k and v
    16·(2048 + 512) each, o 16·(4096 + 2048)."""
    job = shipped_case_job(CASES, "q3vlm-lora-all-gc-448")
    assert job.train.lora_dropout == 0.05
    decoder = 2 * 16 * ((2048 + 4096) * 2 + (2048 + 512) * 2)
    lora = next(c for p in estimate(job).phases for c in p.components if c.name == "lora adapters")
    assert lora.note.startswith(f"{decoder:,} params r=16 on q_proj,k_proj,v_proj,o_proj")


def test_peft_has_no_default_targets_for_it():
    with pytest.raises(SpecError, match="no default LoRA target_modules"):
        peft_default_targets("qwen3_vl_moe")


def test_an_omitted_text_key_takes_the_text_config_class_default():
    """Qwen3VLMoeTextConfig's defaults (configuration_qwen3_vl_moe.py), not Qwen3MoeConfig's: 60 experts, top 4,
    moe_intermediate_size 1408, 16 heads and 16 KV heads."""
    from hpcmem.models.config import model_spec_from_config

    cfg = json.loads((ROOT / "tests" / "fixtures" / "vlm" / "qwen3_vl_moe-tiny.json").read_text())
    cfg["text_config"] = {"num_hidden_layers": 1}
    spec = model_spec_from_config(cfg, "defaults")
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size, spec.num_attention_heads,
            spec.num_key_value_heads, spec.hidden_size, spec.tie_word_embeddings) == (60, 4, 1408, 16, 16, 2048, False)
