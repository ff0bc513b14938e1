"""FSDP's units in flight measured for real: 2 CPU ranks (gloo) run torch's FSDP1 and FSDP2 on a 4-layer tiny Llama
(tests/probe/fsdp_units_run.py), and the units holding all-gathered storage at each instant are held to the rule
hpcmem.estimate.fsdp_units states: the root always; one decoder unit in the forward, the recompute and the LM head's
backward; two through a layer's backward, except with LoRA leaves as their own units (FSDP1 + PEFT), where the
previous layer arrives only at the attention projections (q_proj)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("torch")
pytest.importorskip("peft")

SCRIPT = Path(__file__).with_name("fsdp_units_run.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _instants(layout: str) -> list[tuple[str, list[str]]]:
    env = {**os.environ, "FSDP_UNITS_LAYOUT": layout, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(_free_port()), str(SCRIPT)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("{"))
    return [(what, units) for what, units in json.loads(line)["instants"]]


def _layers(units: list[str]) -> int:
    return sum(1 for u in units if u.startswith("L"))


@pytest.mark.parametrize("layout", ["fsdp1-lora", "fsdp1-full", "fsdp2-lora", "fsdp2-full"])
def test_units_in_flight(layout: str) -> None:
    instants = _instants(layout)
    assert instants
    late = layout == "fsdp1-lora"
    for what, units in instants:
        assert "root" in units, (what, units)
        if what == "backward lm_head":
            assert _layers(units) == 1, (what, units)       # the last layer, prefetched
        elif what.startswith("forward"):
            # the forward's first pass holds one layer; the recompute of a layer whose backward has begun may hold
            # the next one, prefetched (counted in the backward)
            assert _layers(units) <= 2, (what, units)
        elif what.endswith("L0.self_attn.q_proj") or what.startswith("backward L0."):
            assert _layers(units) == 1, (what, units)       # nothing left to prefetch
        elif late and not what.endswith("q_proj"):
            assert _layers(units) == 1, (what, units)
        else:
            assert _layers(units) == 2, (what, units)
    first_forward = [u for w, u in instants if w.startswith("forward")][:3]
    assert all(_layers(u) == 1 for u in first_forward)
