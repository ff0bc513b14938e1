"""A sparse-attention indexer runs under torch.no_grad (modeling_deepseek_v32.py `DeepseekV32Indexer.forward`,
modeling_glm_moe_dsa.py `GlmMoeDsaIndexer.forward`, and the attention calls it inside `with torch.no_grad()`), so its
parameters end a training step without a gradient: the trace's `idle_in_layers` (what `hpcmem models learn` records
as `LayerKind.idle`) names exactly the parameters of the meta model's indexer modules, layer by layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]      # four tiny-model traces, ~45 s
pytest.importorskip("transformers")

from hpcmem.models.profile import spec_from_profile  # noqa: E402
from hpcmem.trace import run_trace  # noqa: E402
from hpcmem.trace.layer_map import build_meta, decoder_layers  # noqa: E402
from hpcmem.trace.learn import learn_job, learning_probe  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-configs.json"


def _indexer_params(cfg: dict) -> list[dict[str, int]]:
    """Per decoder layer of the meta model: the parameters inside a module whose class is an indexer (name inside
    the layer → elements)."""
    out = []
    for layer in decoder_layers(build_meta(cfg)):
        inside = {}
        for path, module in layer.named_modules():
            if type(module).__name__.endswith("Indexer"):
                inside |= {f"{path}.{n}": p.numel() for n, p in module.named_parameters()}
        out.append(inside)
    return out


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("technique", ["full", "lora"])
def test_the_trace_finds_the_indexer_without_a_gradient(model_type, technique):
    cfg = json.loads(FIXTURES.read_text())[model_type]
    probe = learning_probe(cfg, ((technique, True),))[0]
    spec = spec_from_profile(probe, probe.model_type)
    traced = run_trace(learn_job(spec, "bfloat16", technique, True, 64), steps=1).idle_in_layers
    expected = _indexer_params(probe.config)
    assert any(expected) and len(traced) == len(expected)
    if technique == "full":
        assert [{n: v[0] for n, v in layer.items()} for layer in traced] == expected
    else:
        # peft's adapters on the indexer's linears (all-linear reaches them) sit in the same graphless forward
        linears = [{n.rsplit(".", 1)[0] for n in layer} for layer in expected]
        assert [{n.split(".lora_", 1)[0] for n in layer} for layer in traced] == \
            [{x for x in names if x.rsplit(".", 1)[-1] in ("wq_b", "wk", "weights_proj")} for names in linears]
