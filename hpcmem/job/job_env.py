"""The environment a job runs with (a preset's `env`, `--env NAME=VALUE`), read for what changes GPU memory.

A variable with a memory effect is modelled, refused with the rule it breaks, or named as not modelled in the
estimate's warnings — never read as "no effect". Variables outside this list (HF_HOME, WANDB_*, NCCL_SOCKET_IFNAME…)
change no GPU memory.

The caching allocator's settings (torch 2.13, c10/core/AllocatorConfig.h and c10/cuda/CUDAAllocatorConfig.h):
comma-separated `key:value` pairs, a list value in brackets; spaces are dropped. torch's device-generic parser reads
PYTORCH_ALLOC_CONF and falls back to PYTORCH_CUDA_ALLOC_CONF, while the CUDA parser reads them the other way round
(`CUDAAllocatorConfig::instance`), so two different values split one job's settings between them: refused. A key
neither parser knows stops the job at its first CUDA allocation ("Unrecognized key … in CUDA allocator config",
`CUDAAllocatorConfig::parseArgs`), and so do the values the parsers reject; both are refused here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpcmem.errors import SpecError

ALLOC_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
KIB = 1024
INT_MAX = 2**31 - 1         # std::stoi's range: a larger SIZE or COUNT throws where torch parses it

# the device-generic keys (c10/core/AllocatorConfig.cpp `parseArgs`): what each does to the device memory hpcmem
# estimates; None = no device effect (host pinned memory)
_UNMODELLED = "changes how the caching allocator rounds, splits or frees blocks, which hpcmem's reserved model does " \
              "not follow"
GENERIC_KEYS: dict[str, str | None] = {
    "max_split_size_mb": _UNMODELLED,
    "max_non_split_rounding_mb": _UNMODELLED,
    "garbage_collection_threshold": _UNMODELLED,
    "roundup_power2_divisions": _UNMODELLED,
    "large_segment_size_mb": _UNMODELLED,
    "expandable_segments": None,            # modelled: JobSpec.expandable_segments
    "pinned_use_background_threads": None,
    "pinned_max_round_threshold_mb": None,
    "pinned_max_cached_size_mb": None,
}
# CUDAAllocatorConfig::getKeys (c10/cuda/CUDAAllocatorConfig.h): none changes device memory hpcmem models but
# `backend` (cudaMallocAsync: named as not modelled) and `per_process_memory_fraction` (refused), both in `_allocator`;
# graph_capture_record_stream_reuse acts on CUDA graph capture only, and TRL's step is eager
CUDA_KEYS = frozenset({
    "backend", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "graph_capture_record_stream_reuse", "pinned_reserve_segment_size_mb",
    "pinned_num_register_threads", "pinned_free_catch_all", "throw_on_cudamalloc_oom", "per_process_memory_fraction",
})
_BOOL_KEYS = {"expandable_segments", "pinned_use_background_threads", "release_lock_on_cudamalloc",
              "release_lock_on_hipmalloc", "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
              "graph_capture_record_stream_reuse", "pinned_free_catch_all", "throw_on_cudamalloc_oom"}
_MB_FLOOR = {"max_split_size_mb": 20, "max_non_split_rounding_mb": 20}      # kLargeBuffer / 1 MiB


@dataclass(frozen=True)
class JobEnv:
    """What the job's environment changes in GPU memory (the defaults: an environment that sets nothing)."""

    expandable: bool | None = None          # the allocator settings' expandable_segments; None: they do not say
    allocator_value: str | None = None      # the allocator settings as given (one value for both variables)
    nvls: bool = True                       # NCCL_NVLS_ENABLE=0 turns NCCL's NVLink SHARP buffers off
    cublas_workspace_bytes: int | None = None   # CUBLAS_WORKSPACE_CONFIG: one cuBLAS workspace
    unmodelled: tuple[str, ...] = ()        # settings with a device-memory effect hpcmem does not model


def _lex(value: str) -> list[str]:
    """torch's tokens: `,` `:` `[` `]` alone, every other run of characters one token, spaces dropped
    (ConfigTokenizer)."""
    tokens, word = [], ""
    for ch in value:
        if ch in ",:[]":
            if word:
                tokens.append(word)
                word = ""
            tokens.append(ch)
        elif ch != " ":
            word += ch
    return tokens + ([word] if word else [])


