"""The trace for the online RL trainers: GRPO and RLOO's training step (TRL's scoring pass, compute_loss, backward,
optimizer step; generation replaced by fixed full-length completions, see hpcmem.trace.rl) counts on fake tensors
the same peak as a REAL two-step run of the same trainer on the CPU (tiny model, same StorageTracker, same
patches). Cases files build as jobs the trace accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.errors import SpecError  # noqa: E402
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.validate.cases import case_job
from tests.helpers.trace_helpers import TINY_LLAMA, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

CASES_DIR = Path(__file__).resolve().parents[2] / "estimator" / "cases"


def tiny_job(trainer: str, **train) -> JobSpec:
    model = TINY_LLAMA
    settings = {"per_device_train_batch_size": 4, "num_generations": 2, "max_prompt_length": 16,
                "max_completion_length": 24, **train}
    return JobSpec(model=model, train=TrainSpec(trainer=trainer, **settings))


CASES = {
    "grpo-no-ref": ("grpo", {}),
    "grpo-ref-model": ("grpo", {"beta": 0.04}),
    "grpo-lora-ref-adapters-off": ("grpo", {"beta": 0.04, "use_peft": True, "lora_r": 8}),
    "grpo-gc-off": ("grpo", {"gradient_checkpointing": False}),
    "grpo-accumulation-2": ("grpo", {"gradient_accumulation_steps": 2, "per_device_train_batch_size": 2}),
    "rloo-ref-model": ("rloo", {"beta": 0.05}),
    "rloo-lora": ("rloo", {"beta": 0.05, "use_peft": True, "lora_r": 8, "gradient_checkpointing": False}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trace_matches_a_real_cpu_run(case):
    trainer, settings = CASES[case]
    job = tiny_job(trainer, **dict(settings))
    real, traced = trace_matches_cpu(job, case)
    assert traced.batch["shape"] == [job.train.per_device_train_batch_size, 40]
    assert any("_generate_single_turn" in n for n in traced.reimplemented)


def test_reference_pass_is_in_the_scoring_phase_and_the_reference_is_counted():
    from hpcmem.trace import run_trace

    with_ref = run_trace(tiny_job("grpo", beta=0.04), kernels="cpu", timeline=True)
    assert any(p.phase.startswith("step 2 / scoring") for p in with_ref.timeline)
    no_ref = run_trace(tiny_job("grpo"), kernels="cpu")
    # the second model's weights (fp32 here) are the difference in parameters
    assert with_ref.components["param"] > no_ref.components["param"]
    assert any("reference model" in n for n in with_ref.reimplemented)


@pytest.mark.parametrize("settings, words", [
    ({"use_vllm": True}, "use_vllm"),
    ({"steps_per_generation": 4}, "steps_per_generation"),
    ({"activation_offloading": True}, "activation_offloading"),
])
def test_unsupported_settings_are_refused(settings, words):
    from hpcmem.trace import run_trace

    with pytest.raises(SpecError, match=words):
        run_trace(tiny_job("grpo", **settings), kernels="cpu")


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_case_files_build_and_are_traceable(name):
    from hpcmem.estimate import estimate
    from hpcmem.job.trl_config import read_yaml
    from hpcmem.trace.trainer import check_traceable

    data = read_yaml(CASES_DIR / f"{name}.yaml")
    ids = [c["id"] for c in data["cases"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 8
    assert 2 <= sum(bool(c.get("ci")) for c in data["cases"]) <= 3
    for case in data["cases"]:
        job = case_job(case)
        assert job.train.trainer == name
        assert not check_traceable(job), (case["id"], check_traceable(job))
        assert estimate(job).peak_allocated_bytes > 0


@pytest.mark.parametrize("trainer,settings", [
    ("grpo", {}),                                          # aligned: TRL skips the pass
    ("grpo", {"num_iterations": 2}),                       # μ = 2: samples reused by a newer policy
    ("grpo", {"gradient_accumulation_steps": 2, "per_device_train_batch_size": 2, "num_iterations": 2}),
    ("rloo", {"beta": 0.0}),                               # RLOO always scores old log-probs
])
def test_old_logprob_pass_is_counted_exactly_when_trl_runs_it(trainer, settings):
    """The answer comes from the real trainer: run two CPU steps and see whether the policy's no-grad log-prob pass
    ran while scoring (beta 0: no reference model, so every scoring call of the policy is that pass)."""
    import torch

    from hpcmem.estimate.trainers import computes_old_logps
    from hpcmem.trace.data import design_batch
    from hpcmem.trace.trainer import build_model, build_trainer

    job = tiny_job(trainer, **settings)
    trainer_obj = build_trainer(job, build_model(job), design_batch(job), fake=False)
    scoring_calls = []
    original = trainer_obj._get_per_token_logps_and_entropies

    def spy(*args, **kwargs):
        if not torch.is_grad_enabled():
            scoring_calls.append(1)
        return original(*args, **kwargs)

    trainer_obj._get_per_token_logps_and_entropies = spy
    trainer_obj.train()
    assert bool(scoring_calls) == computes_old_logps(job), (settings, len(scoring_calls))


@pytest.mark.parametrize("settings", [
    {"max_prompt_length": 512, "max_completion_length": 8, "use_peft": True, "lora_r": 8},    # the prefill peaks
    {"max_prompt_length": 16, "max_completion_length": 120, "use_peft": True, "lora_r": 8},   # the last token peaks
    {"max_prompt_length": 256, "max_completion_length": 64, "dtype": "bfloat16"},             # full, 16-bit weights
    # fp32 adapters on 16-bit weights outside autocast: peft's input casts, dropout and fp32 sums in the MLP
    {"max_prompt_length": 512, "max_completion_length": 8, "use_peft": True, "lora_r": 8, "dtype": "bfloat16",
     "lora_target_modules": ["all-linear"]},
    {"max_prompt_length": 512, "max_completion_length": 8, "use_peft": True, "lora_r": 8, "dtype": "bfloat16",
     "lora_target_modules": ["down_proj", "k_proj"]},
])
def test_generation_phase_matches_transformers_generate(settings):
    """HF generate (no vLLM), run as TRL calls it on fake tensors to full length: its peak in step 2 (after the
    optimizer states exist) against the estimator's two generation instants (prefill, last token)."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace

    job = tiny_job("grpo", **{"per_device_train_batch_size": 8, "num_generations": 4, **settings})
    traced = run_trace(job, kernels="cuda", timeline=True, generation=True)
    points = [p.current_bytes for p in traced.timeline
              if p.phase.startswith("step 2") and "generation" in p.phase]
    assert points, "no generation phase in the trace"
    est = max(tensor_bytes(p) for p in estimate(job).phases if p.name.startswith("generation"))
    assert abs(est - max(points)) / max(points) <= 0.03, (est, max(points))
