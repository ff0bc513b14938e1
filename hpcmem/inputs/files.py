"""Reading a user's file cheaply and safely: a regular file, at most so many bytes, UTF-8 text; YAML with aliases
and nesting limited; JSON with nesting limited. Every refusal is one line naming the file and the rule.

PyYAML keeps an alias as a second reference to the anchored node, so a 600-byte document can stand for a billion
values that only appear when something walks it (json.dumps of the run's spec): `load_yaml` counts the values the
document expands to and refuses more than MAX_VALUES. Its composer recurses once per nesting level, so depth is
limited before Python's recursion limit is reached.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from hpcmem.errors import SpecError

KIB, MIB = 1024, 1024**2
MAX_DEPTH = 64                  # nesting levels of a YAML or JSON document (real configs use fewer than 10)
MAX_VALUES = 100_000            # values a YAML document may expand to, aliases counted as often as they are used
# Digits of one integer in a YAML or JSON document: every count hpcmem reads fits in 19 (int64). Python refuses to
# convert text of over 4,300 digits (sys.int_info.str_digits_check_threshold) with a ValueError deep in the parser;
# refusing far earlier keeps that, and any quadratic conversion, out of reach.
MAX_INT_DIGITS = 64
# Largest file read, per kind: a TRL or accelerate YAML, a preset and a config.json are a few KiB; a length profile
# holds up to 2,000,000 lengths per part (hpcmem.data.profile); probe records are one JSON line per run; a sharded
# checkpoint's model.safetensors.index.json names every tensor (a few MiB for the largest Hub models); a learned
# profile is ~10 KiB.
MAX_BYTES = {"config": 1 * MIB, "accelerate config": 1 * MIB, "preset": 1 * MIB, "model config": 4 * MIB,
             "length profile": 256 * MIB, "probe records": 256 * MIB, "checkpoint index": 64 * MIB,
             "learned profile": 16 * MIB}


class InputFileError(SpecError):
    """A file hpcmem refuses to read, with the reason (one problem: the CLI prints one line)."""


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / KIB:.1f} KiB" if n >= KIB else f"{n} bytes"


@contextlib.contextmanager
def open_regular(path: str | os.PathLike, label: str) -> Iterator[tuple[BinaryIO, int]]:
    """(binary file, its size) for a regular file; anything else is refused as "<label> is not a regular file". Opened
    with O_NONBLOCK: opening a FIFO waits for a writer otherwise, before fstat can tell it is not a file (it does not
    change how a regular file reads). OSError from opening or reading is the caller's to word."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"{label} is not a regular file")
        yield fh, info.st_size


def read_bytes(path: str | os.PathLike, what: str) -> bytes:
    """The bytes of a regular file of at most MAX_BYTES[what] (a FIFO or device would block or never end)."""
    limit = MAX_BYTES[what]
    try:
        with open_regular(path, f"{what} {path}") as (fh, size):
            if size > limit:
                raise InputFileError(f"{what} {path} is {_size(size)}; hpcmem reads at most "
                                     f"{_size(limit)} for a {what}")
            data = fh.read(limit + 1)
    except (OSError, ValueError) as exc:       # ValueError: a NUL in the name
        raise InputFileError(f"cannot read {what} {path!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(data) > limit:
        raise InputFileError(f"{what} {path} grew beyond {_size(limit)} while being read")
    return data


def decode(data: bytes, what: str, path: str | os.PathLike) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{what} {path} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
                             f"{exc.start}") from None


def read_text(path: str | os.PathLike, what: str) -> str:
    return decode(read_bytes(path, what), what, path)


def _limited_loader(source: str):
    import yaml

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise InputFileError(f"{source}: nested deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def compose_document(self):
            node = super().compose_document()
            _count_values(node, source)
            return node

        def construct_yaml_int(self, node):
            if sum(ch.isdigit() for ch in node.value) > MAX_INT_DIGITS:
                raise InputFileError(f"{source}: an integer of {sum(ch.isdigit() for ch in node.value):,} digits "
                                     f"(line {node.start_mark.line + 1}); no count hpcmem reads has over "
                                     f"{MAX_INT_DIGITS}")
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    return Loader


def _count_values(root, source: str) -> None:
    """How many values the node graph expands to, each alias counted as a full copy; refuses cycles and > MAX_VALUES."""
    import yaml

    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node, yaml)
        if done:
            active.discard(key)
            sizes[key] = min(MAX_VALUES + 1, 1 + sum(sizes[id(c)] for c in children))
            continue
        if key in sizes:
            continue
        if key in active:
            raise InputFileError(f"{source}: a YAML alias refers to a node that contains it (a cycle)")
        active.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    if sizes[id(root)] > MAX_VALUES:
        raise InputFileError(f"{source}: expands to more than {MAX_VALUES:,} values through YAML aliases (&anchor / "
                             "*alias); write the values out")


def _children(node, yaml) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_yaml(text: str, source: str) -> Any:
    """One YAML document (safe constructors only) within the depth and expansion limits."""
    import yaml

    try:
        return yaml.load(text, Loader=_limited_loader(source))  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputFileError(f"{source} is not valid YAML: {' '.join(str(problem).split())}{where}") from None
    except RecursionError:
        raise InputFileError(f"{source}: nested too deeply") from None


def load_yaml_file(path: str | os.PathLike, what: str) -> Any:
    return load_yaml(read_text(path, what), f"{what} {path}")


def check_depth(value: Any, source: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse documents nested deeper than `max_depth` (later recursive walks stay far from the recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise InputFileError(f"{source}: nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-')):,} digits; no count hpcmem reads has over "
                         f"{MAX_INT_DIGITS}")
    return int(text)


def load_json(text: str | bytes, source: str) -> Any:
    """A JSON document within the depth limit, its integers within MAX_INT_DIGITS (json's `parse_int` hook)."""
    try:
        value = json.loads(text, parse_int=bounded_int)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{source} is not JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise InputFileError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:       # bounded_int's refusal
        raise InputFileError(f"{source}: {exc}") from None
    check_depth(value, source)
    return value


def load_json_file(path: str | os.PathLike, what: str) -> Any:
    return load_json(read_text(path, what), f"{what} {path}")


def user_path(text: str | os.PathLike) -> Path:
    """A path as typed: `~` and `~user` expanded when they name a home, else kept as written."""
    try:
        return Path(text).expanduser()
    except RuntimeError:            # ~nosuchuser
        return Path(text)


def is_file(path: str | os.PathLike) -> bool:
    """Path.is_file that answers False (not an exception) for names the OS refuses (too long, NUL)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def exists(path: str | os.PathLike) -> bool:
    """Path.exists that answers False (not an exception) for names the OS refuses (too long, NUL)."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False
