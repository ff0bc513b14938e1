"""The trace's fp32 layer_norm under autocast (hpcmem.trace.kernels_autocast `layer_norm_fp32`, CUDA autocast's fp32
cast policy for layer_norm) runs for a vision-language job and for a job on a learned profile of a vision-language
type's text part (provenance "layer_norm_fp32": its cells were traced with it), not for a text-only job elsewhere."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _layer_norm_dtype(job) -> torch.dtype:
    import torch.nn.functional as F

    from hpcmem.trace.kernels_autocast import layer_norm_fp32

    x = torch.ones(3, 8, dtype=torch.bfloat16)
    with layer_norm_fp32([], job), torch.autocast("cpu", dtype=torch.bfloat16):
        return F.layer_norm(x, (8,)).dtype


def test_a_learned_image_text_part_runs_layer_norm_in_fp32():
    from hpcmem.job.jobspec import JobSpec
    from hpcmem.job.spec import TrainSpec
    from hpcmem.models.profile import load_profile, spec_from_profile

    profile = load_profile(ROOT / "hpcmem/profiles/persimmon-485d1bd432d14546.json")
    spec = spec_from_profile(profile, "persimmon")
    assert spec.vision is None
    flagged = JobSpec(model=spec, train=TrainSpec(trainer="sft", bf16=True))
    assert _layer_norm_dtype(flagged) == torch.float32
    plain = replace(profile, provenance={k: v for k, v in profile.provenance.items() if k != "layer_norm_fp32"})
    unflagged = JobSpec(model=replace(spec, learned=plain), train=TrainSpec(trainer="sft", bf16=True))
    assert _layer_norm_dtype(unflagged) == torch.bfloat16      # CPU autocast's own: 16 bits
