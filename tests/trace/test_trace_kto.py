"""KTO through TRL's own KTOTrainer: `run_trace(..., kernels="cpu")` on fake tensors counts the same peak as a REAL
two-step run on the CPU (tiny model, same StorageTracker) for each reference-model mode; the reference forward is a
labelled phase; the case file builds; TRL's batch-size rule is hpcmem's."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.errors import SpecError  # noqa: E402
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.validate.cases import case_job
from hpcmem.validate.trace import load_cases
from tests.helpers.trace_helpers import TINY_LLAMA, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

CASES_FILE = Path(__file__).resolve().parents[2] / "estimator" / "cases" / "kto.yaml"


def tiny_job(**train) -> JobSpec:
    settings = {"max_length": 64, "per_device_train_batch_size": 2, "beta": 0.1, "disable_dropout": True, **train}
    return JobSpec(model=TINY_LLAMA, train=TrainSpec(trainer="kto", **settings))


CASES = {
    "kto-ref-model": {},
    "kto-peft-no-ref": {"use_peft": True, "lora_r": 8},
    "kto-precompute-gc-off": {"precompute_ref_log_probs": True, "gradient_checkpointing": False},
}


@pytest.mark.parametrize("case", list(CASES))
def test_trace_matches_a_real_cpu_run(case):
    real, traced = trace_matches_cpu(tiny_job(**CASES[case]), case)
    assert traced.batch["shape"] == [2, 64] and traced.batch["layout"] == "unpaired"


def test_reference_forward_is_a_phase_and_the_reference_is_counted():
    from hpcmem.trace import run_trace

    job = tiny_job(max_length=16)
    with_ref = run_trace(job, kernels="cpu", timeline=True)
    assert any(p.phase.startswith("step 2 / forward / reference forward") for p in with_ref.timeline)
    precomputed = run_trace(tiny_job(max_length=16, precompute_ref_log_probs=True), kernels="cpu")
    assert with_ref.components["param"] > precomputed.components["param"]      # the second model's weights
    assert any("precompute_ref_log_probs" in n for n in precomputed.reimplemented)


def test_case_file_builds_and_is_traceable():
    from hpcmem.trace.trainer import check_traceable

    cases = load_cases(CASES_FILE)
    assert len(cases) >= 20 and sum(bool(c.get("ci")) for c in cases) >= 4
    for case in cases:
        job = case_job(case)
        assert job.train.trainer == "kto" and not check_traceable(job), case["id"]


def test_one_row_is_refused_with_trls_reason():
    with pytest.raises(SpecError, match="per_device_train_batch_size must be > 1 for KTO"):
        tiny_job(per_device_train_batch_size=1)
