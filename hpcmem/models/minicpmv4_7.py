"""MiniCPM-V 4.7 (model_type "minicpmv4_7"): MiniCPM-V 4.6's tower spec under its own model type
(transformers 5.24 models/minicpmv4_7/modular_minicpmv4_7.py); everything but what differs is hpcmem.models.minicpmv4_6.

What differs from 4.6, read from modular_minicpmv4_7.py:
- The config: `MiniCPMV4_7VisionConfig(MiniCPMV4_6VisionConfig)` adds nothing (model_type "minicpmv4_7_vision");
  `MiniCPMV4_7Config(MiniCPMV4_6Config)` keeps every default (insert_layer_id 6, downsample_mode "16x", merge kernel
  2 × 2, merger_times 1, image_size 448, a qwen3_5_text text_config, tie_word_embeddings false), drops
  `drop_vision_last_layer` (which no 4.6 module reads) and adds five marker token ids (image_start_id, image_end_id,
  slice_start_id, slice_end_id, newline_id; None by default, no parameter).
- The model: `MiniCPMV4_7Model(MiniCPMV4_6Model)` builds the same modules (no `__init__` beyond `rope_deltas = None`):
  the tower, window merger, MLP merger and Qwen3.5 decoder, so the parameters and linears are 4.6's. Its `forward`
  differs only in `compute_3d_position_ids` → `get_rope_index` ("canvas M-RoPE"): from input_ids,
  mm_token_type_ids, target_sizes and the marker ids it lays each image's tokens on a 2-D canvas in Python lists
  (`_group_visual_frames`, `.tolist()`), and returns int64 position ids [3, B, S] and rope_deltas [B, 1] (kept on the
  module as `self.rope_deltas`). 4.6 passes no position ids: Qwen3_5TextModel.forward (models/qwen3_5/
  modeling_qwen3_5.py) then expands an arange to [4, B, S] (a view) and `Qwen3_5TextRotaryEmbedding` expands either
  to [3, B, S] before computing the same cos/sin [B, S, head_dim]. So the memory difference is the int64 ids:
  24 · B · S bytes live through the forward (74 KB for a DPO pair at 1,536 tokens) and 8 · B bytes kept: no term of
  its own at hpcmem's resolution (the estimate is 4.6's, hpcmem.estimate.vision_minicpmv4_6).
- The processor: `MiniCPMV4_7Processor(MiniCPMV4_6Processor)` sets `return_mm_token_type_ids = True` (the batch
  carries mm_token_type_ids [B, S], which TRL's vision collators pass on and DPO extends over the completion),
  checks one placeholder per image (`validate_inputs`) and writes no local ids for videos; an image's text
  (`replace_image_token`, `_prepend_local_ids`) and its image processor (image_processing_auto.py maps minicpmv4_7 to
  `MiniCPMV4_6ImageProcessorPil`) are 4.6's, so the slices, image tokens and markers are
  hpcmem.models.minicpmv4_6's and hpcmem.trace.vision_minicpmv4_6's.
"""

from __future__ import annotations

from typing import Any

from hpcmem.models.minicpmv4_6 import MiniCpmV46TowerSpec, minicpmv4_6_tower_from_config


def minicpmv4_7_tower_from_config(cfg: dict[str, Any], name: str) -> MiniCpmV46TowerSpec:
    """The tower spec of a minicpmv4_7 config.json dict: 4.6's (same config fields and defaults, same modules), its
    model_type minicpmv4_7; the family stays minicpmv4_6 (the same slices, geometry and estimate terms)."""
    return minicpmv4_6_tower_from_config(cfg, name, model_type="minicpmv4_7")
