"""A learned type transformers will not checkpoint (CPM-Ant, CTRL, GPT-NeoX-Japanese, JetMoE, OpenAI GPT) has no
checkpointed cell whose forward peak is a no-grad pass's layer instant (hpcmem.estimate.learned `no_grad_layer_peak`),
so its profile traces the no-grad pass itself — a DPO reference pass of the reduced model, its layers' instants and
what the pass holds before its first layer (hpcmem/trace/learn.py `no_grad_sample`). Without them a reference pass
took the gated-MLP formulas' instant and no model-level tensor.

Known answer: the trace of random job s3-27 (cpmant, learned; KTO, LoRA r 119 on all linears without checkpointing,
4 × 1,925 tokens; its job stored in tests/fixtures/random/), whose peak is the reference forward's layer 1: two bf16
[4, 32, 1925, 1925] score tensors in the layer, and the model-level position bias of that size alive through the pass
(modeling_cpmant.py). The estimate read −10.8 % with the formulas' instant."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("trl")

from hpcmem.models.profile import profile_from_dict, profile_from_record, profile_to_dict  # noqa: E402
from hpcmem.validate.oracle_data import scored_as_traced  # noqa: E402
from tests.helpers.trace_helpers import (  # noqa: E402
    ROOT,
    assert_within,
    estimated_peak,
    stored_random_job,
    traced_and_estimated,
)

pytestmark = pytest.mark.torch


def test_a_reference_pass_without_a_checkpointed_cell_is_within_3_pct_of_its_trace():
    spec = stored_random_job("s3-27-cpmant-kto-no-grad-pass.json")
    p = spec.model.learned
    assert p.cell("w2a2", "full", True) is None and p.no_grad and p.no_grad_entry is not None
    traced, _, _ = traced_and_estimated(spec)
    assert "reference forward / layer" in traced.phase, traced.phase
    _, peak = estimated_peak(scored_as_traced(spec))     # the KTO rows' scored tokens, as the random oracle gives them
    assert_within(peak, traced.peak_allocated_bytes, 0.03)


def test_the_no_grad_terms_survive_the_profile_file_and_a_record():
    """profile_to_dict → profile_from_dict, and a record's `dataclasses.asdict` form (profile_from_record), keep the
    terms; the layer instant grows by rows·seq² as the scores do: 2 bf16 score tensors of 32 heads and a bool mask,
    129 bytes per row·seq² (by hand)."""
    doc = json.loads((ROOT / "estimator" / "coverage-profiles" / "cpmant.json").read_text())
    p = profile_from_dict(doc)
    again = profile_from_dict(profile_to_dict(p))
    assert again.no_grad == p.no_grad and again.no_grad_entry == p.no_grad_entry
    from_record = profile_from_record(json.loads(json.dumps(dataclasses.asdict(p))))
    assert from_record.no_grad == p.no_grad and from_record.no_grad_entry == p.no_grad_entry
    assert max(piece.c for piece in p.no_grad[1].pieces) == pytest.approx(2 * 32 * 2 + 1, abs=1)
