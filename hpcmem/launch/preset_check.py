"""`hpcmem presets check`: a preset against what SLURM says of its partition (`scontrol show partition`, `sinfo`,
`scontrol show config`). Every comparison is reported, passing or not, with both numbers."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpcmem.errors import HpcmemError
from hpcmem.launch import slurm_time
from hpcmem.launch.backends import Runner, run_command
from hpcmem.launch.monitor import parse_scontrol
from hpcmem.launch.presets import Preset


@dataclass(frozen=True)
class Check:
    what: str
    preset: str
    cluster: str
    ok: bool


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: dict[str, int]            # gres type ("" when untyped) → count
    features: frozenset[str]


def parse_gres(text: str) -> dict[str, int]:
    """`gpu:2`, `gpu:h100:8(S:0-1)`, `gpu:a100:4,gpu:v100:2`, `(null)` → {type: count}."""
    out: dict[str, int] = {}
    for item in text.split(","):
        parts = re.sub(r"\(.*?\)", "", item).strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        kind, count = (parts[1], parts[2]) if len(parts) >= 3 else ("", parts[1])
        if count.isdigit():
            out[kind] = out.get(kind, 0) + int(count)
    return out


def _sinfo_nodes(partition: str, runner: Runner) -> list[Node]:
    done = runner(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%c|%m|%G|%f"])
    nodes: dict[str, Node] = {}
    for line in done.stdout.splitlines():
        name, cpus, mem, gres, feats = (line.split("|") + [""] * 5)[:5]
        if not name.strip():
            continue
        nodes[name] = Node(name, int(cpus or 0), int(re.sub(r"\D", "", mem) or 0), parse_gres(gres),
                           frozenset(f for f in feats.split(",") if f and f != "(null)"))
    return list(nodes.values())


def _max_array_size(runner: Runner) -> int | None:
    done = runner(["scontrol", "show", "config"])
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", done.stdout, re.M)
    return int(m.group(1)) if m else None


def check(preset: Preset, runner: Runner = run_command) -> list[Check]:
    """Compare; raises HpcmemError when SLURM cannot be reached or the partition does not exist."""
    done = runner(["scontrol", "show", "partition", "-o", preset.partition])
    if done.returncode != 0 or "PartitionName=" not in done.stdout:
        said = " / ".join(line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip())
        raise HpcmemError(f"partition {preset.partition!r} of preset {preset.name}: scontrol says {said!r}")
    part = parse_scontrol(done.stdout)
    nodes = _sinfo_nodes(preset.partition, runner)
    out = [Check("partition state", "UP", part.get("State", "?"), part.get("State") == "UP")]
    max_time = part.get("MaxTime", "UNLIMITED")
    out.append(Check("max_time", preset.max_time, max_time, _time_within(preset.max_time_limit, max_time)))
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    if preset.max_nodes:
        cap = len(nodes) if max_nodes == "UNLIMITED" else min(len(nodes), int(max_nodes))
        out.append(Check("max_nodes", str(preset.max_nodes), f"{cap} (MaxNodes {max_nodes}, {len(nodes)} nodes)",
                         preset.max_nodes <= cap))
    kind = preset.gres_type or ""
    gpus = [n.gpus.get(kind, 0) if kind else sum(n.gpus.values()) for n in nodes]
    out.append(_min_check(f"gpus_per_node (gres gpu{':' + kind if kind else ''})", preset.gpus_per_node, gpus, nodes))
    out.append(_min_check("cpus_per_node", preset.cpus_per_node, [n.cpus for n in nodes], nodes))
    if preset.memory_per_node_gb:
        out.append(_min_check("memory_per_node_gb", preset.memory_per_node_gb,
                              [n.memory_mb // 1024 for n in nodes], nodes))
    if preset.constraint:
        wanted = set(re.findall(r"[A-Za-z0-9_.-]+", preset.constraint))
        have = set().union(*(n.features for n in nodes)) if nodes else set()
        out.append(Check("constraint features", preset.constraint, ",".join(sorted(have)) or "(none)",
                         wanted <= have))
    if preset.max_array_size:
        cluster = _max_array_size(runner)
        out.append(Check("max_array_size", str(preset.max_array_size), str(cluster),
                         cluster is not None and preset.max_array_size <= cluster))
    return out


def _time_within(limit: slurm_time.TimeLimit, cluster: str) -> bool:
    """The preset's max_time within the partition's MaxTime (scontrol prints UNLIMITED or a SLURM time)."""
    try:
        return limit.fits_within(slurm_time.parse(cluster))
    except ValueError:
        return False


def _min_check(what: str, wanted: int, have: list[int], nodes: list[Node]) -> Check:
    """The preset's per-node figure must hold on at least one node of the partition; reports how many nodes have it."""
    if not nodes:
        return Check(what, str(wanted), "no nodes", False)
    enough = sum(1 for h in have if h >= wanted)
    return Check(what, str(wanted), f"{min(have)}–{max(have)} ({enough}/{len(nodes)} nodes have ≥ {wanted})",
                 enough > 0)
