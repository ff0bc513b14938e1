"""One unpadded row needs no attention mask — except in a sliding-window layer whose keys reach the window:
transformers skips the mask only while `kv_length < local_attention_size` (masking_utils.py
`_ignore_causal_mask_sdpa`, `create_sliding_window_causal_mask` passing `local_size=config.sliding_window`). There the
layer gets a [rows, 1, seq, seq] mask, SDPA keeps its additive bias, and k and v are repeated to every head.

The estimate read such a row as unmasked: Gemma 3 (window 512) at 1 × 32,768 tokens stood −21.2 % under its trace
(−2.3 % at 8,192), and learned sliding types' one-row checks −3.6 … −16.7 % at 32,768 (Ministral, Gemma 4, CWM, …).
Oracles: transformers' own config classes for which layers slide, and the trace of the real code on fake tensors.
"""

from __future__ import annotations

import copy

import pytest

from tests.helpers.random_records import stored_trace_record


@pytest.mark.torch
@pytest.mark.parametrize(("model_type", "extra"), [
    ("gemma3_text", {}),
    ("gemma3_text", {"sliding_window_pattern": 3}),
    ("gemma2", {}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 5}),
    ("mistral", {"sliding_window": 4096}),
    ("mistral", {"sliding_window": None}),
])
def test_the_sliding_layers_are_those_transformers_config_lays_out(model_type: str, extra: dict) -> None:
    from transformers import AutoConfig

    from hpcmem.models.config import sliding_layers

    cfg = {"model_type": model_type, "num_hidden_layers": 12, **extra}
    real = AutoConfig.for_model(**cfg)
    want = tuple(i for i, t in enumerate(getattr(real, "layer_types", None) or
                                         ["sliding_attention" if real.sliding_window else "full_attention"] * 12)
                 if t == "sliding_attention")
    assert sliding_layers(cfg, model_type, 12) == want


def test_an_unpadded_row_keeps_a_sliding_mask_only_past_the_window() -> None:
    from hpcmem.estimate.activations import mask_bytes
    from hpcmem.job.shape import MicroBatch
    from hpcmem.models.resolve import resolve_model

    m = resolve_model("google/gemma-3-1b-pt", offline=True)
    assert m.sliding_window == 512 and len(m.sliding_layers) == 22     # 26 layers, every sixth full
    row = MicroBatch(rows=1, seq=8192, label_tokens=8191, padding_free=False, source="test")
    assert mask_bytes(row, m) == 8192 * 8192                            # one boolean [1, 1, seq, seq]
    assert mask_bytes(MicroBatch(rows=1, seq=511, label_tokens=510, padding_free=False, source="test"), m) == 0
    flash = MicroBatch(rows=1, seq=8192, label_tokens=8191, padding_free=False, source="test",
                       attn_implementation="flash_attention_2")
    assert mask_bytes(flash, m, "flash_attention_2") == 0


@pytest.mark.torch
@pytest.mark.parametrize("max_length", [8192, 32768])
def test_gemma3_one_unpadded_row_against_the_trace(max_length: int) -> None:
    """s1-480's Gemma 3 cut (3 sliding layers, window 512) as SFT on one unpadded row."""
    from hpcmem.validate.random_trace import score, trace_record

    job = copy.deepcopy(stored_trace_record("s1-480")["job"])
    job["trainer"], job["id"] = "sft", f"s1-480-one-row-{max_length}"
    job["settings"].update(per_device_train_batch_size=1, max_length=max_length)
    got = score(trace_record(job))
    assert abs(got["err_pct"]) < 1.0, got


@pytest.mark.torch
def test_a_learned_sliding_type_on_one_unpadded_row_against_the_trace() -> None:
    """Ministral's sweep profile (learned on 2 padded rows) at 1 × 32,768 tokens, its rows check's job."""
    from dataclasses import replace

    from hpcmem.models.profile import load_profile, spec_from_profile
    from hpcmem.trace.learn import _check, learn_job
    from hpcmem.validate.coverage import TECHNIQUES, learning_probe, profiles_dir, reference_config, sweep_techniques

    stored = load_profile(profiles_dir() / "ministral.json")
    probe = learning_probe(reference_config("ministral")[0],
                           [TECHNIQUES[t] for t in sweep_techniques("ministral")])[0]
    spec = spec_from_profile(replace(probe, cells=stored.cells), "ministral")
    assert spec.sliding_layers
    assert abs(_check(probe, stored.cells, learn_job(spec, "bfloat16", "full", True, 32768, rows=1))) < 1.0
