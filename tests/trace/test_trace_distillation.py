"""Distillation through TRL's own DistillationTrainer: `run_trace(..., kernels="cpu")` on fake tensors counts the same
peak as a REAL two-step run on the CPU (tiny student and teacher, same StorageTracker); the teacher is counted with
the parameters; the CUDA mapping takes the divergence's Triton path; the case file builds; TRL's rules are
hpcmem's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.errors import SpecError  # noqa: E402
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.validate.cases import case_job
from hpcmem.validate.trace import load_cases
from tests.helpers.trace_helpers import TINY_LLAMA, assert_within, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

CASES_FILE = Path(__file__).resolve().parents[2] / "estimator" / "cases" / "distillation.yaml"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A wider, deeper tiny Llama of the student's vocabulary, as a config.json the trainer loads by path."""
    from hpcmem.trace.hf_config import hf_config_dict

    spec = replace(TINY_LLAMA, hidden_size=192, intermediate_size=384, num_hidden_layers=3, num_attention_heads=6)
    path = tmp_path_factory.mktemp("teacher") / "config.json"
    path.write_text(json.dumps(hf_config_dict(spec)))
    return replace(spec, name=str(path))


def tiny_job(teacher, **train) -> JobSpec:
    settings = {"max_prompt_length": 16, "max_completion_length": 32, "per_device_train_batch_size": 2, "beta": 1.0,
                "teacher_model_name_or_path": teacher.name, **train}
    return JobSpec(model=TINY_LLAMA, teacher=teacher, train=TrainSpec(trainer="distillation", **settings))


CASES = {
    "distill-full": {},
    "distill-peft": {"use_peft": True, "lora_r": 8},
    "distill-jsd-gc-off": {"beta": 0.5, "gradient_checkpointing": False},
}


@pytest.mark.parametrize("case", list(CASES))
def test_trace_matches_a_real_cpu_run(case, teacher):
    real, traced = trace_matches_cpu(tiny_job(teacher, **CASES[case]), case)
    assert traced.batch["shape"] == [2, 48]


def test_teacher_is_counted_and_the_loss_takes_the_triton_path(teacher):
    from hpcmem.trace import run_trace
    from hpcmem.trace.trainer import build_model

    traced = run_trace(tiny_job(teacher))
    assert any("chunked divergence on its Triton path" in n for n in traced.reimplemented)
    student = sum(p.numel() for p in build_model(tiny_job(teacher)).parameters())
    assert traced.components["param"] > 4 * student            # fp32 student + the larger fp32 teacher


def test_case_file_builds_and_is_traceable():
    from hpcmem.trace.trainer import check_traceable

    cases = load_cases(CASES_FILE)
    assert len(cases) >= 20 and sum(bool(c.get("ci")) for c in cases) >= 4
    for case in cases:
        job = case_job(case)
        assert job.train.trainer == "distillation" and job.teacher is not None
        assert not check_traceable(job), case["id"]


def test_trls_rules(teacher):
    with pytest.raises(SpecError, match="teacher_model_name_or_path is required"):
        JobSpec(model=TINY_LLAMA, train=TrainSpec(trainer="distillation"))
    with pytest.raises(SpecError, match="same vocabulary"):
        tiny_job(replace(teacher, vocab_size=2000))
    with pytest.raises(SpecError, match=r"beta must be in \[0.0, 1.0\]"):
        tiny_job(teacher, beta=1.5)


def test_a_one_row_micro_batch_cut_from_a_padded_generation_batch_is_masked(teacher):
    """B = 1, gradient_accumulation_steps 2: TRL pads both generated rows together, then splits them; the trace's
    shorter last row gives its micro-batch padding, so transformers builds the 4-D mask for the student and again for
    the teacher, and SDPA keeps a [seq, seq] bias per student layer. The peak is the teacher's attention over the
    student's saved tensors; the estimate counts that micro-batch (without the mask it was 45 % under)."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace

    job = JobSpec(model=TINY_LLAMA, teacher=teacher, train=TrainSpec(
        trainer="distillation", dtype="bfloat16", max_prompt_length=2000, max_completion_length=48,
        per_device_train_batch_size=1, gradient_accumulation_steps=2, gradient_checkpointing=False,
        teacher_model_name_or_path=teacher.name))
    traced = run_trace(job)
    est = max(tensor_bytes(p) for p in estimate(job).phases)
    assert traced.phase == "step 2 / forward / layer 1"        # the teacher's second layer
    assert_within(est, traced.peak_allocated_bytes, 0.03)