def _pairs(name: str, value: str) -> list[tuple[str, str]]:
    """(key, value) pairs of an allocator setting; a list value stays one text ("[64:8,>:1]")."""
    tokens, out, i = _lex(value), [], 0
    while i < len(tokens):
        key = tokens[i]
        if key in ",:[]" or i + 1 >= len(tokens) or tokens[i + 1] != ":":
            raise SpecError(f"{name}={value!r}: expected key:value pairs separated by commas at {key!r} "
                            "(torch's allocator settings syntax)")
        i += 2
        if i < len(tokens) and tokens[i] == "[":
            end = tokens.index("]", i) if "]" in tokens[i:] else -1
            if end < 0:
                raise SpecError(f"{name}={value!r}: {key}'s list has no closing ']'")
            item, i = "".join(tokens[i:end + 1]), end + 1
        elif i < len(tokens) and tokens[i] not in ",:[]":
            item, i = tokens[i], i + 1
        else:
            raise SpecError(f"{name}={value!r}: {key} has no value")
        out.append((key, item))
        if i < len(tokens):
            if tokens[i] != ",":
                raise SpecError(f"{name}={value!r}: expected ',' after {key}:{item}")
            i += 1
    return out


def _check_value(name: str, key: str, item: str) -> None:
    """The values torch's parsers refuse (a refused value stops the job at its first CUDA allocation)."""
    where = f"{name} {key}:{item}"
    if key in _BOOL_KEYS and item not in ("True", "False"):
        raise SpecError(f"{where}: torch accepts only True or False here (capitalised)")
    if key.endswith("_mb"):
        if not item.isdigit():
            raise SpecError(f"{where}: a whole number of MiB is expected")
        if int(item) < _MB_FLOOR.get(key, 0):
            raise SpecError(f"{where}: torch requires ≥ {_MB_FLOOR[key]} (kLargeBuffer, 20 MiB)")
    if key == "garbage_collection_threshold":
        try:
            ok = 0.0 < float(item) < 1.0
        except ValueError:
            ok = False
        if not ok:
            raise SpecError(f"{where}: torch requires a number in (0.0, 1.0)")
    if key == "backend" and item not in ("native", "cudaMallocAsync"):
        raise SpecError(f"{where}: torch knows the backends native and cudaMallocAsync")


def _allocator(env: Mapping[str, str], where: str) -> tuple[str | None, bool | None, list[str]]:
    given = {k: env[k] for k in ALLOC_VARS if k in env}
    if len(set(given.values())) > 1:
        raise SpecError(f"{where} sets PYTORCH_ALLOC_CONF={given['PYTORCH_ALLOC_CONF']!r} and "
                        f"PYTORCH_CUDA_ALLOC_CONF={given['PYTORCH_CUDA_ALLOC_CONF']!r}: torch 2.13 reads the generic "
                        "keys from the first and the CUDA keys from the second, so the job would run neither as "
                        "written; set one, or both to the same value")
    if not given:
        return None, None, []
    name, value = next(iter(given.items()))
    expandable, unmodelled = None, []
    for key, item in _pairs(name, value):
        if key not in GENERIC_KEYS and key not in CUDA_KEYS:
            raise SpecError(f"{name} {key}:{item}: not an allocator setting torch 2.13 knows (it stops the job at "
                            f"its first CUDA allocation: \"Unrecognized key '{key}' in CUDA allocator config\")")
        _check_value(name, key, item)
        if key == "per_process_memory_fraction":
            raise SpecError(f"{name} per_process_memory_fraction:{item} caps the allocator below the GPU's memory, "
                            "which hpcmem's verdict does not hold: describe the capped GPU in the preset (gpu: with "
                            "memory_gb and usable_gb) and drop the setting, or drop it")
        if key == "expandable_segments":
            expandable = item == "True"
        elif key == "backend" and item == "cudaMallocAsync":
            unmodelled.append(f"{name} backend:cudaMallocAsync (the driver's stream-ordered pool, not the caching "
                              "allocator hpcmem models: reserved and device peaks are the caching allocator's)")
        elif GENERIC_KEYS.get(key):
            unmodelled.append(f"{name} {key}:{item} ({GENERIC_KEYS[key]}: reserved and device peaks assume the "
                              "default)")
    return value, expandable, unmodelled


