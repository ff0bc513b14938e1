"""DPO, KTO and Reward turn the model's own nn.Dropout modules off (TRL's disable_dropout); a learned type that holds
dropout modules (GPT-2's family) was traced by SFT, which keeps them. Such a job takes the cells traced with the
modules at p = 0 (`-nomdrop`: hpcmem.estimate.learned `model_dropout_off`) where learned.

Known answers: traces of random jobs (the real TRL trainers on fake tensors at full width), of
estimator/random/trace.jsonl — in-sample for the choice to add the cells (their errors before: +7.15, +4.84, +4.35,
+40.2 % and, for the no-autocast full cell's variant, +24.56 %); no fresh-seed set was drawn for them."""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers.random_records import allocated_error_pct as _error_pct
from tests.helpers.random_records import record_spec as _spec
from tests.helpers.random_records import scored_estimate as _scored
from tests.helpers.random_records import stored_trace_record, without_cells
from tests.helpers.sweep_profiles import sweep_spec

pytestmark = pytest.mark.torch

# DPO with LoRA on OpenAI-GPT (no checkpointing) and GPT-BigCode, KTO full fine-tuning on GPT-NeoX-Japanese; Reward
# full fine-tuning on OpenAI-GPT with bf16 and fp16 off (`full-noamp-nomdrop`)
MOVED = [("s1-247", 7.15), ("s1-462", 4.84), ("s4-52", 4.35), ("s5-37", 40.24), ("s2-279", 24.56)]


@pytest.mark.parametrize(("job_id", "before"), MOVED)
def test_a_job_with_the_models_dropout_off_takes_the_cells_traced_so(job_id: str, before: float) -> None:
    rec = stored_trace_record(job_id)
    spec = _spec(rec)
    assert spec.train.disable_dropout and spec.model.learned.provenance.get("dropout")
    assert abs(_error_pct(spec, rec)) < 1.0
    assert not any("model's dropout" in w for w in _scored(spec).warnings)
    old = without_cells(spec, "-nomdrop/")
    assert _error_pct(old, rec) == pytest.approx(before, abs=0.01)
    assert any("model's dropout on" in w for w in _scored(old).warnings)


def test_the_learner_traces_sft_with_the_models_dropout_off() -> None:
    from hpcmem.trace.learn import learn_job, missing_cells

    p, spec = sweep_spec("gpt2")
    off, on = learn_job(spec, "bfloat16", "lora-nodrop-nomdrop", True, 256), learn_job(spec, "bfloat16",
                                                                                          "lora-nodrop", True, 256)
    assert off.model_dropout_off and not on.model_dropout_off and off.train == on.train
    assert not off.train.disable_dropout        # SFTConfig has no such field: the JobSpec carries it
    bare = dataclasses.replace(p, cells={k: c for k, c in p.cells.items() if "-nomdrop/" not in k})
    assert ("full-nomdrop", True) in missing_cells(bare) and not [c for c in missing_cells(p) if "nomdrop" in c[0]]
