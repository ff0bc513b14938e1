"""What an MoE layer's routed experts keep for backward, read from the real code: transformers' grouped-mm experts
(transformers/integrations/moe.py `grouped_mm_experts_forward`) on a tiny Qwen3-MoE block on the CPU, every tensor
autograd saves caught by torch's saved-tensors hooks, against the estimate's MoE term (hpcmem.estimate.activations
`layer_saved`) less its router part (T·E fp32 logits in and out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hpcmem.estimate.activations import layer_saved  # noqa: E402
from hpcmem.estimate.lora import lora_layout  # noqa: E402
from hpcmem.job.jobspec import JobSpec  # noqa: E402
from hpcmem.job.shape import MicroBatch, Precision  # noqa: E402
from hpcmem.job.spec import TrainSpec  # noqa: E402
from hpcmem.models.config import model_spec_from_config  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-configs.json"
ROWS, SEQ = 1, 40


def routed_saved_bytes(cfg: dict, experts_train: bool) -> int:
    """Bytes of the distinct storages autograd saves whose rows are the routed (token, expert) pairs, each [S, n>1]."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    config._experts_implementation = "grouped_mm"       # what from_pretrained / from_config set by default
    block = Qwen3MoeSparseMoeBlock(config)
    for p in block.experts.parameters():
        p.requires_grad_(experts_train)
    routed = ROWS * SEQ * cfg["num_experts_per_tok"]
    seen: dict[int, int] = {}

    def pack(t):
        if t.dim() == 2 and t.shape[0] == routed and t.shape[1] > 1 and t.is_floating_point():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(ROWS, SEQ, cfg["hidden_size"], requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return sum(seen.values())


@pytest.mark.parametrize("experts_train", [True, False])
def test_routed_experts_saved_tensors_match_the_real_code(experts_train, tmp_path):
    cfg = json.loads(FIXTURES.read_text())["qwen3_moe"]
    path = tmp_path / "qwen3_moe.json"
    path.write_text(json.dumps(cfg))
    spec = model_spec_from_config(cfg, str(path))
    # frozen experts: LoRA on the attention only (the hidden states entering the MoE block still need a gradient)
    train = TrainSpec(trainer="sft", dtype="float32", bf16=False) if experts_train else \
        TrainSpec(trainer="sft", dtype="float32", bf16=False, use_peft=True, lora_target_modules=("q_proj", "v_proj"))
    job = JobSpec(model=spec, train=train)
    mb = MicroBatch(rows=ROWS, seq=SEQ, label_tokens=ROWS * SEQ, padding_free=False, source="test")
    prec = Precision(weight=4, act=4, residual=4, autocast=False, amp=False)
    mlp = layer_saved(spec, mb, prec, attn="sdpa", layer=0, layer_params=0, lora=lora_layout(job))["mlp"]
    router = ROWS * SEQ * cfg["num_experts"] * 4 * 2
    assert mlp - router == routed_saved_bytes(cfg, experts_train)
