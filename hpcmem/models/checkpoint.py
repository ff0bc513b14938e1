"""The dtype `from_pretrained(dtype="auto")` loads a local checkpoint in when its config.json names none, read from
the safetensors header alone (no torch, no tensor data).

transformers 5.24 modeling_utils.py `_get_dtype`, when `config.dtype` is None: a sharded checkpoint whose index
`metadata` holds "dtype" loads in it; otherwise `load_state_dict(checkpoint_files[0], map_location="meta")` and
`get_state_dict_dtype` take the first floating-point tensor (float8/float4 skipped) in `safe_open(...).keys()` order
— the names sorted, not the header's order — else the first tensor's dtype, float32 for an empty file.
`_get_resolved_checkpoint_files` prefers model.safetensors to model.safetensors.index.json, and
utils/hub.py `get_checkpoint_shard_files` lists the shards as `sorted(set(weight_map.values()))`.

The safetensors format (huggingface/safetensors README, "Format"): 8 bytes, a little-endian u64 N, then N bytes of
UTF-8 JSON mapping each tensor name to {"dtype", "shape", "data_offsets"}, plus an optional "__metadata__"; the
reader refuses a header over 100,000,000 bytes (safetensors/src/tensor.rs MAX_HEADER_SIZE).
"""

from __future__ import annotations

import struct
from pathlib import Path

from hpcmem.errors import SpecError
from hpcmem.inputs.files import load_json, load_json_file, open_regular

MAX_HEADER = 100_000_000
# transformers 5.24 modeling_utils.py `str_to_torch_dtype`: the safetensors dtypes it loads, as torch names; any other
# stops load_state_dict ("Cannot load safetensors of unknown dtype")
TORCH_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
               "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "F64": "float64",
               "I64": "int64", "U64": "uint64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_FLOATS = ("float16", "bfloat16", "float32", "float64")     # is_floating_point, float8 excluded by _get_dtype


def checkpoint_load_dtype(folder: Path) -> tuple[str | None, str]:
    """(dtype, where it was read) for a local model folder, or (None, why it was not) when the folder holds no
    safetensors checkpoint or its header cannot be read (transformers would then fail or torch.load a .bin)."""
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    try:
        if single.exists():         # a FIFO or a folder there is refused by read_header, not skipped
            return _first_dtype(single), "model.safetensors"
        if index.is_file():
            doc = load_json_file(index, "checkpoint index")
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            if isinstance(meta, dict) and isinstance(meta.get("dtype"), str):
                return meta["dtype"], "model.safetensors.index.json's metadata"
            weights = doc.get("weight_map") if isinstance(doc, dict) else None
            shards = sorted({v for v in weights.values() if isinstance(v, str)}) if isinstance(weights, dict) else []
            if not shards:
                return None, "model.safetensors.index.json lists no shard"
            if any(ch < " " or ch == "\x7f" for ch in shards[0]):
                return None, f"model.safetensors.index.json names shard {shards[0]!r}, which holds a control character"
            return _first_dtype(folder / shards[0]), shards[0]
    except SpecError as exc:
        return None, "; ".join(exc.problems)
    return None, "the folder holds no model.safetensors (hpcmem reads safetensors headers only)"


def _first_dtype(file: Path) -> str:
    header = read_header(file)
    names = sorted(k for k in header if k != "__metadata__")
    dtypes = []
    for name in names:
        entry = header[name]
        code = entry.get("dtype") if isinstance(entry, dict) else None
        if code not in TORCH_NAMES:
            raise SpecError(f"{file.name}: tensor {name!r} has dtype {code!r}, which transformers 5.24 cannot load")
        dtypes.append(TORCH_NAMES[code])
    floats = [d for d in dtypes if d in _FLOATS]
    return floats[0] if floats else dtypes[0] if dtypes else "float32"


def read_header(file: Path) -> dict:
    """The JSON header of a safetensors file, read without its tensor data (a regular file only: never a FIFO)."""
    try:
        with open_regular(file, file.name) as (fh, file_size):
            head = fh.read(8)
            if len(head) < 8:
                raise SpecError(f"{file.name} is shorter than a safetensors header")
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER or size > file_size - 8:
                raise SpecError(f"{file.name}: header length {size} exceeds the file or safetensors' "
                                f"{MAX_HEADER:,}-byte limit")
            raw = fh.read(size)
    except OSError as exc:
        raise SpecError(f"cannot read {file.name}: {exc.strerror or exc}") from None
    try:
        header = load_json(raw.decode("utf-8"), f"{file.name}: the safetensors header")
    except UnicodeDecodeError:
        raise SpecError(f"{file.name}: the safetensors header is not UTF-8 JSON") from None
    if not isinstance(header, dict):
        raise SpecError(f"{file.name}: the safetensors header is not a JSON object")
    return header
