"""The trace hands the job's router_aux_loss_coef to every TRL config that has the field (trl/trainer/{sft,dpo,kto,
grpo,rloo}_config.py). Left out, TRL takes the model config's coefficient (kto_trainer.py: `router_aux_loss_coef`
None → `text_config.router_aux_loss_coef`) and runs the MoE auxiliary loss a user turned off with 0 — which raises on
GraniteMoe (no `num_experts` in its config) and Doge in trl/trainer/utils.py's fused forward, so the random jobs
s1-5, s1-335, s1-356 (GraniteMoe), s1-484, s1-525 (Doge) read as refusals of the real code."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from hpcmem.job.jobspec import JobSpec  # noqa: E402
from hpcmem.job.spec import TrainSpec  # noqa: E402
from hpcmem.job.trainers import entry  # noqa: E402
from hpcmem.trace.trainer import common_args  # noqa: E402
from tests.helpers.trace_helpers import TINY_LLAMA  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.parametrize("trainer", ["sft", "dpo", "kto", "grpo", "rloo", "reward"])
def test_the_trl_config_gets_the_jobs_coefficient(trainer: str) -> None:
    import trl

    e = entry(trainer)
    settings = {"router_aux_loss_coef": 0.0} if e.declares("router_aux_loss_coef") else {}
    if e.generates:
        settings["num_generations"] = 2
    job = JobSpec(model=TINY_LLAMA, train=TrainSpec(trainer=trainer, per_device_train_batch_size=2, **settings))
    args = common_args(job)
    for key in ("max_length", "activation_offloading"):
        if key not in getattr(trl, e.config_class).__dataclass_fields__:
            args.pop(key)
    if e.generates:
        args["num_generations"] = 2                         # as hpcmem.trace.rl build_rl passes it
    config = getattr(trl, e.config_class)(**args)            # TRL's own config class takes every field given
    has_field = "router_aux_loss_coef" in type(config).__dataclass_fields__
    assert has_field == e.declares("router_aux_loss_coef")
    if has_field:
        assert config.router_aux_loss_coef == 0.0


def test_distillations_config_has_no_such_field() -> None:
    """common_args gives DistillationConfig none (it has no router_aux_loss_coef; hpcmem's registry agrees)."""
    import trl

    assert "router_aux_loss_coef" not in trl.DistillationConfig.__dataclass_fields__
    assert not entry("distillation").declares("router_aux_loss_coef")
