"""A stored case-matrix record's job (its model path made absolute) and an estimate's largest component by name:
and the estimate's tensor peak: what the vision-language estimate tests read off their stored traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.validate.cases import case_job


def trace_records(root: Path, *names: str) -> dict[str, dict[str, Any]]:
    """The stored trace records of estimator/traces/<name>.jsonl under `root`, for every name, by case id."""
    return {r["case"]["id"]: r for name in names
            for r in map(json.loads, (root / "estimator" / "traces" / f"{name}.jsonl").read_text().splitlines())}


def stored_case_job(record: dict[str, Any], root: Path, **changes: Any):
    """The JobSpec of a stored record's case, `changes` applied, its model_name_or_path resolved under `root`."""
    case = record["case"]
    return case_job({**case, **changes, "model_name_or_path": str(root / case["model_name_or_path"])})


def estimated_tensor_peak(record: dict[str, Any], root: Path) -> int:
    """The estimate's tensor peak for a stored record's case (cuBLAS workspaces and block tails left out, as the
    trace counts tensors): what each record's `traced` is held to."""
    return max(tensor_bytes(p) for p in estimate(stored_case_job(record, root)).phases)


def assert_learned_case_holds(record: dict[str, Any], root: Path, max_pct: float = 3.0) -> None:
    """A stored record of a vision-language type on a learned text part (hpcmem.models.vlm_learned): its estimate is
    made from the learned profile, and its tensor peak is within max_pct % of the trace's."""
    est = estimate(stored_case_job(record, root))
    assert est.made.startswith("learned profile")
    traced = record["traced"]
    assert abs(max(tensor_bytes(p) for p in est.phases) - traced) <= max_pct / 100 * traced


def largest_component(est: Any, name: str) -> int:
    """The largest bytes of the component `name` over the estimate's phases."""
    return max(c.bytes for p in est.phases for c in p.components if c.name == name)


def sft_with_images_job(cut: Path, height: int, width: int) -> Any:
    """`case_job` of an SFT job with one image of height × width a row (bf16, rows of 2,048 tokens) on the cut config
    `cut`."""
    return case_job({"trainer": "sft", "model_name_or_path": str(cut), "dtype": "bfloat16", "bf16": True,
                     "max_length": 2048, "images_per_example": 1, "image_height": height, "image_width": width})


def grpo_with_images_job(cut: Path, height: int, width: int) -> Any:
    """`case_job` of a GRPO job with one image of height × width a prompt (bf16, 1,024 prompt and 64 completion
    tokens) on the cut config `cut`: for the types whose images hpcmem models under SFT and DPO only, it raises."""
    return case_job({"trainer": "grpo", "model_name_or_path": str(cut), "max_prompt_length": 1024,
                     "max_completion_length": 64, "images_per_example": 1, "image_height": height,
                     "image_width": width, "dtype": "bfloat16", "bf16": True})


# the trainer/technique cells of an image matrix of SFT and DPO: SFT full and LoRA, checkpointing on and off; DPO
# LoRA with checkpointing and full without
SIX_CELLS = {"sft/full+gc", "sft/full+nogc", "sft/lora+gc", "sft/lora+nogc", "dpo/full+nogc", "dpo/lora+gc"}


def assert_matrix(records: dict[str, dict[str, Any]], n: int, sizes: set[tuple[int, int]], default_size: tuple[int, int],
                  cells: set[str]) -> None:
    """A stored image matrix has `n` cases at the image sizes (height, width) `sizes` (a case naming none takes the
    file's `default_size`) over the trainer/technique cells `cells`."""
    got = {(r["case"].get("image_height", default_size[0]), r["case"].get("image_width", default_size[1]))
           for r in records.values()}
    assert len(records) == n and got == sizes, (len(records), got)
    assert {r["cell"] for r in records.values()} == cells
