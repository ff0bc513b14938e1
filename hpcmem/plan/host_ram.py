"""How much host RAM a node grants the planned job, and where that figure comes from.

In order: a preset's `memory_per_node_gb` (what SLURM's --mem grants), else `--host_ram_per_node` (GiB), else the
GPU catalog's reference node (hpcmem/gpus.json `host_ram_per_node_gb` over `host_ram_gpus_per_node`, with its
`host_ram_source`): the job is assumed to get the share of that node its GPUs per node are — a SLURM site that
allocates memory by GPU gives about that much. A GPU without a reference node leaves host RAM unchecked, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.errors import SpecError
from hpcmem.gpus.catalog import catalog_entry
from hpcmem.inputs.values import InputError, fail, number

GIB = 1024**3
MAX_HOST_RAM_GIB = 1024 * 1024          # 1 PiB per node: far above any machine sold; a larger number is a typo


@dataclass(frozen=True)
class HostRam:
    bytes: int | None           # None: unknown, host RAM is not checked
    source: str                 # what the figure is, in words
    assumed: bool = False       # the catalog's reference node, not the user's or the preset's


def parse_host_ram(value: object) -> float:
    """--host_ram_per_node in GiB: a finite number > 0 and ≤ 1 PiB; else one line naming flag, value and rule."""
    rule = f"the host RAM of one node in GiB, a number > 0 and ≤ {MAX_HOST_RAM_GIB} (e.g. 512)"
    try:
        gib = number("--host_ram_per_node", str(value).strip().removesuffix("GiB").removesuffix("G"))
    except InputError:
        raise fail("--host_ram_per_node", value, rule) from None
    if not 0 < gib <= MAX_HOST_RAM_GIB:
        raise fail("--host_ram_per_node", value, rule)
    return gib


def host_ram(gpu_name: str, gpus_per_node: int, *, preset_bytes: int | None = None,
             flag_gib: float | None = None, preset_name: str = "") -> HostRam:
    """The node's host RAM for the plan (module docstring). Both a preset value and the flag: they must agree."""
    if preset_bytes is not None and flag_gib is not None and int(flag_gib * GIB) != preset_bytes:
        raise SpecError(f"--host_ram_per_node {flag_gib:g}: preset {preset_name}'s memory_per_node_gb says "
                        f"{preset_bytes / GIB:g} GiB; give one of the two")
    if preset_bytes is not None:
        return HostRam(preset_bytes, f"preset {preset_name}'s memory_per_node_gb")
    if flag_gib is not None:
        return HostRam(int(flag_gib * GIB), "--host_ram_per_node")
    entry = catalog_entry(gpu_name) or {}
    node_gib, node_gpus = entry.get("host_ram_per_node_gb"), entry.get("host_ram_gpus_per_node")
    if not node_gib or not node_gpus:
        return HostRam(None, f"not checked: no reference node for {gpu_name} in the GPU catalog — pass "
                             "--host_ram_per_node or --preset")
    share = min(gpus_per_node, node_gpus) / node_gpus
    return HostRam(int(node_gib * share * GIB),
                   f"assumed: {min(gpus_per_node, node_gpus)}/{node_gpus} of a reference node's {node_gib:g} GiB — "
                   f"{entry['host_ram_source']}; set --host_ram_per_node or --preset", assumed=True)
