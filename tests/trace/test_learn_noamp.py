"""The learner's cells without autocast (hpcmem.trace.learn: NOAMP_OF variants of the full, LoRA and LoRA-without-
dropout cells): their traced jobs run TRL's SFT with bf16 and fp16 off on 16-bit weights, only there, and a stored
profile without them is offered them by `--add-missing` (`missing_cells`)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers.sweep_profiles import sweep_profile, sweep_spec

pytestmark = pytest.mark.torch


def test_noamp_jobs_turn_autocast_off_on_16_bit_weights_only() -> None:
    from hpcmem.job.shape import precision
    from hpcmem.trace.learn import learn_job, traced_in

    _, spec = sweep_spec("stablelm")
    full = learn_job(spec, "bfloat16", "full-noamp", True, 512)
    lora = learn_job(spec, "bfloat16", "lora-noamp", False, 512)
    plain = learn_job(spec, "bfloat16", "lora", False, 512)
    assert (full.train.bf16, full.train.fp16, full.train.use_peft) == (False, False, False)
    assert not precision(full).amp and precision(full).weight == 2
    # the LoRA variant adapts what the plain LoRA cell adapts, at the same rank and dropout; only autocast differs
    assert (lora.train.bf16, lora.train.use_peft) == (False, True)
    assert dataclasses.replace(lora.train, bf16=True) == plain.train
    # the no-dropout LoRA variant: the no-dropout cell's job (lora_dropout 0), only autocast off
    nodrop_noamp = learn_job(spec, "bfloat16", "lora-nodrop-noamp", True, 512)
    nodrop = learn_job(spec, "bfloat16", "lora-nodrop", True, 512)
    assert (nodrop_noamp.train.bf16, nodrop_noamp.train.fp16, nodrop_noamp.train.lora_dropout) == (False, False, 0.0)
    assert dataclasses.replace(nodrop_noamp.train, bf16=True) == nodrop.train
    # fp32 weights without autocast compute in fp32: no such cell
    assert traced_in("bfloat16", "full-noamp") and not traced_in("float32", "lora-noamp")
    assert traced_in("float32", "full")


def test_a_profile_without_them_is_offered_them_beside_its_full_and_lora_cells() -> None:
    from hpcmem.trace.learn import missing_cells

    p = sweep_profile("stablelm")
    bare = dataclasses.replace(p, cells={k: c for k, c in p.cells.items() if "noamp" not in k})
    got = [c for c in missing_cells(bare) if "noamp" in c[0]]
    # stablelm has full (gc, no gc), LoRA (gc) and LoRA-without-dropout (gc) cells: their four variants, nothing else
    assert got == [("full-noamp", True), ("full-noamp", False), ("lora-noamp", True), ("lora-nodrop-noamp", True)]
    assert not [c for c in missing_cells(p) if "noamp" in c[0]]
    # a profile held in fp32 weights only (w4a2) has no 16-bit cell to vary
    fp32 = dataclasses.replace(bare, provenance={**bare.provenance, "held": {**bare.held, "precisions": ["w4a2"]}})
    assert not [t for t, _ in missing_cells(fp32) if "noamp" in t]
