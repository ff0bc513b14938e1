"""Fuzzing of the input files a user can leave where hpcmem reads them, and of where it writes: learned profiles in the
user's profiles folder, safetensors headers of a local model, and picture paths. Same property as
tests/inputs/test_inputs_fuzz.py (exit 0 or 2 with a clean error, never the internal-error exit 70, never a hang),
plus: a file hpcmem did not write is never changed."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.inputs.test_inputs_fuzz import FUZZ, MODEL, NASTY, Budget, check, in_scratch_folder, yaml_values

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = next((ROOT / "hpcmem" / "profiles").glob("gpt_oss-37f8*.json"))
PROFILE = json.loads(SHIPPED.read_text())
CELL = sorted(PROFILE["cells"])[0]
PATHS = [["format"], ["model"], ["model", "hidden_size"], ["model", "embed"], ["model", "tie_word_embeddings"],
         ["kinds"], ["kinds", 0], ["kinds", 0, "params"], ["kinds", 0, "linears"], ["kinds", 0, "linears", 0],
         ["kinds", 0, "linears", 0, 1], ["layer_kinds"], ["layer_kinds", 0], ["layer_map", 0], ["cells"],
         ["cells", CELL], ["cells", CELL, "kept"], ["cells", CELL, "kept", 0], ["cells", CELL, "kept", 0, 1],
         ["cells", CELL, "peak", 0], ["cells", CELL, "head_other"], ["peft_default_targets"], ["config"],
         ["provenance"]]
numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70))
values = st.one_of(yaml_values, numbers, st.lists(numbers, max_size=4))
PROFILES_BUDGET = Budget("learned profiles", 6)


def _set(doc, path, value):
    node = doc
    for key in path[:-1]:
        if isinstance(node, dict) and key in node or isinstance(node, list) and isinstance(key, int) and \
                key < len(node):
            node = node[key]
        else:
            return doc
    last = path[-1]
    if isinstance(node, dict) or (isinstance(node, list) and isinstance(last, int) and last < len(node)):
        node[last] = value
    return doc


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=3))
def test_fuzz_learned_profiles(tmp_path_factory, edits):
    if PROFILES_BUDGET.spent():
        return
    doc = copy.deepcopy(PROFILE)
    for path, value in edits:
        _set(doc, path, value)
    data = tmp_path_factory.mktemp("data")
    (data / "profiles").mkdir()
    (data / "profiles" / SHIPPED.name).write_text(json.dumps(doc))
    import os

    old = os.environ.get("HPCMEM_DATA")
    os.environ["HPCMEM_DATA"] = str(data)
    try:
        check(PROFILES_BUDGET, ["estimate", "sft", "--model_name_or_path", "openai/gpt-oss-20b", "--gpu", "H200",
                                "--json"])
    finally:
        if old is None:
            del os.environ["HPCMEM_DATA"]
        else:
            os.environ["HPCMEM_DATA"] = old


HEADER_BUDGET = Budget("safetensors headers", 4)
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 100}
headers = st.one_of(st.binary(max_size=64), values.map(lambda v: json.dumps(v).encode()),
                    st.sampled_from([b'{"a":' * 3000 + b"1" + b"}" * 3000, b'{"w": {"dtype": "' + b"9" * 5000 + b'"}}',
                                     b'{"w": {"dtype": "BF16", "shape": [' + b"9" * 5000 + b"]}}"]))


@FUZZ
@given(header=headers, lie=st.integers(-8, 2**40), dtype=st.sampled_from([[], ["--dtype", "auto"]]))
def test_fuzz_safetensors_headers(tmp_path_factory, header, lie, dtype):
    if HEADER_BUDGET.spent():
        return
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    size = len(header) if lie < 0 else lie
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", size) + header)
    check(HEADER_BUDGET, ["estimate", "sft", "--model_name_or_path", str(folder), *dtype])


PLOT_BUDGET = Budget("picture paths", 4)


@FUZZ
@given(name=st.one_of(st.sampled_from(NASTY), st.text(max_size=12)).map(lambda s: s + ".png"),
       kind=st.sampled_from(["absent", "user file", "symlink", "folder", "fifo"]))
def test_fuzz_picture_paths_never_change_a_users_file(tmp_path_factory, name, kind):
    if PLOT_BUDGET.spent() or "\x00" in name or "/" in name:
        return
    import os

    folder = tmp_path_factory.mktemp("plot")
    target = folder / "dotfile"
    target.write_text("keep me\n")
    path = folder / name
    try:
        if kind == "user file":
            path.write_bytes(b"\x89PNG\r\n\x1a\nuser's own")
        elif kind == "symlink":
            path.symlink_to(target)
        elif kind == "folder":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
    except (OSError, ValueError):
        return
    before = path.read_bytes() if kind == "user file" else None
    check(PLOT_BUDGET, ["estimate", "sft", *MODEL, "--plot", str(path)])
    assert target.read_text() == "keep me\n"
    if before is not None:
        assert path.read_bytes() == before


@pytest.fixture(scope="module", autouse=True)
def _counts(tmp_path_factory):
    """Run from a scratch folder; print how many inputs each test tried (`pytest -s`)."""
    yield from in_scratch_folder(tmp_path_factory, (PROFILES_BUDGET, HEADER_BUDGET, PLOT_BUDGET))
