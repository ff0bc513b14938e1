"""`hpcmem models learn` traces for about a minute: every input it cannot learn from, and every file it would write
over, is refused in one line before the first trace (each case here takes well under a second)."""

import json
import time
from pathlib import Path

from hpcmem.cli import run
from tests.cli.test_cli_hostile import _refused

# a type no family descriptor covers (tests/trace/test_learn_torch.py learns it for real)
TINY_OLMO3 = {"model_type": "olmo3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 4096, "sliding_window": 16,
              "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3
              + ["full_attention"]}
SHIPPED = Path(__file__).resolve().parents[2] / "hpcmem" / "profiles"


def _config(folder, cfg=TINY_OLMO3):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _fast_refusal(capsys, argv, *words):
    start = time.monotonic()
    _refused(capsys, ["models", "learn", *argv], *words)
    assert time.monotonic() - start < 10, argv       # a trace takes ~a minute; a refusal, no trace


def test_inputs_no_trace_can_learn_from_are_refused_before_tracing(tmp_path, capsys):
    out = ["--out", str(tmp_path / "data")]
    _fast_refusal(capsys, [str(tmp_path / "missing"), *out], "missing", "not a config.json")
    _fast_refusal(capsys, [str(_config(tmp_path / "unknown", {"model_type": "zzz_not_a_type"})), *out],
                  "'zzz_not_a_type'", "not a causal-LM type")
    # a name with a line break: refused as `hpcmem estimate` refuses model_name_or_path (it was learned, under a name
    # printed over two lines)
    _fast_refusal(capsys, ["Qwen/Qwen2.5-0.5B\n", *out], "model", "control characters")
    _fast_refusal(capsys, [str(_config(tmp_path / "a\nb")), *out], "model", "control characters")
    # a type a family descriptor derives: the estimate never reads a learned profile for it (it was learned anyway)
    _fast_refusal(capsys, ["Qwen/Qwen2.5-0.5B", *out], "'qwen2'", "family descriptor", "nothing to learn")
    # a vocabulary of two billion: in range for a count, but each trace walks the fused LM head's 32,768-column tiles
    # (61,036 per tile of tokens): the learning ran past a minute without finishing its first trace
    huge = {**TINY_OLMO3, "vocab_size": 2_000_000_000}
    _fast_refusal(capsys, [str(_config(tmp_path / "huge-vocab", huge)), *out], "vocab_size", "at most 1,048,576",
                  "2,000,000,000")
    # a million heads over a 64-wide model: head_dim = 64 // 10**6 = 0, which transformers' attention divides by
    # (`head_dim ** -0.5`, an internal error before)
    heads = {**TINY_OLMO3, "num_attention_heads": 10**6, "num_key_value_heads": 10**6}
    _fast_refusal(capsys, [str(_config(tmp_path / "heads", heads)), *out], "num_attention_heads",
                  "at most hidden_size (64)", "1000000")
    # key/value heads that do not divide the heads: transformers' repeat_kv fails in every trace (a minute of cells
    # that all failed before the refusal)
    _fast_refusal(capsys, [str(_config(tmp_path / "kv", {**TINY_OLMO3, "num_key_value_heads": 3})), *out],
                  "num_attention_heads 4 is not a multiple of num_key_value_heads 3")
    # a pad_token_id past the vocabulary, named or the config class's default (SmolLM3Config's 128004 over 1,000
    # rows): torch's nn.Embedding(padding_idx=...) asserts as the model is built (an internal error before)
    named = {**TINY_OLMO3, "pad_token_id": 512}
    _fast_refusal(capsys, [str(_config(tmp_path / "pad", named)), *out], "pad_token_id", "below vocab_size (512)",
                  "512")
    smollm3 = {"model_type": "smollm3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}
    assert not (tmp_path / "data").exists()
    # (the class default needs transformers' config class: after the progress line and the write check of --out, an
    # error line of its own, and no profile)
    capsys.readouterr()
    start = time.monotonic()
    assert run(["models", "learn", str(_config(tmp_path / "pad-default", smollm3)), *out]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    # between them, transformers' own warnings about the config's special ids (whose logging handler may still hold an
    # earlier test's stream)
    assert lines[0].startswith("learn: ") and lines[-1].startswith("hpcmem: error: ")
    assert all(w in lines[-1] for w in ("pad_token_id 128004", "SmolLM3Config's default", "below vocab_size 1,000"))
    assert time.monotonic() - start < 10
    assert not list((tmp_path / "data").rglob("*.json"))


def test_learn_never_writes_over_what_it_did_not_learn_for_this_config(tmp_path, capsys):
    from hpcmem.models.profile import config_hash, profile_filename

    model = _config(tmp_path / "olmo3")
    profiles = tmp_path / "data" / "profiles"
    target = profiles / profile_filename("olmo3", config_hash(TINY_OLMO3))
    out = ["--out", str(tmp_path / "data")]

    target.mkdir(parents=True)
    _fast_refusal(capsys, [str(model), *out], str(target), "not a regular file")
    target.rmdir()

    target.write_text('{"mine": "a file of my own"}')
    for force in ([], ["--force"]):
        _fast_refusal(capsys, [str(model), *out, *force], str(target), "not a profile hpcmem learned for this config")
    assert target.read_text() == '{"mine": "a file of my own"}'

    # a shipped profile of another config under this config's file name: not this config's either
    other = json.loads(next(SHIPPED.glob("*.json")).read_text())
    target.write_text(json.dumps(other))
    _fast_refusal(capsys, [str(model), *out, "--force"], "not a profile hpcmem learned for this config")

    # this config's profile, learned before: replaced only with --force
    target.write_text(json.dumps({**other, "model_type": "olmo3", "config_sha256": config_hash(TINY_OLMO3)}))
    _fast_refusal(capsys, [str(model), *out], str(target), "already holds", "--force")


def test_an_out_folder_that_cannot_take_the_profile_is_refused_before_tracing(tmp_path, capsys):
    model = _config(tmp_path / "olmo3")
    afile = tmp_path / "afile"
    afile.write_text("x")
    _fast_refusal(capsys, [str(model), "--out", str(afile / "sub")], "cannot write the profile", str(afile))
    _fast_refusal(capsys, [str(model), "--out", str(afile)], "--out", "is a file")
    assert afile.read_text() == "x"


class _FirstLine(Exception):
    pass


def test_learn_says_a_line_before_torch_and_the_meta_model_load():
    """torch, transformers and the meta model take 10-20 s before the first trace; the user sees a line before them
    (the first progress call comes before anything is built: a config no code can build still gets it first)."""
    from hpcmem.trace.learn import learn

    said: list[str] = []

    def first(message):
        said.append(message)
        raise _FirstLine

    try:
        learn({"model_type": "zzz_not_a_type"}, "my-model", progress=first)
    except _FirstLine:
        pass
    assert said and "my-model" in said[0] and "torch" in said[0], said


def test_a_config_transformers_cannot_build_is_one_line(tmp_path, capsys):
    """Cohere Compass's text config with no rope_parameters entry per layer type: CohereCompassRotaryEmbedding raises
    KeyError('full_attention') as transformers builds the model (a real run would too); `models learn` says so in one
    line after its progress line (an internal error before), and writes no profile."""
    cfg = {"model_type": "cohere_compass", "vision_config": {"depth": 2, "deepstack_visual_indexes": [1]},
           "text_config": {"model_type": "cohere_compass_text", "num_hidden_layers": 2, "hidden_size": 256,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                           "intermediate_size": 512, "vocab_size": 1000}}
    capsys.readouterr()
    assert run(["models", "learn", str(_config(tmp_path / "compass", cfg)), "--out", str(tmp_path / "data")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    # (between them transformers' own warnings, whose logging handler may still hold an earlier test's stream)
    assert lines[0].startswith("learn: ") and lines[-1].startswith("hpcmem: error: ")
    assert "transformers cannot build 'cohere_compass_text'" in lines[-1] and "KeyError: 'full_attention'" in lines[-1]
    assert not list((tmp_path / "data").rglob("*.json"))


def test_a_field_transformers_strict_config_rejects_is_one_line(tmp_path, capsys):
    """rms_norm_eps "x": transformers' strict config class raises as it builds the config (an internal error before);
    one line naming the field, fast, nothing written."""
    start = time.monotonic()
    capsys.readouterr()
    assert run(["models", "learn", str(_config(tmp_path / "eps", {**TINY_OLMO3, "rms_norm_eps": "x"})),
                "--out", str(tmp_path / "data")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hpcmem: error: ") and "transformers cannot build 'olmo3'" in last
    assert "rms_norm_eps" in last and "expected float" in last
    assert time.monotonic() - start < 10
    assert not list((tmp_path / "data").rglob("*.json"))


def test_add_missing_refuses_in_one_line_and_leaves_a_complete_profile_untouched(tmp_path, capsys):
    """`--add-missing` builds on the profile learned for this config: with none there, with a file that is not it, or
    with --force / --dtype beside it, one line before any trace; a profile with its variant cells is left byte for
    byte (no torch needed)."""
    from hpcmem.models.profile import config_hash, profile_filename

    out = ["--out", str(tmp_path / "data")]
    model = _config(tmp_path / "olmo3")
    _fast_refusal(capsys, [str(model), *out, "--add-missing"], "--add-missing", "no profile learned for this config",
                  "learn it first")
    _fast_refusal(capsys, [str(model), *out, "--add-missing", "--force"], "--add-missing", "--force")
    _fast_refusal(capsys, [str(model), *out, "--add-missing", "--dtype", "bfloat16"], "--add-missing", "--dtype")
    _fast_refusal(capsys, [str(model), *out, "--hold-longer", "65536"], "--hold-longer",
                  "no profile learned for this config")
    _fast_refusal(capsys, [str(model), *out, "--hold-longer", "65536", "--add-missing"], "--hold-longer",
                  "--add-missing")
    _fast_refusal(capsys, [str(model), *out, "--hold-longer", "64k"], "--hold-longer", "'64k'")
    target = tmp_path / "data" / "profiles" / profile_filename("olmo3", config_hash(TINY_OLMO3))
    target.parent.mkdir(parents=True)
    target.write_text('{"mine": "a file of my own"}')
    _fast_refusal(capsys, [str(model), *out, "--add-missing"], str(target))
    assert target.read_text() == '{"mine": "a file of my own"}'

    # a shipped profile with every variant cell (without dropout, reentrant, without autocast, DoRA without dropout
    # and reentrant; it holds no dropout modules), under its own config: nothing to add, nothing written
    shipped = next(p for p in sorted(SHIPPED.glob("*.json"))
                   if all(w in p.read_text() for w in ('"w2a2/lora-nodrop/gc"', '"w2a2/lora-nodrop-reentrant/gc"',
                                                       '"w2a2/lora-noamp/gc"', '"w2a2/dora-nodrop/gc"'))
                   and not json.loads(p.read_text())["provenance"].get("dropout"))
    doc = json.loads(shipped.read_text())
    # the variants learned after the shipped profiles (the no-dropout LoRA cell without autocast, DoRA's reentrant
    # ones), here copies of the cells they vary: the CLI reads which cells a profile has, not their terms
    cells = doc["cells"]
    for variant, of in (("lora-nodrop-noamp", "lora-noamp"), ("dora-reentrant", "dora"),
                        ("dora-nodrop-reentrant", "dora-nodrop")):
        for key in [k for k in cells if k.split("/")[1] == of]:
            cells.setdefault(key.replace(f"/{of}/", f"/{variant}/"), cells[key])
    mine = tmp_path / "data" / "profiles" / shipped.name
    mine.write_text(json.dumps(doc))
    complete, before = mine.read_bytes(), mine.stat().st_mtime_ns
    capsys.readouterr()
    assert run(["models", "learn", str(_config(tmp_path / "shipped", doc["config"])), *out, "--add-missing",
                "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["added"] == []
    assert mine.read_bytes() == complete and mine.stat().st_mtime_ns == before
