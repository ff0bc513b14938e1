"""The image-text coverage summary: resolutions by hand, the held rule, the shipped summary fresh against the stored
image traces, and `hpcmem models coverage` showing it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.job.images import image_geometry
from hpcmem.models.coverage import SHIPPED_VLM_SUMMARY
from hpcmem.validate.cases import case_job
from hpcmem.validate.coverage_vlm import case_rows, fixed, summary


def _job(config: str, h: int, w: int):
    return case_job({"id": "x", "trainer": "sft", "model_name_or_path": config, "dtype": "bfloat16", "bf16": True,
                     "max_length": 4096, "images_per_example": 1, "image_height": h, "image_width": w})


def test_a_resolution_is_what_the_processor_makes_of_an_image():
    """Qwen2.5-VL, by hand: 224 × 224 px is 16 × 16 patches of 14 px (256) and a 2 × 2 merge makes 64 tokens; its
    processor keeps sizes (a multiple of 28), so a larger image is another resolution. LLaVA-1.5's processor resizes
    every image to CLIP's 336 px: 24 × 24 = 576 patches and tokens, whatever the size."""
    qwen = _job("tests/fixtures/vlm/qwen2_5_vl-7b-width-L1-D4.json", 224, 224)
    g = image_geometry(qwen.train, qwen.model.vision)
    assert (g.patches, g.tokens) == (256, 64)
    assert not fixed(qwen)
    llava = _job("tests/fixtures/vlm/llava-1.5-7b-width-L1-D4.json", 480, 640)
    g = image_geometry(llava.train, llava.model.vision)
    assert (g.patches, g.tokens) == (576, 576) and fixed(llava)


def _row(t: str, res: tuple[int, int], err: float, is_fixed: bool = False) -> dict:
    return {"model_type": t, "case": "c", "file": "f", "trainer": "sft", "technique": "full+gc",
            "resolution": list(res), "fixed": is_fixed, "err_pct": err}


def test_held_needs_every_case_within_3_percent_at_two_resolutions():
    s = summary([_row("a", (256, 64), 2.9), _row("a", (1024, 256), -1.0),
                 _row("b", (576, 576), 1.0, True), _row("b", (576, 576), -2.0, True),
                 _row("c", (256, 64), 0.1), _row("c", (1024, 256), -3.01),
                 _row("d", (256, 64), 0.5)])
    assert s["a"]["held"] and not s["a"]["held_fixed"] and s["a"]["max_abs_err_pct"] == 2.9
    assert not s["b"]["held"] and s["b"]["held_fixed"]            # one resolution, the only one its processor makes
    assert not s["c"]["held"] and not s["c"]["held_fixed"]        # a case beyond 3 %
    assert not s["d"]["held"] and not s["d"]["held_fixed"]        # one resolution traced, the processor makes others


def test_the_trainable_share_is_bounded_by_what_the_real_trainer_showed():
    """Seven image-text types, by hand: a and b estimated with images (a held at two resolutions, b not); pi0, which
    TRL cannot train (out of the denominator); f, on which TRL's trainer ran with text rows (trainable); g, on which
    it raised needing images, and c, never tried (both unknown); d not applicable. TRL can train between 3 (a, b, f)
    and 5 (a, b, c, f, g) of them, so the held share lies between 1 of 5 (20 %) and 1 of 3 (33.3 %)."""
    from hpcmem.validate.coverage_vlm import report_markdown

    measured = summary([_row("a", (256, 64), 1.0), _row("a", (1024, 256), -1.0), _row("b", (256, 64), 5.0)])
    rows = [{"model_type": t, "status": st, "reason": ""} for t, st in
            (("a", "derived"), ("b", "derived"), ("pi0", "refused"), ("f", "refused"), ("g", "refused"),
             ("c", "refused"), ("d", "not applicable"))]
    runs = [{"model_type": "f", "trainer": "sft", "ran": True, "built": True},
            {"model_type": "g", "trainer": "sft", "ran": False, "built": True, "reason": "needs pixel_values"},
            {"model_type": "f", "trainer": "dpo", "ran": False, "built": True}]       # another trainer: not read
    text = report_markdown(measured, rows, runs)
    assert "1 applicable types it cannot (pi0" in text
    assert "lies between 20 % (every unknown trainable: 1 of 5) and 33.3 % (only those shown: 1 of 3)" in text
    assert "a tiny model of 1 (f:" in text and "raised on 1 where text rows do not decide" in text
    assert "1 were not tried (c)" in text


@pytest.fixture(scope="module")
def fresh() -> dict:
    return json.loads(json.dumps(summary(case_rows())))


def test_the_shipped_summary_is_the_stored_traces_rescored_now(fresh):
    """A change to the estimate or to the traces that moves an image type's error must rewrite the shipped summary
    (`hpcmem validate coverage --rescore`), or `hpcmem models coverage` would show a stale number."""
    shipped = json.loads(SHIPPED_VLM_SUMMARY.read_text())
    assert set(shipped) == set(fresh)
    for t, m in fresh.items():
        assert shipped[t]["max_abs_err_pct"] == pytest.approx(m["max_abs_err_pct"], abs=0.01), t
        assert (shipped[t]["held"], shipped[t]["resolutions"]) == (m["held"], m["resolutions"]), t
    assert sum(m["held"] for m in fresh.values()) >= 20


def test_models_coverage_shows_the_image_types_measured(fresh):
    out = CliRunner().invoke(cli, ["models", "coverage", "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    rows = {r["model_type"]: r for r in json.loads(out.output) if r["task"] == "image-text-to-text"}
    assert rows["qwen2_5_vl"]["status"] == "derived" and rows["qwen2_5_vl"]["measured"]["held"]
    assert rows["perception_lm"]["measured"] is None              # refused: nothing traced
    derived = [t for t, r in rows.items() if r["status"] == "derived"]
    assert all(rows[t]["measured"] for t in derived) and set(derived) == set(fresh)
    text = CliRunner().invoke(cli, ["models", "coverage"], catch_exceptions=False).output
    assert "image-text-to-text with images:" in text and "held within 3 %" in text


@pytest.mark.parametrize("args, says", [
    (["--trainable", "--types", "llama"], "--types llama: not an image-text-to-text type"),
    (["--trainable", "--rescore"], "--trainable: alone"),
    (["--trainable", "--types", ",,"], "--types: names no model type"),
    (["--trainable", "--types", ",".join(f"x{i}" for i in range(50))], "x9 and 40 more: not an image-text-to-text"),
])
def test_the_trainer_sweep_refuses_what_it_cannot_run_in_one_line(args, says, capsys):
    """A causal-LM type (or a typo) and a flag of the other modes are refused before anything runs or is written."""
    from hpcmem.cli import run

    assert run(["validate", "coverage", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
