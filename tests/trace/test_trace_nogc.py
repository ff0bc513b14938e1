"""Without gradient checkpointing every layer's saved tensors are alive at the LM head's backward, which then holds
the step's peak: the `--kernels cpu` trace against a REAL two-step SFTTrainer run on the CPU for the probe types
(Llama, Qwen3 with its per-head q/k norms, OLMo-2 with its whole-projection q/k norms, a Qwen3-MoE), bf16 autocast
over fp32 weights and plain fp32, at the lengths of the no-checkpointing report (1 × 1,024 and 2 × 512 tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.job.jobspec import JobSpec  # noqa: E402
from hpcmem.job.spec import TrainSpec  # noqa: E402
from hpcmem.models.config import model_spec_from_config  # noqa: E402
from tests.helpers.trace_helpers import trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-configs.json"
TYPES = ("llama", "qwen3", "olmo2", "qwen3_moe")
SHAPES = {"bf16-1x1024": (True, 1, 1024), "fp32-2x512": (False, 2, 512)}


def nogc_job(model_type: str, bf16: bool, rows: int, length: int, folder: Path) -> JobSpec:
    cfg = dict(json.loads(FIXTURES.read_text())[model_type], num_hidden_layers=2)
    path = folder / f"{model_type}.json"
    path.write_text(json.dumps(cfg))
    return JobSpec(model=model_spec_from_config(cfg, str(path)),
                   train=TrainSpec(trainer="sft", gradient_checkpointing=False, bf16=bf16, max_length=length,
                                   per_device_train_batch_size=rows))


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("model_type", TYPES)
def test_trace_without_checkpointing_matches_a_real_cpu_run(model_type, shape, tmp_path):
    real, traced = trace_matches_cpu(nogc_job(model_type, *SHAPES[shape], tmp_path), f"{model_type} {shape}")
    assert traced.peak_allocated_bytes == real.peak_allocated_bytes     # measured: equal to the byte