def allocator_expandable(env: Mapping[str, str]) -> bool:
    """Whether torch ran the allocator with expandable segments under `env` (a recorded run's variables):
    PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF (the device-generic parser's order, which reads
    expandable_segments); a setting torch refuses ran nothing, so False."""
    name = next((n for n in ALLOC_VARS if n in env), None)
    if name is None:
        return False
    try:
        return ("expandable_segments", "True") in _pairs(name, env[name])
    except SpecError:
        return False


def cublas_workspace(value: str) -> int | None:
    """One cuBLAS workspace from CUBLAS_WORKSPACE_CONFIG: Σ SIZE KiB × COUNT over every `:SIZE:COUNT`; None when no
    such pair matches (torch warns and keeps its default). Source: aten/src/ATen/cuda/CublasHandlePool.cpp
    `parseChosenWorkspaceSize` (regex `:([0-9]+):([0-9]+)`, each number read with std::stoi). SpecError for a
    number std::stoi cannot hold."""
    pairs = [(int(size), int(count)) for size, count in re.findall(r":([0-9]+):([0-9]+)", value)]
    if any(n > INT_MAX for pair in pairs for n in pair):
        raise SpecError(f"CUBLAS_WORKSPACE_CONFIG={value!r}: SIZE and COUNT must each be ≤ {INT_MAX} (torch reads "
                        "them with std::stoi, which throws beyond)")
    return sum(size * KIB * count for size, count in pairs) if pairs else None


def read_env(env: Mapping[str, str], where: str = "the job's environment") -> JobEnv:
    """The memory effects of `env` (name → value, as exported in the job); SpecError for what the job would refuse
    or hpcmem cannot estimate."""
    value, expandable, unmodelled = _allocator(env, where)
    nvls = True
    if "NCCL_NVLS_ENABLE" in env:
        raw = env["NCCL_NVLS_ENABLE"].strip()
        if not re.fullmatch(r"-?[0-9]+", raw):
            raise SpecError(f"NCCL_NVLS_ENABLE={env['NCCL_NVLS_ENABLE']!r}: NCCL reads an integer (0 turns NVLink "
                            "SHARP off)")
        nvls = int(raw) != 0
    cublas = None
    if "CUBLAS_WORKSPACE_CONFIG" in env:
        cublas = cublas_workspace(env["CUBLAS_WORKSPACE_CONFIG"])
        if cublas is None:
            raise SpecError(f"CUBLAS_WORKSPACE_CONFIG={env['CUBLAS_WORKSPACE_CONFIG']!r}: torch expects :SIZE:COUNT "
                            "pairs (e.g. :4096:8) and ignores anything else with a warning; write one, or drop it")
    if env.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("", "0"):
        unmodelled.append("PYTORCH_NO_CUDA_MEMORY_CACHING (every free goes back to the driver: reserved follows "
                          "allocated, slower; the reserved and device peaks assume the caching allocator)")
    for name in ("NCCL_BUFFSIZE", "NCCL_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS",
                 "NCCL_MAX_CTAS"):
        if name in env:
            unmodelled.append(f"{name}={env[name]} (NCCL's channel buffers: hpcmem's NCCL term is a flat, "
                              "uncalibrated constant that does not follow it)")
    return JobEnv(expandable=expandable, allocator_value=value, nvls=nvls, cublas_workspace_bytes=cublas,
                  unmodelled=tuple(unmodelled))


def with_env_settings(settings: dict, job_env: JobEnv, where: str) -> dict:
    """`settings` with the allocator's expandable_segments from the environment; a setting that disagrees with
    what the job's environment makes torch do is refused."""
    if job_env.allocator_value is None:
        return settings
    runs = bool(job_env.expandable)
    if "expandable_segments" in settings and bool(settings["expandable_segments"]) != runs:
        raise SpecError(f"expandable_segments is {settings['expandable_segments']} but {where} sets the allocator to "
                        f"{job_env.allocator_value!r}, so torch runs with expandable_segments {runs}: make them agree "
                        "(write expandable_segments:True in the variable, or drop the setting)")
    return {**settings, "expandable_segments": runs}
