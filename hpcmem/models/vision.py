"""VisionSpec: the vision tower and projector of a vision-language model, as its config.json's `vision_config`
describes them (names follow transformers' config keys), and their linear layers and parameter count.

Covered (transformers 5.24):
- Qwen2.5-VL (models/qwen2_5_vl/configuration_qwen2_5_vl.py `Qwen2_5_VLVisionConfig`, modeling_qwen2_5_vl.py
  `Qwen2_5_VisionTransformerPretrainedModel`): a Conv3d patch embedding (no bias), `depth` blocks of RMSNorm →
  attention (fused `qkv` with bias, `proj` with bias) → RMSNorm → gated MLP (gate/up/down_proj, all with bias),
  window attention except in `fullatt_block_indexes`, and the patch merger (`merger`: RMSNorm over the tower width,
  then Linear(4·width → 4·width) → GELU → Linear(4·width → out_hidden_size), both with bias).
- Qwen2-VL (models/qwen2_vl/configuration_qwen2_vl.py `Qwen2VLVisionConfig`, modeling_qwen2_vl.py
  `Qwen2VisionTransformerPretrainedModel`): the same patch embedding, attention and merger layout, but torch's
  LayerNorm (weight and bias) for norm1/norm2 and the merger's `ln_q` (`Qwen2VLVisionBlock.__init__`,
  `PatchMerger.__init__`), a two-linear MLP fc1 → `hidden_act` (quick_gelu) → fc2 with biases (`VisionMlp`, width
  int(embed_dim · mlp_ratio)), and full attention over each image in every block (no windows). Its config names the
  tower width `embed_dim` and the merger's output `hidden_size`.
- Qwen3-VL (models/qwen3_vl/configuration_qwen3_vl.py `Qwen3VLVisionConfig`, modeling_qwen3_vl.py
  `Qwen3VLVisionModel`): Qwen2-VL's LayerNorm blocks with full attention, a two-linear MLP `linear_fc1` →
  `hidden_act` (gelu_pytorch_tanh) → `linear_fc2` (`Qwen3VLVisionMLP`, width intermediate_size), a patch embedding
  with bias (`Qwen3VLVisionPatchEmbed`, patch size 16), learned position embeddings (`pos_embed`, an
  nn.Embedding of num_position_embeddings rows interpolated to each image's grid), the merger
  (`Qwen3VLVisionPatchMerger`: LayerNorm over the tower width, linear_fc1 → GELU → linear_fc2) and one more merger
  per `deepstack_visual_indexes` entry (`deepstack_merger_list`, `use_postshuffle_norm=True`: its LayerNorm runs
  over 4·width), whose outputs the language model adds to the image tokens' hidden states after its first layers
  (modeling_qwen3_vl.py `Qwen3VLTextModel._deepstack_process`). Its decoder is Qwen3's (q/k norms, no biases).
- Qwen3-VL-MoE (models/qwen3_vl_moe/modular_qwen3_vl_moe.py): Qwen3-VL's tower, merger and deepstack mergers unchanged
  (`Qwen3VLMoeVisionModel(Qwen3VLVisionModel)`), its decoder Qwen3-MoE's layers (fused experts, a bare-weight router)
  with `Qwen3VLMoeTextConfig`'s defaults.
- EXAONE 4.5 (models/exaone4_5/modular_exaone4_5.py): Qwen2.5-VL's tower and merger with grouped-query attention in
  its blocks (`num_key_value_heads`: qkv projects to q_dim + 2 · kv_dim); its EXAONE 4 decoder from a learned profile
  of its text config (hpcmem.models.vlm_learned).
- HyperCLOVAX Vision V2 (models/hyperclovax_vision_v2/modular_hyperclovax_vision_v2.py): Qwen2.5-VL's tower and merger
  with Qwen2_5_VLVisionConfig's defaults, then a `projector` Linear(out_hidden_size → text hidden_size, with bias) on
  the merger's output (`HyperCLOVAXVisionV2Model.get_image_features`); its HyperCLOVAX decoder from a learned profile of
  its text config (hpcmem.models.vlm_learned).
- Qwen2.5-Omni's thinker (models/qwen2_5_omni/modeling_qwen2_5_omni.py, model type qwen2_5_omni_thinker): Qwen2.5-VL's
  tower and merger with three q/k/v Linears for the fused qkv (hpcmem.models.qwen2_5_omni), beside an audio tower that
  images never run (loaded, no gradient); its decoder Qwen2's with M-RoPE, as Qwen2.5-VL's.
- Qwen3.5 (models/qwen3_5/modular_qwen3_5.py): Qwen3-VL's tower and merger without the deepstack mergers
  (`Qwen3_5VisionModel(Qwen3VLVisionModel)` deletes them); its decoder, Gated DeltaNet and full-attention layers, from
  a learned profile of its text config (hpcmem.models.vlm_learned).
- Qwen4-Exp (models/qwen4_exp/modular_qwen4_exp.py): Qwen3.5's tower and merger (`Qwen4ExpVisionModel(
  Qwen3_5MoeVisionModel)`); its decoder (Gated DeltaNet and QSA-indexed attention layers, experts, hyper-connections)
  from a learned profile of its text config (hpcmem.models.vlm_learned).
- Gemma 3 (models/gemma3/modeling_gemma3.py `Gemma3Model`): a SigLIP tower and Gemma 3's pooling projector
  (hpcmem.models.siglip, `family` "siglip"): separate q/k/v/out_proj, fc1 → gelu_pytorch_tanh → fc2, LayerNorms,
  a learned position table, post_layernorm; the projector pools spatial_merge_size² patches into one token and has
  no nn.Linear. Its decoder is Gemma 3's text model.
- llava (LLaVA-1.5): its CLIP tower and projector are hpcmem.models.clip_tower's `ClipTowerSpec`; its decoder is
  what its text_config names.
- llava_next (LLaVA-NeXT): llava's tower and projector with anyres tiles and an image_newline vector
  (hpcmem.models.llava_next's `LlavaNextTowerSpec`).
- llava_next_video (LLaVA-NeXT-Video): with images llava_next's tower, projector, tiles and image_newline (its
  video pooler, `vision_resampler`, runs on videos only and has no parameters in its average and max modes).
- llava_onevision (LLaVA-OneVision): a SigLIP tower under llava_next's projector, tiles and image_newline, a large
  image's grid downscaled to anyres_max's tile count (hpcmem.models.llava_onevision's `LlavaOnevisionTowerSpec`); its
  decoder is what its text_config names (Qwen2).
- vipllava (ViP-LLaVA): llava's CLIP tower; the projector reads several layers' outputs concatenated through a
  LayerNorm (hpcmem.models.vipllava's `VipLlavaTowerSpec`).
- video_llava (Video-LLaVA): with images llava's tower and projector, beside an idle video tower of the same config
  (hpcmem.models.video_llava's `VideoLlavaTowerSpec`).
- idefics2: Idefics3's SigLIP-style tower under a gated-MLP modality projection and a perceiver resampler, a Mistral
  decoder (hpcmem.models.idefics2's `Idefics2TowerSpec`).
- smolvlm (SmolVLM2) and idefics3: a SigLIP-style tower, a pixel-shuffle connector and a Llama decoder
  (hpcmem.models.idefics3's `Idefics3TowerSpec`).
- granite_docling (Granite-Docling): Idefics3's tower with its own connector (ln_in, pixel shuffle, projection, a fixed
  2-D position table, deepstack mergers whose outputs the text layers add, an idle fine path) over GotOcr2-style
  tiles, and a Granite decoder from a learned profile (hpcmem.models.granite_docling's `GraniteDoclingTowerSpec`).
- aria (Aria): Idefics3's tower over each padded 980² image, the AriaProjector (learned queries cross-attending to the
  patches, an MLP) and an MoE decoder (aria_text) from a learned profile (hpcmem.models.aria's `AriaTowerSpec`).
- paligemma: a SigLIP tower and a one-Linear projector (hpcmem.models.paligemma's `PaliGemmaTowerSpec`); its decoder
  is what its text_config names (Gemma 2 for PaliGemma 2).
- internvl (InternVL3): an InternViT tower (class token, layer scale), a pixel-shuffle projector (LayerNorm, two
  linears) and GotOcr2-style tiles (hpcmem.models.internvl's `InternVLTowerSpec`); its decoder is what its
  text_config names (Qwen2).
- mllama (Llama-3.2-Vision): a tiled ViT with a gated global encoder, a one-Linear projector and a Llama decoder
  whose cross-attention layers read the image states (hpcmem.models.mllama's `MllamaTowerSpec`, which also counts
  what those layers hold beyond a Llama layer).
- shieldgemma2 (ShieldGemma 2): transformers builds Gemma3ForConditionalGeneration from its config, so Gemma 3's
  tower, projector and decoder; only the head's tying is read otherwise (ShieldGemma2Config).
- cosmos3_omni (Cosmos3-Omni): Cosmos3OmniForConditionalGeneration subclasses Qwen3-VL's and builds Qwen3-VL's tower
  and decoder, so Qwen3-VL's layout and defaults.
- mistral3 (Mistral Small 3.1): a Pixtral tower (RMSNorms, gated MLP, 2D rotary attention over each image at its own
  resolution) and a patch-merging projector (hpcmem.models.pixtral's `PixtralTowerSpec`); its decoder is what its
  text_config names (Mistral).
- lighton_ocr (LightOnOCR): Mistral 3's Pixtral tower and projector (GELU, no biases) with the image processor's own
  patch-size resize, image tokens without breaks and a Qwen3 decoder (hpcmem.models.lighton_ocr's
  `LightOnOcrTowerSpec`).
- janus (Janus, Janus-Pro): DeepSeek-VL's SigLIP-layout tower and GELU aligner, beside image-generation parts (a VQ
  model, generation embeddings, aligner and head) no image-understanding step runs (hpcmem.models.janus's
  `JanusTowerSpec`); a Llama decoder.
- deepseek_vl_hybrid (DeepSeek-VL hybrid) with images: DeepSeek-VL's SigLIP tower beside a SAM high-resolution tower
  whose features the hybrid aligner fuses (hpcmem.models.deepseek_vl_hybrid's `DeepseekVLHybridTowerSpec`).
- deepseek_vl (DeepSeek-VL): a SigLIP tower read whole under a two-linear GELU aligner (hpcmem.models.deepseek_vl's
  `DeepseekVLTowerSpec`); its decoder is what its text_config names (Llama).
- video_llama_3 (VideoLLaMA3) with images: a SigLIP-NaViT-style tower (2D rotary attention per image at its own
  resolution, no position table) under a two-linear GELU projector (hpcmem.models.video_llama_3's
  `VideoLlama3TowerSpec`); its decoder is what its text_config names (Qwen2).
- paddleocr_vl (PaddleOCR-VL) with images: VideoLLaMA3's encoder layers over a patch embedding plus a resampled
  position table, under a 2 × 2-merging LayerNorm + two-linear GELU projector (hpcmem.models.paddleocr_vl's
  `PaddleOcrTowerSpec`); its decoder ERNIE-4.5's layers, learned (hpcmem.models.vlm_learned).
- ovis2 (Ovis2): an RMSNorm/SwiGLU tower under a visual tokenizer (head_linear, LayerNorm, softmax over a visual
  vocabulary) and a visual embedding table (hpcmem.models.ovis2's `Ovis2TowerSpec`); a Qwen2 decoder.
- gemma4 (Gemma 4) with images: its own encoder (sandwich RMSNorms, q/k/v norms, 2-D rotary, gated MLP) over each
  image's patches padded to max_soft_tokens · k², a k × k average pooler and an RMSNorm + Linear embedder
  (hpcmem.models.gemma4's `Gemma4TowerSpec`); its decoder Gemma 4's text model, learned (hpcmem.models.vlm_learned).
- gemma4_unified (Gemma 4 unified) with images: no encoder; an embedder of merged k × k patches (LayerNorm, Linear,
  LayerNorm, a factorized position table, LayerNorm, RMSNorm + Linear) over max_soft_tokens rows per image
  (hpcmem.models.gemma4's `Gemma4UnifiedTowerSpec`); its decoder Gemma4UnifiedTextModel, learned.
- glm4v (GLM-4.1V) with images: Qwen2.5-VL's block layout (RMSNorms, fused qkv, gated MLP, 2-D rotary, full attention
  per image) with its own MLP width, a position table resampled per image, post-conv and post-block RMSNorms, a Conv2d
  downsample and a gated merger (hpcmem.models.glm4v's `Glm4vTowerSpec`); its decoder `Glm4vTextModel`, whose layer is
  GLM-4's (the glm4 layout) under 3-D M-RoPE.
- glm46v (GLM-4.6V) and glmga with images: glm4v's tower and text model, which their classes build from glm4v_vision /
  glm4v_text sub-configs (hpcmem.models.glm4v), behind Glm46VProcessor.
- glm4v_moe (GLM-4.5V) with images: glm4v's tower over GLM-4.5's MoE decoder, taken as glm4_moe's layers and learned
  (hpcmem.models.vlm_learned), behind Glm4vProcessor.
- cohere_compass (Cohere Compass, North-Micro-Vision) with images: Qwen3-VL's tower, merger and deepstack mergers, its
  Cohere2-style decoder from a learned profile of its text config, behind CohereCompassProcessor.
- glm_ocr (GLM-OCR) with images: glm4v's tower with q/k norms, biases, no position table or post-conv norm and its own
  MLP widths (hpcmem.models.glm4v `GlmOcrTowerSpec`); its decoder Glm4vTextModel's computation with q/k/v_proj
  without bias (`GlmOcrTextAttention`), behind Glm46VProcessor.
- lfm2_vl (LFM2-VL) with images: a SigLIP2 NaFlex tower over tiles padded to the processor's max_num_patches rows,
  read at last_hidden_state, under a pixel-unshuffle LayerNorm/GELU projector (hpcmem.models.lfm2_vl's
  `Lfm2VlTowerSpec`); its decoder LFM2's short-convolution and attention layers, learned (hpcmem.models.vlm_learned).
- minicpmv4_6 (MiniCPM-V 4.6) with images: a SigLIP-style tower over the processor's slices with a window-attention
  merger after layer insert_layer_id and an MLP merger after it (hpcmem.models.minicpmv4_6's `MiniCpmV46TowerSpec`);
  its decoder Qwen3.5's, learned (hpcmem.models.vlm_learned).
- minicpmv4_7 (MiniCPM-V 4.7) with images: MiniCPM-V 4.6's modules and processor text; its canvas M-RoPE position ids
  (int64, no term of their own) as hpcmem.models.minicpmv4_7 says.
- minicpm_ocr (MiniCPM-OCR) with images: MiniCPM-V 4.6's modules at downsample_mode "4x" (the window merger idle,
  one image token per 4 patches; hpcmem.models.minicpm_ocr).
- lfm3_vl (LFM3-VL) with images: gated 2-D convolution and grouped-query attention layers (LFM2's decoder layer) over
  Qwen-style patches, under a LayerNorm/GELU projector of each 2 × 2 block (hpcmem.models.lfm3_vl's
  `Lfm3VlTowerSpec`); its decoder LFM3's, learned (hpcmem.models.vlm_learned).
- pp_chart2table (PP-Chart2Table, GotOcr2ForConditionalGeneration) with images: GOT-OCR 2.0's SAM-style ViTDet tower
  (windowed and global attention with relative positions, a convolution neck) under a convolution and Linear
  projector (hpcmem.models.got_ocr2_tower's `GotOcr2TowerSpec`); a Qwen2 decoder.
- kimi_k25 (Kimi K2.5) with images: a SigLIP-shaped NaViT tower over each image's own patch grid with axial 2-D rope
  and a 2 x 2 merge into a LayerNorm/GELU projector (hpcmem.models.kimi_k25's `KimiK25TowerSpec`); its decoder
  DeepSeek-V3's, learned (hpcmem.models.vlm_learned).
- chameleon (Chameleon) with images: a VQ-VAE encoder turns each 512 × 512 crop into 1,024 codes the decoder embeds
  as words; nothing in it trains (the codes are integers) or takes adapters (hpcmem.models.chameleon's
  `ChameleonTowerSpec`); a learned decoder (LLaMA's layers with per-head q/k LayerNorms).
- fuyu (Fuyu) with images: no tower; `vision_embed_tokens`, one Linear over each raw 30 × 30 pixel patch
  (hpcmem.models.fuyu's `FuyuTowerSpec`); its decoder Persimmon's, learned (hpcmem.models.vlm_learned).
- cosmos3_edge (Cosmos3 Edge) with images: a packed SigLIP2 tower over each image's own patch grid (GLM-4.1V's
  smart_resize at 16 px patches) and a 2 x 2 LayerNorm/GELU patch merger (hpcmem.models.cosmos3_edge's
  `Cosmos3EdgeTowerSpec`); its decoder cosmos3_edge_text (Llama's shape, ReLU² fc1/fc2 MLP), learned
  (hpcmem.models.vlm_learned).
- granite4_vision (Granite 4 Vision) with images: a SigLIP tower over LLaVA-NeXT's anyres tiles, one Window Q-Former
  projector (a one-layer Blip2QFormer over each w × w window of a tap, q × q queries) per deepstack pair and four over
  the spatial layer, each projector's rows added to the image tokens before its text layer
  (hpcmem.models.granite4_vision's `Granite4VisionTowerSpec`); its decoder Granite's, learned
  (hpcmem.models.vlm_learned).
- deepseek_ocr2 (DeepSeek-OCR 2) with images: a SAM ViT-B tower and two downsampling convolutions under a Qwen2
  decoder run as an encoder over the features and learned queries, a Linear projector; a 1024 px global view and up
  to six 768 px tiles per image (hpcmem.models.deepseek_ocr2's `DeepseekOcr2TowerSpec`); its decoder
  deepseek_ocr2_text (DeepSeek-V2's routed and shared experts under multi-head attention), learned
  (hpcmem.models.vlm_learned).
- unlimited_ocr (Unlimited-OCR) with images: DeepSeek-OCR 2's SAM tower and convolutions under a CLIP encoder that
  takes the SAM features as its patch embeddings, a Linear projector over both; a 1024 px global view and up to 32
  640 px tiles per image (hpcmem.models.unlimited_ocr's `UnlimitedOcrTowerSpec`); its decoder unlimited_ocr_text
  (DeepSeek-OCR 2's under a reference sliding-window mask), learned (hpcmem.models.vlm_learned).
- mistral_large4 (Mistral Large 4) with images: Mistral 3's Pixtral tower and patch-merging projector at its own
  defaults (hpcmem.models.mistral_large4, hpcmem.models.pixtral's `PixtralTowerSpec`); its decoder mistral_large4_text
  (MLA attention, a sparse-attention indexer, routed and shared experts), learned (hpcmem.models.vlm_learned).
- qwen3_omni_moe_thinker (Qwen3-Omni's thinker) with images: Qwen3-VL's tower, merger and deepstack mergers (their
  linears named `mlp.0` / `mlp.2`, the deepstack mergers `merger_list.N`) beside an audio encoder no image runs, whose
  weights load and get no gradient (hpcmem.models.qwen3_omni_audio, VisionSpec.audio); its decoder Qwen3-MoE's
  layers (the qwen3_moe layout) with Qwen3OmniMoeTextConfig's defaults.
- ernie4_5_vl_moe (ERNIE-4.5-VL) with images: Qwen2-VL's LayerNorm blocks under a Linear patch embedding and a final
  LayerNorm, then a resampler (2 x 2 spatial MLP, the temporal MLP over each image's rows taken twice, a Linear to
  the text width, an RMSNorm) (hpcmem.models.ernie4_5_vl_moe's `Ernie45VlTowerSpec`); its decoder
  ernie4_5_vl_moe_text (ERNIE-4.5's MoE layers with text and vision experts), learned (hpcmem.models.vlm_learned).
- molmo2 (Molmo2) with images: a ViT over fixed 378² overlapping crops (a global one and up to max_crops of a canvas)
  whose chosen layers' outputs, concatenated, an adapter pools per 2 × 2 window (attention from the window's mean to
  its patches, then a SiLU-gated MLP) into the image tokens (hpcmem.models.molmo2's `Molmo2TowerSpec`); its decoder
  Molmo2TextModel (Qwen3-style layers, an embedding of vocab_size + additional_vocab_size rows), learned
  (hpcmem.models.vlm_learned).
- muse_glimmer (Muse Glimmer) with images: a NaViT tower of Kimi K2.5's layers over each image's own patch grid
  (Linear patch embedding of two repeated frames, a bilinearly resampled learned position table, 32 x 32-patch
  windows as Qwen2.5-VL's, axial 2-D rope), a 2 x 2 pixel shuffle into a GELU adapter and projection
  (hpcmem.models.muse_glimmer's `MuseGlimmerTowerSpec`); its decoder muse_glimmer_text, learned
  (hpcmem.models.vlm_learned).
- muse_spark (Muse Spark) with images: Muse Glimmer's image path beside an audio tower that loads and never runs on
  images (hpcmem.models.muse_spark's `MuseSparkTowerSpec`); its MoE decoder muse_spark_text, learned
  (hpcmem.models.vlm_learned).
- hunyuan_vl (HunyuanOCR) with images: a SigLIP-shaped tower over each image's own patch grid (Qwen2-VL's smart_resize
  at 16 px patches, a learned position grid resized per image) and a convolution patch merger (RMSNorm, 2 x 2 Conv2d,
  GELU, 1 x 1 Conv2d, a newline column, Linear, begin/end rows, RMSNorm) (hpcmem.models.hunyuan_vl's
  `HunYuanVLTowerSpec`); its decoder hunyuan_vl_text (HunYuan dense layers under 4-axis M-RoPE), learned
  (hpcmem.models.vlm_learned).
- hy_v4_vl (HY-V4-VL) with images: HunYuanVL's tower at its own widths under a merger of two convolutions and a newline
  column, no Linear (hpcmem.models.hy_v4_vl's `HYV4VLTowerSpec`); its decoder hy_v4_vl_text (HY-V4's MLA / DSA /
  hyper-connection MoE layers under 3-axis M-RoPE), learned (hpcmem.models.vlm_learned).
- minimax_m3_vl (MiniMax M3 VL) with images: CLIP encoder layers under Qwen2.5-VL's Conv3d patch embedding and a
  pre-layernorm, partial 3-D rotary attention per image, then a per-patch GELU MLP and a 2 x 2 merging GELU MLP
  (hpcmem.models.minimax_m3_vl's `MiniMaxM3VlTowerSpec`); its decoder minimax_m3_vl_text (sparse and dense MLP
  layers, routed and shared experts, a sparse-attention indexer), learned (hpcmem.models.vlm_learned).
- dots3_note (dots3 Note) with images: a tower of Qwen's frame (fused qkv with q/k RMSNorms, 2-D axial rotary,
  gated MLP, RMSNorms, no biases) under a Conv2d patch embedding with an RMSNorm, a final RMSNorm and Qwen2-VL's
  merger, beside an audio encoder that loads and never runs on images (hpcmem.models.dots3_note's
  `Dots3NoteTowerSpec`; dense vision layers only); its decoder dots3_note_text (MLA with a sparse-attention indexer
  and sliding-window MLA layers over routed and shared experts), learned (hpcmem.models.vlm_learned).
- step3p7 (Step 3.7 Flash) with images: a 728² global view and any 504² local crops of each image through a ViT
  (CLIP attention with an axial 2-D rope, layer scale, quick_gelu MLP), two stride-2 convolutions, one Linear to the
  text width (hpcmem.models.step3p7's `Step3p7TowerSpec`); its decoder Step3p7TextModel (step3p5), learned
  (hpcmem.models.vlm_learned).
- apertus1p5 (Apertus 1.5) with images: a VQ vision tokenizer (Chameleon's VQGAN encoder, a codebook Linear whose
  argmax is each 16 × 16 cell's code), the codes embedded by the text embedding, nothing in the tower reached by a
  gradient; an idle WavTokenizer audio encoder (hpcmem.models.apertus1p5's `Apertus1p5TowerSpec`); its decoder
  apertus1p5_text, learned (hpcmem.models.vlm_learned).
- inkling2 (Inkling 2) with images: a ViT over each image's own grid of 40 px cells (20 px patches, a class token per
  image, a bilinearly interpolated learned position grid, an axial 2-D rope, layer scale) and a 2 x 2 GELU MLP merger
  (hpcmem.models.inkling2's `Inkling2TowerSpec`); its decoder inkling2_text, learned (hpcmem.models.vlm_learned).
- emu3 (Emu3) with images: no encoder the language model reads; a VQ-VAE (Conv2d/GroupNorm res blocks, attention at
  the last level, temporal Conv3d) turns each image into codes its argmin leaves without a gradient, which the text
  model's own token embedding embeds, a row-end token per code row (hpcmem.models.emu3's `Emu3TowerSpec`); its
  decoder Emu3TextModel (Llama's layout, attention dropout 0.1), learned (hpcmem.models.vlm_learned).
- inkling_mm_model (Inkling) with images: a hierarchical MLP over each 40 × 40 × 2 patch (folds, Linears, RMSNorms
  and GELUs at widths planned from the patch), one image token per patch; an idle audio embedding
  (hpcmem.models.inkling's `InklingTowerSpec`); its decoder inkling_text, learned (hpcmem.models.vlm_learned).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.siglip import gemma3_vision_values
from hpcmem.models.clip_tower import ClipTowerSpec, clip_tower_from_config
from hpcmem.models.llava_next import llava_next_tower_from_config
from hpcmem.models.llava_onevision import onevision_tower_from_config
from hpcmem.models.video_llava import video_llava_tower_from_config
from hpcmem.models.vipllava import vipllava_tower_from_config
from hpcmem.models.idefics2 import IDEFICS2_TEXT_DEFAULTS, Idefics2TowerSpec, idefics2_tower_from_config
from hpcmem.models.granite_docling import GRANITE_DOCLING_TEXT_DEFAULTS, granite_docling_tower_from_config
from hpcmem.models.granite4_vision import granite4_vision_tower_from_config
from hpcmem.models.aria import ARIA_TEXT_DEFAULTS, aria_tower_from_config
from hpcmem.models.idefics3 import Idefics3TowerSpec, idefics3_tower_from_config
from hpcmem.models.internvl import internvl_tower_from_config
from hpcmem.models.aya_vision import aya_vision_tower_from_config
from hpcmem.models.cohere2_vision import cohere2_vision_tower_from_config
from hpcmem.models.deepseek_vl import deepseek_vl_tower_from_config
from hpcmem.models.deepseek_ocr2 import deepseek_ocr2_tower_from_config
from hpcmem.models.unlimited_ocr import unlimited_ocr_tower_from_config
from hpcmem.models.deepseek_vl_hybrid import deepseek_vl_hybrid_tower_from_config
from hpcmem.models.gemma4 import gemma4_tower_from_config, gemma4_unified_tower_from_config
from hpcmem.models.fuyu import FUYU_TEXT_DEFAULTS, fuyu_tower_from_config
from hpcmem.models.emu3 import emu3_tower_from_config
from hpcmem.models.glm4v import (GLM4V_MOE_TEXT_DEFAULTS, GLM4V_TEXT_DEFAULTS, GLM46V_TYPES, GLM_OCR_TEXT_DEFAULTS,
                                 GLM_OCR_TEXT_FORCED, MOE_TEXT_TYPE, glm4v_tower_from_config)
from hpcmem.models.janus import janus_tower_from_config
from hpcmem.models.chameleon import chameleon_tower_from_config
from hpcmem.models.lfm2_vl import lfm2_vl_tower_from_config
from hpcmem.models.lfm3_vl import lfm3_vl_tower_from_config
from hpcmem.models.got_ocr2_tower import PP_CHART2TABLE_TEXT_DEFAULTS, got_ocr2_tower_from_config
from hpcmem.models.minicpm_ocr import minicpm_ocr_tower_from_config
from hpcmem.models.minicpmv4_6 import minicpmv4_6_tower_from_config
from hpcmem.models.minicpmv4_7 import minicpmv4_7_tower_from_config
from hpcmem.models.kimi_k25 import kimi_k25_tower_from_config
from hpcmem.models.cosmos3_edge import cosmos3_edge_tower_from_config
from hpcmem.models.muse_glimmer import muse_glimmer_tower_from_config
from hpcmem.models.muse_spark import muse_spark_tower_from_config
from hpcmem.models.mistral_large4 import mistral_large4_tower_from_config
from hpcmem.models.ernie4_5_vl_moe import ernie45vl_tower_from_config
from hpcmem.models.molmo2 import molmo2_tower_from_config
from hpcmem.models.hunyuan_vl import hunyuan_vl_tower_from_config
from hpcmem.models.hy_v4_vl import hy_v4_vl_tower_from_config
from hpcmem.models.minimax_m3_vl import minimax_m3_tower_from_config
from hpcmem.models.step3p7 import step3p7_tower_from_config
from hpcmem.models.dots3_note import dots3_note_tower_from_config
from hpcmem.models.vision_spec import VisionSpec
from hpcmem.models.apertus1p5 import apertus1p5_tower_from_config
from hpcmem.models.inkling import inkling_tower_from_config
from hpcmem.models.inkling2 import inkling2_tower_from_config
from hpcmem.models.ovis2 import ovis2_tower_from_config
from hpcmem.models.paligemma import PaliGemmaTowerSpec, paligemma_tower_from_config
from hpcmem.models.tower_base import text_width
from hpcmem.models.mllama import MllamaTowerSpec, mllama_tower_from_config
from hpcmem.models.pixtral import MISTRAL3_TEXT_DEFAULTS, PixtralTowerSpec, pixtral_tower_from_config
from hpcmem.models.qianfan_ocr import qianfan_tower_from_config
from hpcmem.models.qwen2_5_omni import QWEN2_5_OMNI_TEXT_DEFAULTS, AudioTower, audio_tower_from_config
from hpcmem.models.lighton_ocr import LIGHTON_TEXT_DEFAULTS, lighton_tower_from_config
from hpcmem.models.paddleocr_vl import PADDLEOCR_TEXT_DEFAULTS, paddleocr_tower_from_config
from hpcmem.models.video_llama_3 import video_llama_3_tower_from_config
from hpcmem.models.qwen3_omni_audio import QWEN3_OMNI_TEXT_DEFAULTS, AudioEncoderSpec, audio_spec_from_config



@dataclass(frozen=True)
class TowerLayout:
    """What differs between the covered towers: the decoder layout hpcmem.models.config builds the text part with,
    the vision_config class defaults for omitted keys, the config's own key names mapped onto VisionSpec's, the norm
    ("rms": Qwen2RMSNorm-style, weight only; "layer": torch LayerNorm, weight and bias) and the MLP ("gated":
    gate/up/down_proj; "fc": fc1 → act → fc2)."""

    text: str
    defaults: dict[str, Any]
    aliases: dict[str, str]
    norm: str
    mlp: str
    fc_names: tuple[str, str] = ("mlp.fc1", "mlp.fc2")         # a two-linear block MLP's module names
    merger_names: tuple[str, str] = ("mlp.0", "mlp.2")         # the merger's two linears, below `merger.`
    patch_bias: bool = False                                   # the Conv3d patch embedding's bias
    # the tower names its patch embedding as its input embeddings (`_input_embed_layer = "patch_embed"`), which
    # `enable_input_require_grads` then hooks (modeling_utils.py); Qwen3VLVisionModel names none
    hooked_input: bool = True
    family: str = "qwen"        # "siglip": Gemma 3's tower and projector (hpcmem.models.siglip reads its config)
    tie_default: bool = False   # the outer config class's tie_word_embeddings default (Gemma3Config: True)
    # the text config the outer config class builds when the config.json names none (its sub_configs_defaults
    # init_kwargs; None: the flat Hub layout's top-level keys, or the text class's own defaults)
    text_defaults: dict[str, Any] | None = None
    # the text config class's own defaults where they differ from those of the decoder layout hpcmem builds it with
    # (`text`): what a key the text_config omits, or an absent text_config, takes (None: the layout's)
    text_class_defaults: dict[str, Any] | None = None
    # text config keys the text model's classes ignore, set whatever the text_config says (GlmOcrTextAttention builds
    # q/k/v_proj without bias, hpcmem.models.glm4v `GLM_OCR_TEXT_FORCED`)
    text_forced: dict[str, Any] | None = None
    # text config keys left out of the text part: fields the decoder hpcmem builds it as does not have (GLM-4.5V's
    # router_aux_loss_coef: Glm4MoeConfig names none; the value TRL reads is checked where the job is,
    # hpcmem.job.image_rules `aux_loss_problems`)
    text_dropped: tuple[str, ...] = ()
    # Whether lm_head is the input embedding's weight (transformers 5.24): the outer config's tie_word_embeddings
    # decides, tie_default when config.json names none at the top — modeling_utils.py
    # `PreTrainedModel.get_expanded_tied_weights_keys` reads `self.config.tie_word_embeddings` of the composite model,
    # whatever text_config names. `tie_from_text`: the config class's backward-compatibility step forwards a true
    # text_config.tie_word_embeddings to an outer false (configuration_llava.py `LlavaConfig.__post_init__`,
    # configuration_qwen2_5_vl.py `Qwen2_5_VLConfig.__post_init__`: pre-v5 saves kept it inside text_config).
    # `ties` False: the class declares no tied weights (modeling_mllama.py: `_tied_weights_keys` commented out).
    tie_from_text: bool = False
    # an audio encoder beside the tower (`VisionSpec.audio`), which an image batch never runs: "qwen3_omni"
    # (hpcmem.models.qwen3_omni_audio), "qwen2_5_omni" (hpcmem.models.qwen2_5_omni); "": none
    audio: str = ""
    ties: bool = True
    # what `tie_from_text` reads when text_config omits the flag (or is absent): the text config class's default
    # (ShieldGemma2Config.__post_init__ reads `getattr(self.text_config, "tie_word_embeddings", True)` of a
    # Gemma3TextConfig, whose default is True)
    text_tie_default: bool = False
    # the config class builds text_config from a flat config.json's top-level keys, over the text config class's
    # defaults (`text_class_defaults`), the tie flag staying the outer config's (PaddleOCRVLConfig.__post_init__: "Hub
    # configs are saved as flat dicts")
    flat_text: bool = False
    # Qwen3-VL's deepstack mergers built from vision_config.deepstack_visual_indexes; False: the tower deletes them
    # whatever the config says (modular_qwen3_5.py `Qwen3_5VisionModel.__init__`: `del self.deepstack_merger_list`)
    deepstack: bool = True
    # a Linear(out_hidden_size → the text width, with bias) after the merger, whose output the image tokens take
    # (HyperCLOVAX Vision V2's `projector`): the text config class's hidden_size, what an omitted
    # text_config.hidden_size takes; 0: none (the merger's output is the image tokens' embeddings)
    projector_text_width: int = 0


# configuration_qwen3_vl_moe.py `Qwen3VLMoeTextConfig`'s field defaults (no norm_topk_prob: modeling_qwen3_vl_moe.py
# `Qwen3VLMoeTextTopKRouter.forward` always renormalizes the top-k weights); its tie_word_embeddings is left out: the
# outer Qwen3VLMoeConfig's (False) ties the head or not, whatever the text config says (measured on the meta model)
QWEN3_VL_MOE_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_act": "silu", "max_position_embeddings": 128000,
    "attention_bias": False, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
    "num_experts_per_tok": 4, "num_experts": 60, "mlp_only_layers": None, "head_dim": None}
# config.json spellings the vision config classes map onto their own names (their attribute_map, and `in_chans`, which
# Hub configs of Qwen2-VL and Qwen2.5-VL carry beside the class's `in_channels`)
_COMMON_ALIASES = {"num_attention_heads": "num_heads", "num_hidden_layers": "depth", "in_chans": "in_channels"}
# the trainers whose images hpcmem estimates for each type — the one rule of which trainer takes which type's images:
# hpcmem.job.image_rules refuses every other pair — and those of them a case matrix traced (estimator/cases/vlm-*.yaml);
# an estimate of one not traced says so
IMAGE_TRAINERS_ALLOWED = {"qwen2_vl": ("sft", "dpo", "grpo", "rloo"), "qwen2_5_vl": ("sft", "dpo", "grpo", "rloo"),
                          "qwen3_vl": ("sft", "dpo", "grpo", "rloo"), "gemma3": ("sft", "dpo", "grpo", "rloo"),
                          "qwen3_vl_moe": ("sft", "dpo"),
                          "llava": ("sft", "dpo"), "smolvlm": ("sft", "dpo"), "idefics3": ("sft",),
                          "paligemma": ("sft",), "mllama": ("sft",), "llava_next": ("sft", "dpo"),
                          "llava_onevision": ("sft", "dpo"), "llava_next_video": ("sft", "dpo"),
                          "mistral3": ("sft", "dpo"),
                          "internvl": ("sft", "dpo"),
                          "shieldgemma2": ("sft",), "cosmos3_omni": ("sft", "dpo", "rloo"),
                          "vipllava": ("sft", "dpo"), "video_llava": ("sft", "dpo"), "lighton_ocr": ("sft", "dpo"),
                          "deepseek_vl": ("sft", "dpo"), "deepseek_vl_hybrid": ("sft", "dpo"), "idefics2": ("sft", "dpo"),
                          "qianfan_ocr": ("sft", "dpo"), "janus": ("sft", "dpo"), "video_llama_3": ("sft",),
                          "ovis2": ("sft", "dpo"), "aya_vision": ("sft", "dpo"),
                          "cohere2_vision": ("sft", "dpo"), "qwen3_5": ("sft", "dpo", "grpo", "rloo"),
                          "qwen3_5_moe": ("sft", "dpo"), "qwen4_exp": ("sft", "dpo"),
                          "exaone4_5": ("sft", "dpo", "grpo", "rloo"), "hyperclovax_vision_v2": ("sft", "dpo"),
                          "qwen2_5_omni_thinker": ("sft", "dpo", "grpo", "rloo"),
                          "granite_docling": ("sft", "dpo"), "aria": ("sft", "dpo"),
                          "gemma4": ("sft", "dpo"), "gemma4_unified": ("sft", "dpo"), "glm4v": ("sft", "dpo"),
                          "glm46v": ("sft", "dpo"), "glmga": ("sft", "dpo"), "glm_ocr": ("sft", "dpo"),
                          "lfm2_vl": ("sft", "dpo"), "cohere_compass": ("sft", "dpo"), "glm4v_moe": ("sft", "dpo"),
                          "paddleocr_vl": ("sft", "dpo"), "minicpmv4_6": ("sft", "dpo"),
                          "minicpmv4_7": ("sft", "dpo"), "minicpm_ocr": ("sft", "dpo"),
                          "lfm3_vl": ("sft", "dpo"), "granite4_vision": ("sft", "dpo"),
                          "kimi_k25": ("sft", "dpo"),
                          "fuyu": ("sft", "dpo"), "cosmos3_edge": ("sft", "dpo"), "emu3": ("sft", "dpo"),
                          "mistral_large4": ("sft", "dpo"), "ernie4_5_vl_moe": ("sft",), "molmo2": ("sft", "dpo"),
                          "step3p7": ("sft", "dpo"), "apertus1p5": ("sft", "dpo"),
                          "inkling2": ("sft", "dpo"), "inkling_mm_model": ("sft", "dpo"),
                          "pp_chart2table": ("sft",), "qwen3_omni_moe_thinker": ("sft", "dpo"),
                          "muse_glimmer": ("sft", "dpo"), "muse_spark": ("sft", "dpo"), "hunyuan_vl": ("sft", "dpo"),
                          "hy_v4_vl": ("sft", "dpo"), "minimax_m3_vl": ("sft", "dpo"),
                          "deepseek_ocr2": ("sft", "dpo"), "unlimited_ocr": ("sft", "dpo"),
                          "dots3_note": ("sft", "dpo"), "chameleon": ("sft", "dpo")}
# the allowed pairs no case matrix has traced yet (an estimate of one says so): none today
IMAGE_TRAINERS_UNTRACED: dict[str, tuple[str, ...]] = {}
IMAGE_TRAINERS_TRACED = {t: tuple(x for x in allowed if x not in IMAGE_TRAINERS_UNTRACED.get(t, ()))
                         for t, allowed in IMAGE_TRAINERS_ALLOWED.items()}
# model_type of the outer config → its tower's layout
VISION_LANGUAGE: dict[str, TowerLayout] = {
    # configuration_qwen2_5_vl.py `Qwen2_5_VLVisionConfig`
    "qwen2_5_vl": TowerLayout(text="qwen2", tie_from_text=True, defaults={
        "depth": 32, "hidden_size": 3584, "hidden_act": "silu", "intermediate_size": 3420, "num_heads": 16,
        "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
        "out_hidden_size": 3584, "fullatt_block_indexes": (7, 15, 23, 31)}, aliases=_COMMON_ALIASES, norm="rms",
        mlp="gated"),
    # configuration_qwen2_vl.py `Qwen2VLVisionConfig`: `embed_dim` is the tower width, `hidden_size` the merger's
    # output; the MLP width is int(embed_dim · mlp_ratio) (`Qwen2VLVisionBlock.__init__`); no window attention
    "qwen2_vl": TowerLayout(text="qwen2", tie_from_text=True, defaults={
        "depth": 32, "embed_dim": 1280, "hidden_size": 3584, "hidden_act": "quick_gelu", "mlp_ratio": 4,
        "num_heads": 16, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        aliases=_COMMON_ALIASES, norm="layer", mlp="fc"),
    # configuration_qwen3_vl.py `Qwen3VLVisionConfig`; modeling_qwen3_vl.py `Qwen3VLVisionMLP` (linear_fc1/2),
    # `Qwen3VLVisionPatchMerger` (linear_fc1/2), `Qwen3VLVisionPatchEmbed` (Conv3d bias=True)
    "qwen3_vl": TowerLayout(text="qwen3", defaults={
        "depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304,
        "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "out_hidden_size": 3584, "num_position_embeddings": 2304, "deepstack_visual_indexes": (8, 16, 24),
        "window_size": 0}, aliases=_COMMON_ALIASES, norm="layer", mlp="fc",
        fc_names=("mlp.linear_fc1", "mlp.linear_fc2"), merger_names=("linear_fc1", "linear_fc2"), patch_bias=True,
        hooked_input=False),
    # configuration_gemma3.py `Gemma3Config` (its vision_config a SiglipVisionConfig: hpcmem.models.siglip);
    # modeling_siglip.py SiglipVisionModel `_input_embed_layer = "patch_embedding"`: enable_input_require_grads hooks it
    "gemma3": TowerLayout(text="gemma3_text", defaults={}, aliases={}, norm="layer", mlp="fc", merger_names=("", ""),
                          patch_bias=True, family="siglip", tie_default=True),
    # models/llava: a CLIP tower and a two-linear projector (hpcmem.models.clip_tower), a Llama decoder; only `text`
    # is read (vision_spec_from_config hands the vision part to clip_tower_from_config)
    "llava": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc", tie_from_text=True),
    # models/llava_next: llava's tower and projector with anyres tiles (hpcmem.models.llava_next); LlavaNextConfig's
    # text_config default: llama
    "llava_next": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc"),
    # models/llava_next_video: for images llava_next's tower, projector and tiles (its video pooler runs on videos
    # only); LlavaNextVideoConfig's text_config default: llama
    "llava_next_video": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc",
                                    tie_from_text=True),
    # models/llava_onevision: a SigLIP tower under llava_next's projector and tiles (hpcmem.models.llava_onevision);
    # LlavaOnevisionConfig's text_config default: qwen2
    "llava_onevision": TowerLayout(text="qwen2", defaults={}, aliases={}, norm="layer", mlp="fc",
                                   tie_from_text=True),
    # models/smolvlm, models/idefics3: hpcmem.models.idefics3 reads the vision part; the decoder a Llama
    "smolvlm": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc"),
    "idefics3": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc"),
    # models/granite_docling (modular_granite_docling.py): hpcmem.models.granite_docling reads the vision part;
    # GraniteDoclingConfig's text_config is always a GraniteDoclingTextConfig(GraniteConfig) (`sub_configs_defaults`,
    # class defaults when omitted), whose GraniteDoclingTextModel(GraniteModel) runs Granite's layers: the granite
    # layout (a learned type: hpcmem.models.vlm_learned) with that class's defaults; GraniteDoclingConfig
    # .tie_word_embeddings True
    "granite_docling": TowerLayout(text="granite", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True,
                                   text_class_defaults=GRANITE_DOCLING_TEXT_DEFAULTS),
    # models/granite4_vision (modular_granite4_vision.py): hpcmem.models.granite4_vision reads the vision part and
    # the projectors; Granite4VisionConfig's text_config is always a Granite4VisionTextConfig(GraniteConfig)
    # (`sub_configs_defaults`, GraniteConfig's defaults when omitted), whose Granite4VisionTextModel(GraniteModel) runs
    # Granite's layers: the granite layout (a learned type: hpcmem.models.vlm_learned); tie_word_embeddings False
    "granite4_vision": TowerLayout(text="granite", defaults={}, aliases={}, norm="layer", mlp="fc",
                                   text_defaults={}),
    # models/aria (modular_aria.py): hpcmem.models.aria reads the vision part; AriaConfig's text_config is always an
    # AriaTextConfig(LlamaConfig) (`sub_configs_defaults`), whose AriaTextModel runs Llama attention and
    # AriaTextMoELayer (routed and shared experts): no family descriptor, a learned profile (hpcmem.models
    # .vlm_learned) with that class's defaults; AriaConfig.tie_word_embeddings False
    "aria": TowerLayout(text="aria_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                        text_class_defaults=ARIA_TEXT_DEFAULTS),
    # models/paligemma: hpcmem.models.paligemma reads the vision part; the decoder is what text_config names
    # (PaliGemmaConfig's default: gemma); PaliGemmaConfig.tie_word_embeddings True
    "paligemma": TowerLayout(text="gemma", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True),
    # models/mllama: hpcmem.models.mllama reads the vision part and the cross-attention layers' extras; the decoder's
    # linears, norms and MLP are a Llama's (MllamaTextSelfAttention / MllamaTextMLP, no biases)
    "mllama": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc", ties=False),
    # models/mistral3: hpcmem.models.pixtral reads the vision part; the decoder is what text_config names
    # (Mistral3Config's default: mistral); Mistral3Config.tie_word_embeddings True
    "mistral3": TowerLayout(text="mistral", defaults={}, aliases={}, norm="rms", mlp="gated", tie_default=True,
                            text_defaults=MISTRAL3_TEXT_DEFAULTS),
    # models/internvl: hpcmem.models.internvl reads the vision part; the decoder is what text_config names
    # (InternVLConfig's default: qwen2); InternVLConfig.tie_word_embeddings True
    "internvl": TowerLayout(text="qwen2", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True),
    # models/vipllava: llava's tower with several feature layers and a LayerNorm in the projector
    # (hpcmem.models.vipllava); models/video_llava: llava's image path beside an idle video tower
    # (hpcmem.models.video_llava); both decoders what text_config names (their configs' default: llama), neither
    # config forwards a text_config tie flag (no __post_init__)
    "vipllava": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc"),
    "video_llava": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc"),
    # models/lighton_ocr: hpcmem.models.lighton_ocr reads the vision part; the decoder is what text_config names
    # (LightOnOcrConfig's default: qwen3); LightOnOcrConfig.tie_word_embeddings True
    "lighton_ocr": TowerLayout(text="qwen3", defaults={}, aliases={}, norm="rms", mlp="gated", tie_default=True,
                               text_defaults=LIGHTON_TEXT_DEFAULTS),
    # models/deepseek_vl: hpcmem.models.deepseek_vl reads the vision part; the decoder is what text_config names
    # (DeepseekVLConfig's default: llama); DeepseekVLConfig.tie_word_embeddings True
    "deepseek_vl": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True),
    # models/deepseek_vl_hybrid: hpcmem.models.deepseek_vl_hybrid reads both towers and the aligner; the decoder is
    # what text_config names (DeepseekVLHybridConfig's default: llama); tie_word_embeddings True
    "deepseek_vl_hybrid": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc",
                                      tie_default=True),
    # models/aya_vision: hpcmem.models.aya_vision reads the vision part; the decoder is what text_config names
    # (AyaVisionConfig's default: cohere2, a learned type: hpcmem.models.vlm_learned); tie_word_embeddings True
    "aya_vision": TowerLayout(text="cohere2", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True),
    # models/cohere2_vision: hpcmem.models.cohere2_vision reads the vision part; the decoder is what text_config
    # names (Cohere2VisionConfig's default: cohere2, learned as Aya Vision's); tie_word_embeddings True
    "cohere2_vision": TowerLayout(text="cohere2", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True),
    # models/gemma4: hpcmem.models.gemma4 reads the vision part; Gemma4Config's text_config is always a
    # Gemma4TextConfig (`sub_configs_defaults`, class defaults when omitted), a learned type
    # (hpcmem.models.vlm_learned); Gemma4Config.tie_word_embeddings True
    "gemma4": TowerLayout(text="gemma4_text", defaults={}, aliases={}, norm="rms", mlp="gated", tie_default=True,
                          text_defaults={}),
    # models/gemma4_unified: hpcmem.models.gemma4 reads its encoder-free vision embedder; Gemma4UnifiedConfig's
    # text_config is always a Gemma4UnifiedTextConfig (class defaults when omitted), a learned type
    # (hpcmem.models.vlm_learned); Gemma4UnifiedConfig.tie_word_embeddings True
    "gemma4_unified": TowerLayout(text="gemma4_unified_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                                  tie_default=True, text_defaults={}),
    # models/lfm2_vl: hpcmem.models.lfm2_vl reads the vision part; the decoder is what text_config names
    # (Lfm2VlConfig's default: lfm2, a learned type: hpcmem.models.vlm_learned; an omitted text_config is Lfm2Config's
    # defaults); Lfm2VlConfig.tie_word_embeddings True
    "lfm2_vl": TowerLayout(text="lfm2", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True,
                           text_defaults={}),
    # models/minicpmv4_6: hpcmem.models.minicpmv4_6 reads the vision part; MiniCPMV4_6Model builds the decoder with
    # `AutoModel.from_config(config.text_config)` (`sub_configs_defaults`: qwen3_5_text, Qwen3_5TextConfig's class
    # defaults when omitted), a learned type (hpcmem.models.vlm_learned); MiniCPMV4_6Config.tie_word_embeddings False
    "minicpmv4_6": TowerLayout(text="qwen3_5_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                               text_defaults={}),
    # models/minicpmv4_7: MiniCPMV4_7Config subclasses MiniCPMV4_6Config (the same sub-configs and defaults,
    # tie_word_embeddings False), MiniCPMV4_7Model builds MiniCPMV4_6Model's modules (modular_minicpmv4_7.py)
    "minicpmv4_7": TowerLayout(text="qwen3_5_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                               text_defaults={}),
    # models/minicpm_ocr: MiniCPMOcrConfig keeps 4.6's sub-configs and defaults but downsample_mode "4x" and
    # tie_word_embeddings True; MiniCPMOcrModel is MiniCPMV4_6Model (modular_minicpm_ocr.py)
    "minicpm_ocr": TowerLayout(text="qwen3_5_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                               tie_default=True, text_defaults={}),
    # models/lfm3_vl: hpcmem.models.lfm3_vl reads the vision part; Lfm3VlModel builds the decoder with
    # `AutoModel.from_config(config.text_config)` (`sub_configs_defaults`: lfm3, Lfm3Config's class defaults when
    # omitted), a learned type (hpcmem.models.vlm_learned); Lfm3VlConfig.tie_word_embeddings True
    "lfm3_vl": TowerLayout(text="lfm3", defaults={}, aliases={}, norm="rms", mlp="gated", tie_default=True,
                           text_defaults={}),
    # models/kimi_k25: hpcmem.models.kimi_k25 reads the vision part; Kimi_K25Model builds the decoder with
    # `AutoModel.from_config(config.text_config)` (`sub_configs_defaults`: deepseek_v3, DeepseekV3Config's class
    # defaults when omitted), a learned type (hpcmem.models.vlm_learned); Kimi_K25Config.tie_word_embeddings True
    "kimi_k25": TowerLayout(text="deepseek_v3", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True,
                            text_defaults={}),
    # models/fuyu: hpcmem.models.fuyu reads the image path (vision_embed_tokens); FuyuModel builds the decoder with
    # `AutoModel.from_config(config.text_config)`, persimmon (`sub_configs_defaults`, its init_kwargs when omitted;
    # FuyuConfig.__post_init__ builds it from a flat config.json's top-level keys), a learned type
    # (hpcmem.models.vlm_learned); FuyuConfig.tie_word_embeddings False
    "fuyu": TowerLayout(text="persimmon", defaults={}, aliases={}, norm="layer", mlp="fc",
                        text_class_defaults=FUYU_TEXT_DEFAULTS, flat_text=True),
    # models/chameleon: hpcmem.models.chameleon reads the image path (the VQ-VAE in `vq_config`); the decoder's keys
    # are ChameleonConfig's own, flat at the top (no text config class; hpcmem names the decoder's chameleon_text):
    # ChameleonModel's layers (LLaMA's with per-head q/k LayerNorms), a learned type (hpcmem.models.vlm_learned: hpcmem.trace.text_heads gives it a
    # causal-LM class without the VQ-VAE); ChameleonConfig.tie_word_embeddings False
    "chameleon": TowerLayout(text="chameleon_text", defaults={}, aliases={}, norm="layer", mlp="fc", flat_text=True),
    # models/cosmos3_edge: hpcmem.models.cosmos3_edge reads the vision part; Cosmos3EdgeModel (Qwen2VLModel's
    # __init__) builds the decoder with `AutoModel.from_config(config.text_config)` (`sub_configs_defaults`:
    # cosmos3_edge_text, Cosmos3EdgeTextConfig's class defaults when omitted), a learned type
    # (hpcmem.models.vlm_learned); Cosmos3EdgeConfig.tie_word_embeddings False, and the head is never tied:
    # `Cosmos3EdgeForConditionalGeneration._tied_weights_keys = {}` (modular_cosmos3_edge.py), whatever the flags say
    "cosmos3_edge": TowerLayout(text="cosmos3_edge_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                                text_defaults={}, ties=False),
    # models/muse_glimmer: hpcmem.models.muse_glimmer reads the vision part; MuseGlimmerModel builds the decoder with
    # `AutoModel.from_config(config.text_config)` (`sub_configs_defaults`: muse_glimmer_text, MuseGlimmerTextConfig's
    # class defaults when omitted), a learned type (hpcmem.models.vlm_learned); MuseGlimmerConfig declares no
    # tie_word_embeddings (unset: the head stays untied), and a config.json's top-level true ties it (measured on
    # the meta model), a text_config's does not
    "muse_glimmer": TowerLayout(text="muse_glimmer_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                                text_defaults={}),
    # models/muse_spark: hpcmem.models.muse_spark reads the vision and audio parts; MuseSparkModel (MuseGlimmerModel's
    # __init__) builds the decoder with `AutoModel.from_config(config.text_config)` (`sub_configs_defaults`:
    # muse_spark_text, MuseSparkTextConfig's class defaults when omitted), a learned type (hpcmem.models.vlm_learned);
    # the head is never tied: `MuseSparkForConditionalGeneration._tied_weights_keys` is deleted (modular_muse_spark.py),
    # whatever tie_word_embeddings says
    "muse_spark": TowerLayout(text="muse_spark_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                              text_defaults={}, ties=False),
    # models/dots3_note: hpcmem.models.dots3_note reads the vision and audio parts; Dots3NoteModel builds the decoder
    # `Dots3NoteTextModel(config.text_config)` (`sub_configs_defaults`: dots3_note_text; Dots3NoteConfig.__post_init__
    # builds it from a flat config.json's top-level keys when it names none), a learned type
    # (hpcmem.models.vlm_learned); Dots3NoteConfig.tie_word_embeddings False (`_tied_weights_keys` ties lm_head when
    # the outer flag is true)
    "dots3_note": TowerLayout(text="dots3_note_text", defaults={}, aliases={}, norm="rms", mlp="gated",
                              flat_text=True),
    # models/mistral_large4: hpcmem.models.mistral_large4 reads the vision part (Pixtral, as mistral3's);
    # MistralLarge4Config's text_config is always a MistralLarge4TextConfig (`sub_configs_defaults`, its class defaults
    # when omitted), which Mistral3Model's __init__ builds with `AutoModel.from_config`: MistralLarge4TextModel, a
    # learned type (hpcmem.models.vlm_learned); MistralLarge4Config.tie_word_embeddings False
    "mistral_large4": TowerLayout(text="mistral_large4_text", defaults={}, aliases={}, norm="rms", mlp="gated",
                                  text_defaults={}),
    # models/ernie4_5_vl_moe: hpcmem.models.ernie4_5_vl_moe reads the vision part; Ernie4_5_VLMoeModel (Qwen2VLModel's
    # __init__) builds the decoder with `AutoModel.from_config(config.text_config)`, Ernie4_5_VLMoeTextModel
    # (`sub_configs_defaults`: Ernie4_5_VLMoeTextConfig's class defaults when omitted), a learned type
    # (hpcmem.models.vlm_learned); Ernie4_5_VLMoeConfig.tie_word_embeddings True
    "ernie4_5_vl_moe": TowerLayout(text="ernie4_5_vl_moe_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                                   tie_default=True, text_defaults={}),
    # models/molmo2: hpcmem.models.molmo2 reads the vision and adapter parts; Molmo2Model builds the decoder as
    # `Molmo2TextModel(config.text_config)` (`sub_configs_defaults`: molmo2_text, Molmo2TextConfig's class defaults
    # when omitted), a learned type (hpcmem.models.vlm_learned: hpcmem.trace.text_heads gives it a causal-LM head);
    # Molmo2Config.tie_word_embeddings False, and `Molmo2ForConditionalGeneration` declares no tied weights (its
    # embedding has additional_vocab_size rows more than lm_head)
    "molmo2": TowerLayout(text="molmo2_text", defaults={}, aliases={}, norm="layer", mlp="fc", text_defaults={},
                          ties=False),
    # models/hunyuan_vl: hpcmem.models.hunyuan_vl reads the vision part; HunYuanVLModel builds the decoder with
    # `HunYuanVLTextModel._from_config(config.text_config)` (`sub_configs_defaults`: hunyuan_vl_text,
    # HunYuanVLTextConfig's class defaults when omitted), a learned type (hpcmem.models.vlm_learned);
    # HunYuanVLConfig.tie_word_embeddings True, and `__post_init__` sets it True from a true text flag (the text
    # config class's own default True); `_tied_weights_keys` ties lm_head to the token embeddings
    "hunyuan_vl": TowerLayout(text="hunyuan_vl_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                              tie_default=True, tie_from_text=True, text_tie_default=True, text_defaults={}),
    # models/hy_v4_vl: hpcmem.models.hy_v4_vl reads the vision part; HYV4VLModel (Qwen2VLModel's __init__) builds the
    # decoder with `AutoModel.from_config(config.text_config)` (`sub_configs_defaults`: hy_v4_vl_text,
    # HYV4VLTextConfig's class defaults when omitted), a learned type (hpcmem.models.vlm_learned);
    # HYV4VLConfig.tie_word_embeddings False, no __post_init__ reading the text flag (whose default is False too)
    "hy_v4_vl": TowerLayout(text="hy_v4_vl_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                            text_defaults={}),
    # models/minimax_m3_vl: hpcmem.models.minimax_m3_vl reads the vision part; MiniMaxM3VLModel builds the decoder as
    # `MiniMaxM3VLTextModel(config.text_config)` (`sub_configs_defaults`: MiniMaxM3VLTextConfig's class defaults when
    # omitted), a learned type (hpcmem.models.vlm_learned); MiniMaxM3VLConfig.tie_word_embeddings False, set True by
    # `__post_init__` when the text config's is
    "minimax_m3_vl": TowerLayout(text="minimax_m3_vl_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                                 text_defaults={}, tie_from_text=True),
    # models/deepseek_ocr2: hpcmem.models.deepseek_ocr2 reads the vision part (SAM, its convolutions, the Qwen2
    # encoder and its queries) and the projector; DeepseekOcr2Config's text_config is always a DeepseekOcr2TextConfig
    # (`sub_configs_defaults`, its class defaults when omitted), DeepseekOcr2TextModel, a learned type
    # (hpcmem.models.vlm_learned); DeepseekOcr2Config.tie_word_embeddings False
    "deepseek_ocr2": TowerLayout(text="deepseek_ocr2_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                                 text_defaults={}),
    # models/unlimited_ocr: hpcmem.models.unlimited_ocr reads the vision part (SAM, its convolutions, a CLIP encoder
    # over the SAM features) and the projector; UnlimitedOcrConfig's text_config is always an UnlimitedOcrTextConfig
    # (`sub_configs_defaults`, its class defaults when omitted), UnlimitedOcrTextModel, a learned type
    # (hpcmem.models.vlm_learned); UnlimitedOcrConfig.tie_word_embeddings False
    "unlimited_ocr": TowerLayout(text="unlimited_ocr_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                                 text_defaults={}),
    # models/step3p7: hpcmem.models.step3p7 reads the vision part; Step3p7Model builds the decoder as
    # `Step3p7TextModel(config.text_config)` (`sub_configs_defaults`: step3p5, Step3p7TextConfig's class defaults when
    # omitted), a learned type (hpcmem.models.vlm_learned: hpcmem.trace.text_heads gives it a causal-LM head);
    # Step3p7Config declares no tie_word_embeddings (unset: the head stays untied, measured on the meta model)
    "step3p7": TowerLayout(text="step3p5", defaults={}, aliases={}, norm="layer", mlp="fc", text_defaults={}),
    # models/apertus1p5: hpcmem.models.apertus1p5 reads the vision part; Apertus1p5Model builds the decoder as
    # `Apertus1p5TextModel(config.text_config)` (`sub_configs_defaults`: apertus1p5_text, Apertus1p5TextConfig's class
    # defaults when omitted), a learned type (hpcmem.models.vlm_learned); Apertus1p5Config.tie_word_embeddings False
    "apertus1p5": TowerLayout(text="apertus1p5_text", defaults={}, aliases={}, norm="layer", mlp="fc",
                              text_defaults={}),
    # models/inkling2: hpcmem.models.inkling2 reads the vision part; Inkling2Model builds the decoder as
    # `Inkling2TextModel(config.text_config)` (`sub_configs_defaults`: inkling2_text, Inkling2TextConfig's class
    # defaults when omitted), a learned type (hpcmem.models.vlm_learned); the head is never tied:
    # `Inkling2ForConditionalGeneration._tied_weights_keys = {}` and its lm_head has unpadded_vocab_size rows
    "inkling2": TowerLayout(text="inkling2_text", defaults={}, aliases={}, norm="layer", mlp="fc", text_defaults={},
                            ties=False),
    # models/emu3: hpcmem.models.emu3 reads the VQ-VAE; Emu3Model builds the decoder as
    # `Emu3TextModel._from_config(config.text_config)` (`sub_configs_defaults`: emu3_text_model, Emu3TextConfig's class
    # defaults when omitted), a learned type (hpcmem.models.vlm_learned); Emu3Config.tie_word_embeddings False
    "emu3": TowerLayout(text="emu3_text_model", defaults={}, aliases={}, norm="layer", mlp="fc", text_defaults={}),
    # models/inkling: hpcmem.models.inkling reads the vision and audio parts; InklingModel builds the decoder as
    # `InklingTextModel(config.text_config)` (`sub_configs_defaults`: inkling_text, InklingTextConfig's class defaults
    # when omitted), a learned type (hpcmem.models.vlm_learned); the head is never tied:
    # `InklingForConditionalGeneration._tied_weights_keys = {}`
    "inkling_mm_model": TowerLayout(text="inkling_text", defaults={}, aliases={}, norm="rms", mlp="fc",
                                    text_defaults={}, ties=False),
    # models/pp_chart2table: hpcmem.models.got_ocr2_tower reads the vision part; GotOcr2Model builds the decoder with
    # `AutoModel.from_config(config.text_config)` (PPChart2TableConfig's default: qwen2 at `sub_configs_defaults`'
    # init_kwargs when omitted); PPChart2TableConfig.tie_word_embeddings True
    "pp_chart2table": TowerLayout(text="qwen2", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True,
                                  text_defaults=PP_CHART2TABLE_TEXT_DEFAULTS),
    # models/janus: hpcmem.models.janus reads the vision and generation parts; the decoder is what text_config names
    # (JanusConfig's default: llama); JanusConfig.tie_word_embeddings True
    "janus": TowerLayout(text="llama", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True),
    # models/idefics2: hpcmem.models.idefics2 reads the vision part; the decoder is what text_config names
    # (Idefics2Config's default: mistral, IDEFICS2_TEXT_DEFAULTS); Idefics2Config.tie_word_embeddings False
    "idefics2": TowerLayout(text="mistral", defaults={}, aliases={}, norm="layer", mlp="fc",
                            text_defaults=IDEFICS2_TEXT_DEFAULTS),
    # models/qianfan_ocr: InternVL's tower, projector and tiles (hpcmem.models.qianfan_ocr); the decoder is what
    # text_config names (QianfanOCRConfig's default: qwen3); QianfanOCRConfig.tie_word_embeddings False
    "qianfan_ocr": TowerLayout(text="qwen3", defaults={}, aliases={}, norm="layer", mlp="fc"),
    # models/video_llama_3: hpcmem.models.video_llama_3 reads the vision part; the decoder is what text_config names
    # (VideoLlama3Config's default: qwen2); tie_word_embeddings False, set by __post_init__ from a true text flag
    "video_llama_3": TowerLayout(text="qwen2", defaults={}, aliases={}, norm="layer", mlp="fc", tie_from_text=True),
    # models/paddleocr_vl: hpcmem.models.paddleocr_vl reads the vision part; `PaddleOCRVLConfig`'s text_config is a
    # PaddleOCRTextConfig (Ernie4_5Config's fields; `sub_configs_defaults`), whose layer (`PaddleOCRDecoderLayer`) is
    # Ernie4_5DecoderLayer's with multimodal RoPE: the ernie4_5 layout (a learned type: hpcmem.models.vlm_learned)
    # with PaddleOCRTextConfig's defaults; PaddleOCRVLConfig.tie_word_embeddings True, and Qwen2VLConfig's
    # __post_init__ forwards a true text flag (the text config class's own default True)
    "paddleocr_vl": TowerLayout(text="ernie4_5", defaults={}, aliases={}, norm="layer", mlp="fc", tie_default=True,
                                tie_from_text=True, text_tie_default=True,
                                text_class_defaults=PADDLEOCR_TEXT_DEFAULTS, flat_text=True),
    # models/ovis2: hpcmem.models.ovis2 reads the vision part; the decoder is what text_config names (Ovis2Config's
    # default: qwen2); Ovis2Config.tie_word_embeddings True
    "ovis2": TowerLayout(text="qwen2", defaults={}, aliases={}, norm="rms", mlp="gated", tie_default=True),
    # models/glm4v: hpcmem.models.glm4v reads the vision part; Glm4vConfig's text_config is always a Glm4vTextConfig
    # (`sub_configs_defaults`), whose layer (modeling_glm4v.py Glm4vTextDecoderLayer) is Glm4DecoderLayer's: the glm4
    # layout with Glm4vTextConfig's defaults; Glm4vConfig.tie_word_embeddings False, set by __post_init__ from a true
    # text flag
    "glm4v": TowerLayout(text="glm4", defaults={}, aliases={}, norm="rms", mlp="gated", tie_from_text=True,
                         text_class_defaults=GLM4V_TEXT_DEFAULTS),
}
# models/glm46v (modular_glm46v.py): `Glm46VConfig`'s sub-configs default to glm4v_vision / glm4v_text
# (`sub_configs_defaults`) and `Glm46VModel(Glm4vModel)` builds them with `AutoModel.from_config`: Glm4vVisionModel and
# Glm4vTextModel under Glm4vModel's forward (hpcmem.models.glm4v refuses other sub-config types); glmga
# (modular_glmga.py `GlmgaConfig(Glm46VConfig)`) builds Glm46VForConditionalGeneration (modeling_auto.py). Neither
# config has Glm4vConfig's `__post_init__` that forwards a true text_config.tie_word_embeddings: the outer flag alone
VISION_LANGUAGE["glm46v"] = replace(VISION_LANGUAGE["glm4v"], tie_from_text=False)
VISION_LANGUAGE["glmga"] = replace(VISION_LANGUAGE["glm46v"])
# models/glm_ocr (modular_glm_ocr.py): `GlmOcrConfig(Glm4vConfig)`, its text_config a GlmOcrTextConfig (Glm4vTextConfig's
# fields, GLM-OCR's defaults) whose layer is Glm4vTextDecoderLayer's with `GlmOcrTextAttention` (no q/k/v bias);
# tie_word_embeddings False, forwarded from a true text flag by Glm4vConfig's `__post_init__`
VISION_LANGUAGE["glm_ocr"] = replace(VISION_LANGUAGE["glm4v"], text_class_defaults=GLM_OCR_TEXT_DEFAULTS,
                                     text_forced=GLM_OCR_TEXT_FORCED)
# models/glm4v_moe (modular_glm4v_moe.py): `Glm4vMoeConfig(Glm4vConfig)` (its __post_init__ forwarding a true text tie
# flag), `Glm4vMoeVisionModel(Glm4vVisionModel)` a `pass` subclass: glm4v's tower. Its decoder `Glm4vMoeTextModel` runs
# `Glm4vMoeTextDecoderLayer(Glm4MoeDecoderLayer)` — Glm4Attention's projections, Glm4MoE's routed experts
# (DeepseekV3Experts), top-k router and shared expert, dense below first_k_dense_replace — under 3-D M-RoPE, and
# `Glm4vMoeTextConfig(Glm4MoeConfig)` has Glm4MoeConfig's fields: the text part is taken as glm4_moe's, whose
# Glm4MoeForCausalLM builds the same layers with 1-D RoPE (parameters equal: tests/models/test_glm4v_moe_params.py),
# from a learned profile of that config (glm4_moe has no family descriptor); the trace of the real class holds it
def _over_glm45_moe(layout: TowerLayout) -> TowerLayout:
    """`layout` with GLM-4.5's MoE decoder as its text part: glm4_moe's layers with Glm4vMoeTextConfig's defaults,
    router_aux_loss_coef left out (Glm4MoeConfig has no such field)."""
    return replace(layout, text="glm4_moe", text_class_defaults=GLM4V_MOE_TEXT_DEFAULTS,
                   text_dropped=("router_aux_loss_coef",))


VISION_LANGUAGE["glm4v_moe"] = _over_glm45_moe(VISION_LANGUAGE["glm4v"])
# (outer model_type, text_config model_type) → the layout of a type whose sub-config picks another decoder: GLM-4.6V
# (glm46v, and glmga) builds its language model with AutoModel.from_config of the text sub-config (modular_glm46v.py
# `Glm46VModel.__init__`), and its released checkpoints name glm4v_moe_text: GLM-4.5V's MoE decoder, as glm4v_moe
# takes it, with glm46v's own tie rule (no __post_init__ forwarding the text flag)
SUB_CONFIG_LAYOUTS: dict[tuple[str, str], TowerLayout] = {
    (kind, MOE_TEXT_TYPE): _over_glm45_moe(VISION_LANGUAGE[kind]) for kind in GLM46V_TYPES}
# models/qwen3_vl_moe (modular_qwen3_vl_moe.py): `Qwen3VLMoeVisionConfig(Qwen3VLVisionConfig)` adds nothing, and
# `Qwen3VLMoeVisionModel(Qwen3VLVisionModel)` and its blocks, attention and rotary table are `pass` subclasses of
# Qwen3-VL's: qwen3_vl's tower, merger and deepstack mergers, with qwen3_vl's defaults; the decoder is Qwen3-MoE's
# (`Qwen3VLMoeTextDecoderLayer(Qwen3MoeDecoderLayer)`: fused experts and a bare-weight router;
# `Qwen3VLMoeTextAttention(Qwen3VLTextAttention)`: q/k norms) with Qwen3VLMoeTextConfig's defaults
VISION_LANGUAGE["qwen3_vl_moe"] = replace(VISION_LANGUAGE["qwen3_vl"], text="qwen3_moe",
                                          text_class_defaults=QWEN3_VL_MOE_TEXT_DEFAULTS)
# models/cosmos3_omni (modular_cosmos3_omni.py): `Cosmos3OmniConfig(Qwen3VLConfig)` with the same fields and defaults
# and sub-configs qwen3_vl_vision / qwen3_vl_text (Qwen3VLVisionConfig, Qwen3VLTextConfig);
# `Cosmos3OmniForConditionalGeneration(Qwen3VLForConditionalGeneration)` is a `pass` subclass, and the generated
# modeling_cosmos3_omni.py `Cosmos3OmniModel` builds `AutoModel.from_config` of those sub-configs (Qwen3VLVisionModel,
# Qwen3VLTextModel) with Qwen3VLModel's forward line for line; only `_no_split_modules`, `_can_record_outputs`
# (None) and the load-time key filter differ, none of which a single-device training step reads: qwen3_vl's layout
VISION_LANGUAGE["cosmos3_omni"] = replace(VISION_LANGUAGE["qwen3_vl"])
# models/qwen3_omni_moe (modeling_qwen3_omni_moe.py): `Qwen3OmniMoeVisionEncoderConfig` has Qwen3VLVisionConfig's
# fields and defaults, and `Qwen3OmniMoeVisionEncoder` is Qwen3VLVisionModel's modules and forward with its mergers
# (`Qwen3OmniMoeVisionPatchMerger`: `ln_q`, and `mlp` an nn.ModuleList Linear → nn.GELU → Linear) named as
# Qwen2.5-VL's are; `Qwen3OmniMoeThinkerTextDecoderLayer` is Qwen3-MoE's (q/k norms, fused experts, a bare-weight
# router, norm_topk_prob, dense layers by mlp_only_layers / decoder_sparse_step), under 3-D M-RoPE with the deepstack
# additions, with Qwen3OmniMoeTextConfig's defaults; Qwen3OmniMoeThinkerConfig.tie_word_embeddings (False) decides
# the head's tying, no __post_init__ reading the text config's flag. The audio encoder beside them:
# hpcmem.models.qwen3_omni_audio (VisionSpec.audio)
VISION_LANGUAGE["qwen3_omni_moe_thinker"] = replace(VISION_LANGUAGE["qwen3_vl"], text="qwen3_moe",
                                                    merger_names=("mlp.0", "mlp.2"),
                                                    text_class_defaults=QWEN3_OMNI_TEXT_DEFAULTS, audio="qwen3_omni")
# models/qwen3_5 (modular_qwen3_5.py): `Qwen3_5VisionConfig(Qwen3VLVisionConfig)` with Qwen3-VL's vision defaults and
# no deepstack_visual_indexes, and `Qwen3_5VisionModel(Qwen3VLVisionModel)` deletes the deepstack mergers: Qwen3-VL's
# tower and merger (`Qwen3_5Model.get_image_features` reads the merger's pooler_output alone, and Qwen3_5TextModel adds
# nothing to the image tokens' hidden states). Its decoder is `Qwen3_5TextModel`'s hybrid of Gated DeltaNet and
# full-attention layers, which no family descriptor covers: a learned profile of the text config
# (hpcmem.models.vlm_learned); an omitted text_config is Qwen3_5TextConfig's defaults (`sub_configs_defaults`), and
# Qwen3_5Config.tie_word_embeddings (False) decides the head's tying, no __post_init__ reading the text config's flag.
VISION_LANGUAGE["qwen3_5"] = replace(VISION_LANGUAGE["qwen3_vl"], text="qwen3_5_text", deepstack=False,
                                     defaults={k: v for k, v in VISION_LANGUAGE["qwen3_vl"].defaults.items()
                                               if k != "deepstack_visual_indexes"}, text_defaults={})
# models/qwen3_5_moe (modular_qwen3_5_moe.py): `Qwen3_5MoeVisionConfig(Qwen3_5VisionConfig)` and
# `Qwen3_5MoeVisionModel(Qwen3_5VisionModel)`, Qwen3.5's tower and merger; its decoder `Qwen3_5MoeTextModel` (Gated
# DeltaNet and full-attention layers over routed and shared experts), learned likewise; Qwen3_5MoeConfig's
# tie_word_embeddings False
VISION_LANGUAGE["qwen3_5_moe"] = replace(VISION_LANGUAGE["qwen3_5"], text="qwen3_5_moe_text")
# models/qwen4_exp (modular_qwen4_exp.py): `Qwen4ExpVisionConfig(Qwen3_5MoeVisionConfig)` and
# `Qwen4ExpVisionModel(Qwen3_5MoeVisionModel)`, Qwen3.5's tower and merger; `Qwen4ExpModel.forward` scatters the
# merger's pooler_output into the image tokens and adds nothing else to them. Its decoder `Qwen4ExpTextModel` (Gated
# DeltaNet and QSA-indexed attention layers over routed and shared experts, hyper-connection streams) is learned
# likewise (hpcmem.models.vlm_learned); Qwen4ExpConfig's tie_word_embeddings False (Qwen3_5MoeConfig's)
VISION_LANGUAGE["qwen4_exp"] = replace(VISION_LANGUAGE["qwen3_5"], text="qwen4_exp_text")
# models/cohere_compass (modular_cohere_compass.py): `CohereCompassVisionConfig(Qwen3VLVisionConfig)` adds nothing and
# `CohereCompassVisionModel(Qwen3VLVisionModel)` only renames its config class, and `CohereCompassModel(Qwen3VLModel)`
# keeps the deepstack mergers and Qwen3-VL's forward: qwen3_vl's tower, merger and deepstack mergers with its defaults.
# Its decoder `CohereCompassTextModel` (Cohere2's layers under per-layer-type M-RoPE, one LayerNorm a layer) has no
# family descriptor: a learned profile of the text config (hpcmem.models.vlm_learned; CohereCompassForCausalLM is
# what `models learn` builds). CohereCompassConfig.tie_word_embeddings False decides the head's tying (no
# __post_init__ reads the text config's flag, whose own default is True)
VISION_LANGUAGE["cohere_compass"] = replace(VISION_LANGUAGE["qwen3_vl"], text="cohere_compass_text", text_defaults={})
# models/shieldgemma2: MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES builds Gemma3ForConditionalGeneration from a
# ShieldGemma2Config (configuration_shieldgemma2.py: Gemma3Config's fields and defaults, text_config a gemma3_text,
# vision_config a siglip_vision_model), except tie_word_embeddings: False by default, and `__post_init__` sets it True
# when the text config's flag is true (Gemma3TextConfig's default True)
VISION_LANGUAGE["shieldgemma2"] = replace(VISION_LANGUAGE["gemma3"], tie_default=False, tie_from_text=True,
                                          text_tie_default=True)
# models/exaone4_5 (modular_exaone4_5.py): `Exaone4_5_VisionModel` is Qwen2.5-VL's tower (patch embedding, windowed
# blocks with RMSNorm and a gated MLP, Qwen2_5_VLPatchMerger) whose attention is grouped: `Exaone4_5_VisionAttention`
# rebuilds `qkv` as Linear(width, q_dim + 2 · kv_dim) and splits it ([q_dim, kv_dim, kv_dim]); its
# `Exaone4_5_VisionConfig` defaults (num_key_value_heads 8 of 16 heads). The decoder is `AutoModel.from_config` of the
# text config (model_type exaone4, `sub_configs_defaults`: Exaone4Config's defaults when it is omitted), with 1-D
# positions (`Exaone4_5_Model.forward`: no M-RoPE); no family descriptor derives EXAONE 4's decoder: a learned profile
# of the text config (hpcmem.models.vlm_learned). Exaone4_5_Config.tie_word_embeddings (False) decides the tying.
VISION_LANGUAGE["exaone4_5"] = replace(VISION_LANGUAGE["qwen2_5_vl"], text="exaone4", tie_from_text=False,
                                       defaults={**VISION_LANGUAGE["qwen2_5_vl"].defaults, "num_key_value_heads": 8},
                                       text_defaults={})
# models/hyperclovax_vision_v2 (modular_hyperclovax_vision_v2.py): `HyperCLOVAXVisionV2Config.sub_configs_defaults`
# builds vision_config as qwen2_5_vl_vision (Qwen2_5_VLVisionConfig, its class defaults: no grouped attention) and
# text_config as hyperclovax; `HyperCLOVAXVisionV2Model` (VideoLlama3Model's structure) builds `AutoModel.from_config`
# of each — Qwen2_5_VisionTransformerPretrainedModel (blocks and Qwen2_5_VLPatchMerger) and HyperCLOVAXModel — and
# `projector = nn.Linear(vision_config.out_hidden_size, text_config.hidden_size)` (bias), which `get_image_features`
# runs on the merger's output (`pooler_output`) before the image tokens take it; `forward` hands position_ids to the
# language model as they are (1-D, no M-RoPE). No family descriptor derives HyperCLOVAX's decoder (MuP multipliers,
# post-norms): a learned profile of the text config (hpcmem.models.vlm_learned), HyperCLOVAXConfig's defaults
# (hidden_size 4096) when it is omitted. HyperCLOVAXVisionV2Config.tie_word_embeddings (True) decides the tying, no
# __post_init__ reading the text config's flag. The forward's `lm_head(...) * text_config.logits_scaling` does not run
# in TRL's SFT and DPO steps: they call the fused LM head (trl/trainer/utils.py `add_fused_lm_head`, sft_trainer.py
# and dpo_trainer.py `fused_lm_head=True`), which runs the backbone (`HyperCLOVAXVisionV2Model`) and scales each
# tile of the head by logit_scale (logits_scaling for hyperclovax): no tensor beyond the head's own.
VISION_LANGUAGE["hyperclovax_vision_v2"] = replace(VISION_LANGUAGE["qwen2_5_vl"], text="hyperclovax",
                                                   tie_from_text=False, tie_default=True, text_defaults={},
                                                   projector_text_width=4096)
# models/qwen2_5_omni (configuration_qwen2_5_omni.py): `Qwen2_5OmniThinkerConfig.sub_configs_defaults` builds
# vision_config as Qwen2_5OmniVisionEncoderConfig (Qwen2_5_VLVisionConfig's fields and defaults), text_config as
# Qwen2_5OmniTextConfig (its own defaults, `QWEN2_5_OMNI_TEXT_DEFAULTS`) and audio_config as
# Qwen2_5OmniAudioEncoderConfig; `Qwen2_5OmniThinkerTextModel`'s layers are Qwen2's (q/k/v bias, no o bias) under
# M-RoPE, as Qwen2_5_VLTextModel's. The thinker config's tie_word_embeddings (False) decides the tying, no
# __post_init__ forwarding the text config's (True).
VISION_LANGUAGE["qwen2_5_omni_thinker"] = replace(VISION_LANGUAGE["qwen2_5_vl"], tie_from_text=False,
                                                  text_class_defaults=QWEN2_5_OMNI_TEXT_DEFAULTS,
                                                  family="qwen2_5_omni", audio="qwen2_5_omni")
# the types whose decoder is whatever their text_config names (`TowerLayout.text` only when it names none)
_TEXT_FROM_CONFIG = ("llava", "llava_next", "llava_next_video", "llava_onevision", "paligemma", "mistral3",
                     "internvl", "vipllava", "video_llava", "lighton_ocr", "deepseek_vl", "deepseek_vl_hybrid", "idefics2",
                     "aya_vision",
                     "cohere2_vision", "qianfan_ocr", "janus", "video_llama_3", "ovis2", "lfm2_vl", "pp_chart2table")


def vision_spec_from_config(cfg: dict[str, Any], name: str) -> (VisionSpec | ClipTowerSpec | Idefics3TowerSpec
                                                                  | PaliGemmaTowerSpec | MllamaTowerSpec
                                                                  | PixtralTowerSpec | Idefics2TowerSpec | None):
    """The VisionSpec of a vision-language config.json dict (llava's: a ClipTowerSpec), None for any other; keys it
    omits take the vision config class's defaults, as `AutoConfig.for_model` fills them."""
    model_type = str(cfg.get("model_type", ""))
    if model_type not in VISION_LANGUAGE:
        return None
    if model_type == "llava":
        return clip_tower_from_config(cfg, name)
    if model_type == "vipllava":
        return vipllava_tower_from_config(cfg, name)
    if model_type == "video_llava":
        return video_llava_tower_from_config(cfg, name)
    if model_type in ("llava_next", "llava_next_video"):
        return llava_next_tower_from_config(cfg, name, model_type)
    if model_type == "llava_onevision":
        return onevision_tower_from_config(cfg, name)
    if model_type in ("smolvlm", "idefics3"):
        return idefics3_tower_from_config(cfg, name)
    if model_type == "granite_docling":
        return granite_docling_tower_from_config(cfg, name)
    if model_type == "aria":
        return aria_tower_from_config(cfg, name)
    if model_type == "granite4_vision":
        return granite4_vision_tower_from_config(cfg, name)
    if model_type == "paligemma":
        return paligemma_tower_from_config(cfg, name)
    if model_type == "mllama":
        return mllama_tower_from_config(cfg, name)
    if model_type == "mistral3":
        return pixtral_tower_from_config(cfg, name)
    if model_type == "mistral_large4":
        return mistral_large4_tower_from_config(cfg, name)
    if model_type == "internvl":
        return internvl_tower_from_config(cfg, name)
    if model_type == "lighton_ocr":
        return lighton_tower_from_config(cfg, name)
    if model_type == "qianfan_ocr":
        return qianfan_tower_from_config(cfg, name)
    if model_type == "deepseek_vl":
        return deepseek_vl_tower_from_config(cfg, name)
    if model_type == "deepseek_vl_hybrid":
        return deepseek_vl_hybrid_tower_from_config(cfg, name)
    if model_type == "deepseek_ocr2":
        return deepseek_ocr2_tower_from_config(cfg, name)
    if model_type == "unlimited_ocr":
        return unlimited_ocr_tower_from_config(cfg, name)
    if model_type == "aya_vision":
        return aya_vision_tower_from_config(cfg, name)
    if model_type == "cohere2_vision":
        return cohere2_vision_tower_from_config(cfg, name)
    if model_type == "gemma4":
        return gemma4_tower_from_config(cfg, name)
    if model_type == "gemma4_unified":
        return gemma4_unified_tower_from_config(cfg, name)
    if model_type in ("glm4v", "glm46v", "glmga", "glm_ocr", "glm4v_moe"):
        return glm4v_tower_from_config(cfg, name)
    if model_type == "lfm2_vl":
        return lfm2_vl_tower_from_config(cfg, name)
    if model_type == "minicpmv4_6":
        return minicpmv4_6_tower_from_config(cfg, name)
    if model_type == "minicpmv4_7":
        return minicpmv4_7_tower_from_config(cfg, name)
    if model_type == "minicpm_ocr":
        return minicpm_ocr_tower_from_config(cfg, name)
    if model_type == "lfm3_vl":
        return lfm3_vl_tower_from_config(cfg, name)
    if model_type == "pp_chart2table":
        return got_ocr2_tower_from_config(cfg, name)
    if model_type == "kimi_k25":
        return kimi_k25_tower_from_config(cfg, name)
    if model_type == "cosmos3_edge":
        return cosmos3_edge_tower_from_config(cfg, name)
    if model_type == "muse_glimmer":
        return muse_glimmer_tower_from_config(cfg, name)
    if model_type == "muse_spark":
        return muse_spark_tower_from_config(cfg, name)
    if model_type == "dots3_note":
        return dots3_note_tower_from_config(cfg, name)
    if model_type == "ernie4_5_vl_moe":
        return ernie45vl_tower_from_config(cfg, name)
    if model_type == "molmo2":
        return molmo2_tower_from_config(cfg, name)
    if model_type == "hunyuan_vl":
        return hunyuan_vl_tower_from_config(cfg, name)
    if model_type == "hy_v4_vl":
        return hy_v4_vl_tower_from_config(cfg, name)
    if model_type == "minimax_m3_vl":
        return minimax_m3_tower_from_config(cfg, name)
    if model_type == "step3p7":
        return step3p7_tower_from_config(cfg, name)
    if model_type == "apertus1p5":
        return apertus1p5_tower_from_config(cfg, name)
    if model_type == "inkling2":
        return inkling2_tower_from_config(cfg, name)
    if model_type == "inkling_mm_model":
        return inkling_tower_from_config(cfg, name)
    if model_type == "idefics2":
        return idefics2_tower_from_config(cfg, name)
    if model_type == "fuyu":
        return fuyu_tower_from_config(cfg, name)
    if model_type == "emu3":
        return emu3_tower_from_config(cfg, name)
    if model_type == "janus":
        return janus_tower_from_config(cfg, name)
    if model_type == "chameleon":
        return chameleon_tower_from_config(cfg, name)
    if model_type == "video_llama_3":
        return video_llama_3_tower_from_config(cfg, name)
    if model_type == "paddleocr_vl":
        return paddleocr_tower_from_config(cfg, name)
    if model_type == "ovis2":
        return ovis2_tower_from_config(cfg, name)
    raw = cfg.get("vision_config") or {}
    if not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    layout = VISION_LANGUAGE[model_type]
    if layout.family == "siglip":
        values = gemma3_vision_values(cfg, name)
        if isinstance(values, str):
            raise SpecError(values)
        return VisionSpec(model_type=model_type, fullatt_block_indexes=(), norm=layout.norm, mlp=layout.mlp,
                          fc_names=layout.fc_names, merger_names=layout.merger_names, patch_bias=layout.patch_bias,
                          hooked_input=layout.hooked_input, family=layout.family, **values)
    vc = {**layout.defaults, **{layout.aliases.get(k, k): v for k, v in raw.items()}}
    if "embed_dim" in layout.defaults:      # Qwen2VLVisionConfig's names → Qwen2.5-VL's
        ratio = vc["mlp_ratio"]
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or ratio <= 0:
            raise SpecError(f"model {name}: vision_config.mlp_ratio must be a positive number, got {ratio!r}")
        width = vc["embed_dim"]
        vc = {**vc, "out_hidden_size": vc["hidden_size"], "hidden_size": width,
              "intermediate_size": int(width * ratio) if isinstance(width, int) else width, "window_size": 0}
    full = vc.get("fullatt_block_indexes") or ()
    if not isinstance(full, (list, tuple)) or not all(isinstance(x, int) for x in full):
        raise SpecError(f"model {name}: vision_config.fullatt_block_indexes must be a list of integers, got {full!r}")
    deep = (vc.get("deepstack_visual_indexes") or ()) if layout.deepstack else ()
    if not isinstance(deep, (list, tuple)) or not all(isinstance(x, int) for x in deep):
        raise SpecError(f"model {name}: vision_config.deepstack_visual_indexes must be a list of integers, got "
                        f"{deep!r}")
    return VisionSpec(
        model_type=model_type, depth=vc["depth"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_heads"], in_channels=vc["in_channels"],
        patch_size=vc["patch_size"], spatial_merge_size=vc["spatial_merge_size"],
        temporal_patch_size=vc["temporal_patch_size"], window_size=vc["window_size"],
        out_hidden_size=vc["out_hidden_size"], fullatt_block_indexes=tuple(full), hidden_act=str(vc["hidden_act"]),
        norm=layout.norm, mlp=layout.mlp, fc_names=layout.fc_names, merger_names=layout.merger_names,
        patch_bias=layout.patch_bias, hooked_input=layout.hooked_input, num_position_embeddings=vc.get("num_position_embeddings", 0),
        deepstack_visual_indexes=tuple(deep), num_key_value_heads=vc.get("num_key_value_heads", 0),
        projector_width=text_width(cfg, layout.projector_text_width) if layout.projector_text_width else 0,
        family=layout.family,
        audio=audio_encoder(cfg, name, layout.audio))


def audio_encoder(cfg: dict[str, Any], name: str, kind: str) -> AudioEncoderSpec | AudioTower | None:
    """The audio encoder TowerLayout.audio names beside the tower, read from the config's audio_config."""
    if kind == "qwen3_omni":
        return audio_spec_from_config(cfg, name)
    if kind == "qwen2_5_omni":
        return audio_tower_from_config(cfg, name)
    return None


def layout_of(cfg: dict[str, Any]) -> TowerLayout:
    """The covered type's TowerLayout, or the variant its text sub-config selects (`SUB_CONFIG_LAYOUTS`)."""
    inner = cfg.get("text_config")
    named = inner.get("model_type") if isinstance(inner, dict) else None
    return SUB_CONFIG_LAYOUTS.get((str(cfg["model_type"]), str(named)), VISION_LANGUAGE[str(cfg["model_type"])])


def text_part(cfg: dict[str, Any]) -> dict[str, Any]:
    """The decoder's config dict of a vision-language config: its `text_config` when it nests one, else the flat Hub
    layout's top-level keys (Qwen2_5_VLConfig.__post_init__ moves those into text_config), with model_type set to the
    decoder layout hpcmem builds it with (Qwen2_5_VLTextModel's and Qwen2VLTextModel's layers are Qwen2's: q/k/v bias,
    no o bias; Qwen3VLTextModel's are Qwen3's: q/k norms over the head dim, attention_bias)."""
    outer = layout_of(cfg)
    layout = outer.text
    inner = cfg.get("text_config")
    if inner is None and outer.text_defaults is not None:
        inner = dict(outer.text_defaults)
    if inner is None and outer.flat_text:
        inner = {k: v for k, v in cfg.items() if k not in ("vision_config", "text_config", "tie_word_embeddings")}
    text = dict(inner) if isinstance(inner, dict) else {k: v for k, v in cfg.items()
                                                         if k not in ("vision_config", "text_config")}
    if outer.text_class_defaults is not None:      # the text config class fills what the text_config omits
        text = {**outer.text_class_defaults, **(inner if isinstance(inner, dict) else {})}
    text.update(outer.text_forced or {})
    for key in outer.text_dropped:
        text.pop(key, None)
    # the composite config's flag decides (TowerLayout.tie_from_text, .ties); the flat Hub layout's top-level keys
    # are the outer config's too
    tie = bool(cfg.get("tie_word_embeddings", outer.tie_default))
    if not tie and outer.tie_from_text:
        tie = bool(inner.get("tie_word_embeddings", outer.text_tie_default) if isinstance(inner, dict)
                   else outer.text_tie_default)
    text["tie_word_embeddings"] = tie and outer.ties
    # llava's and paligemma's decoder is whatever their text_config names (LlavaConfig's default: llama)
    # (without a text_config, the class's default text config: `layout`)
    named = inner.get("model_type") if isinstance(inner, dict) else None
    text["model_type"] = str(named or layout) if cfg["model_type"] in _TEXT_FROM_CONFIG else layout
    return text
