"""Vision-language types: transformers' image-text-to-text mapping (the classes TRL loads for image-text fine-tuning
through AutoModelForImageTextToText), as data (coverage_vlm.json, regenerated from the installed transformers by
tests/models/test_coverage_vlm.py).

hpcmem models images for the types of hpcmem.models.vision `VISION_LANGUAGE` (that module's docstring lists each
with its tower, projector and text part, and the module that reads its vision config), for the trainers
`IMAGE_TRAINERS_ALLOWED` names per type; any other type that is only image-text-to-text is refused with that reason,
or with TRL's own where TRL's trainers cannot train it at all (`TRL_REFUSES`).
A type that also has a causal-LM class (gemma3n …) and no tower hpcmem models is estimated as its text decoder, as
hpcmem/models/coverage.json classifies it, and the estimate says the towers are not counted.
"""

from __future__ import annotations

import json
from functools import lru_cache

from hpcmem.datapath import PACKAGE_DIR
from hpcmem.models.vision import IMAGE_TRAINERS_ALLOWED, IMAGE_TRAINERS_TRACED, VISION_LANGUAGE

IMAGE_TEXT_MAPPING_NAME = "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"
DERIVED = ("derived with images (traced: {trainers}): vision tower, patch merger or projector and image tokens "
           "(hpcmem.models.vision, hpcmem.estimate.vision){left}")
NOT_MODELLED = ("vision-language only (image-text-to-text: {cls}): its vision tower, projector and image tokens are "
                "not modelled yet, and it has no causal-LM class whose text decoder hpcmem could estimate instead")
# Image-text types TRL 1.16's trainers cannot train: every trainer that takes images (SFT, DPO, GRPO, RLOO) scores
# tokens through TRL's fused LM head (trl/trainer/utils.py `add_fused_lm_head._fused_forward`), which calls
# `model.base_model` with the batch minus the labels and reads `last_hidden_state[:, :-1]` against `labels[:, 1:]`.
# Each reason names where the real trainer raised on a tiny model of the type with text rows (one CPU step,
# hpcmem.validate.vlm_trainable; tests/validate/test_vlm_trainable.py) and why image rows raise there too, or, where
# the type's forward runs under that head, where TRL's collators raised on image rows through the type's own processor
# (hpcmem.validate.vlm_image_rows).
_FUSED = "TRL 1.16's fused LM head (trl/trainer/utils.py add_fused_lm_head._fused_forward, through which SFT, DPO, " \
         "GRPO and RLOO score every token)"
# the backbone TRL runs is the model itself: base_model_prefix names no attribute, so PreTrainedModel.base_model
# (transformers/modeling_utils.py) returns the model, whose own output the head reads
_SELF = ("its backbone is the model itself and has no last_hidden_state: " + _FUSED + " runs model.base_model, and "
         "{{cls}}'s base_model_prefix '{prefix}' names no attribute, so base_model is the model, whose output ({out}) "
         "has no last_hidden_state: AttributeError at every step (checked on CPU with {inputs})")
_SEQ2SEQ = ("an encoder-decoder whose decoder gets no input without labels: " + _FUSED + " runs model.base_model, "
            "and {{cls}}'s base_model_prefix '{prefix}' names no attribute, so it calls the model's own forward "
            "without labels, the only source of its decoder's input ids: {error} at every step (checked on CPU with "
            "{inputs})")
TRL_REFUSES: dict[str, str] = {
    "kosmos-2.5": "its backbone is the model itself and has no last_hidden_state: " + _FUSED + " runs "
                  "model.base_model, and {cls} declares base_model_prefix '', so base_model is the model, whose output "
                  "(Kosmos2_5ForConditionalGenerationModelOutput) has no last_hidden_state; every step raises "
                  "AttributeError, with images as with text (checked on CPU)",
    "nemotron_h_omni": "its backbone is the model itself and has no last_hidden_state: " + _FUSED + " runs "
                       "model.base_model, and {cls} declares base_model_prefix '', so base_model is the model, whose "
                       "output (MultimodalCausalLMOutputWithPast) has no last_hidden_state; every step raises "
                       "AttributeError, with images as with text (checked on CPU)",
    "florence2": "an encoder-decoder whose decoder gets one position without labels: " + _FUSED + " calls the "
                 "backbone (Florence2Model) without labels, so its decoder runs on the one start token it makes when "
                 "no decoder_input_ids are given, one position against the labels' T - 1, and every step raises "
                 "(RuntimeError on CPU; the encoder's image features do not change the decoder's length)",
    "t5gemma2": "an encoder-decoder whose decoder gets no input without labels: " + _FUSED + " calls the backbone "
                "(T5Gemma2Model) without labels, the only source of its decoder's input ids, so the decoder raises "
                "ValueError ('You must specify exactly one of input_ids or inputs_embeds') at every step, with images "
                "as with text (checked on CPU)",
    "blip": "its output's last_hidden_state is the vision tower's and it has no lm_head: " + _FUSED + " runs "
            "model.base_model, which is the model itself (base_model_prefix 'blip' names no attribute of {cls}), reads "
            "its last_hidden_state (BlipForConditionalGenerationModelOutput's: the vision tower's, not the text's) and "
            "then model.get_output_embeddings(), None for a model without an lm_head attribute (its head is "
            "text_decoder.cls.predictions.decoder): AttributeError at every step (checked on CPU with pixel values)",
    "blip-2": _SELF.format(prefix="blip", out="Blip2ForConditionalGenerationModelOutput",
                           inputs="pixel values and query-token ids"),
    "instructblip": _SELF.format(prefix="blip", out="InstructBlipForConditionalGenerationModelOutput",
                                 inputs="pixel values, query-token ids and Q-Former ids"),
    "instructblipvideo": _SELF.format(prefix="blip", out="InstructBlipVideoForConditionalGenerationModelOutput",
                                      inputs="video frames, query-token ids and Q-Former ids"),
    "kosmos-2": _SELF.format(prefix="", out="Kosmos2ForConditionalGenerationModelOutput",
                             inputs="pixel values and an image-embedding position mask"),
    "pix2struct": _SEQ2SEQ.format(prefix="", error="ValueError ('You have to specify either decoder_input_ids or "
                                  "decoder_inputs_embeds')", inputs="flattened patches") +
                  "; TRL's default gradient_checkpointing is refused before that (Pix2Struct does not support it)",
    "udop": _SEQ2SEQ.format(prefix="transformer", error="ValueError ('You must specify exactly one of "
                            "decoder_input_ids or decoder_inputs_embeds')", inputs="pixel values and token boxes"),
    "vision-encoder-decoder": _SEQ2SEQ.format(prefix="vision_encoder_decoder", error="ValueError ('You must specify "
                                              "exactly one of input_ids or inputs_embeds', from its decoder)",
                                              inputs="pixel values"),
    # the one refusal decided by the processor, not the forward: given input ids and pixel values the model runs under
    # the fused head (hpcmem.validate.vlm_image_call), but TRL's rows never give it input ids
    "pp_formulanet": "its processor makes no token ids: {cls}'s decoder gets the right-shifted input ids "
                     "(PPFormulaNetModel.forward, shift_tokens_right) and the model runs under " + _FUSED + " given "
                     "them and pixel values, but PPFormulaNetProcessor.__call__ (processing_pp_formulanet.py) takes "
                     "images only and returns pixel_values alone, and TRL's vision collators read its input_ids: "
                     "SFT's conversational rows raise KeyError ('input_ids') in "
                     "DataCollatorForVisionLanguageModeling._collate_language_modeling (ValueError before that "
                     "without a chat template, which the processor class does not set), its prompt-completion rows "
                     "and DPO's preference rows TypeError (the completion's processor call has no images); text rows "
                     "raise ValueError for want of pixel values (checked on CPU with image rows through the type's "
                     "processor, hpcmem.validate.vlm_image_rows)",
    "pi0": "{cls} has no generation_config: TRL 1.16's trainers copy the pad token onto model.generation_config "
           "(trl/trainer/sft_trainer.py SFTTrainer.__init__ when it builds its own collator, as the trl command line "
           "always has it; dpo_trainer.py, grpo_trainer.py and rloo_trainer.py unconditionally), and {cls} is not a "
           "GenerationMixin: building the trainer raises AttributeError before its first step (checked on CPU)",
    "diffusion_gemma": "a block-diffusion model, not a next-token predictor: {cls} (models/diffusion_gemma/"
                       "modeling_diffusion_gemma.py) takes no labels and has no loss, and its backbone "
                       "(DiffusionGemmaModel, which " + _FUSED + " runs without labels) encodes the row into a KV "
                       "cache and returns the decoder's states over a canvas of canvas_length tokens it draws "
                       "uniformly at random when no decoder_input_ids are given, whatever the row's length: the head "
                       "scores canvas_length - 1 positions against the row's T - 1 shifted labels, and every step "
                       "raises RuntimeError (trl/chunked_logprob.py _forward_tile, on CPU) unless the padded row is "
                       "exactly canvas_length tokens, when it would score a random canvas against next tokens, no "
                       "objective of the model's; image tokens lengthen the row, not the canvas",
}
# image-text types whose text decoder hpcmem refuses because TRL's trainer cannot train it (their reason is the text
# decoder's, hpcmem/models/coverage.json): no image job of theirs trains either
TRL_REFUSES_TEXT_DECODER = ("llama4",)
# image-text types refused for their text part: model_type → the text config's type, which hpcmem/models/coverage.json
# classifies (its "refused" reason, and the settings it trains only with: "requires"). glm5_next
# (models/glm5_next/configuration_glm5_next.py `Glm5NextConfig.sub_configs_defaults`): Glm5NextTextConfig
TEXT_PART_REFUSED: dict[str, str] = {"glm5_next": "glm5_next_text"}


# image-text types not modelled whose real trainer was run with images: model_type → what TRL 1.16 does with them
# (checked on CPU with the type's own processor and the installed transformers; the test named in each), appended to
# the not-modelled reason. idefics: tests/models/test_idefics_refused.py
TRL_WITH_IMAGES: dict[str, str] = {
    "idefics": "TRL 1.16 trains it with images only as SFT on language-modeling rows (messages: "
               "DataCollatorForVisionLanguageModeling gets pixel_values [rows, images, 3, image_size, image_size] and "
               "image_attention_mask [rows, tokens, images] from IdeficsProcessor); prompt-completion SFT and DPO "
               "raise, because IdeficsProcessor.__call__ (processing_idefics.py) joins a list of text-only strings, "
               "the completions the collators process without images, into one row (the collator's torch.cat raises "
               "with 2 or more rows), and with one row the collator keeps the prompt's image_attention_mask beside "
               "input_ids of prompt and completion, so the first gated cross-attention layer's SDPA raises on the "
               "mask's length; text rows raise in IdeficsModel.forward (no pixel_values). Its full fine-tuning from a "
               "model path trains every part: IdeficsConfig's freeze_text_layers and freeze_vision_layers (True) "
               "freeze the decoder layers, norm, token embedding and tower at init (IdeficsModel."
               "freeze_relevant_params), but from_pretrained, as TRL loads the path, sets each loaded weight as a new "
               "nn.Parameter that requires grad (core_model_loading.py set_param_for_module); the gated "
               "cross-attention layers (num_hidden_layers / cross_layer_interval more decoder-sized layers, k/v_proj "
               "over the tower width, attending from every text token to every image's latents or patches) and the "
               "perceiver resampler are what hpcmem would have to add to a LLaMA decoder",
}


# image-text-to-text types with no image input: nothing of an image job applies to them, so the image-text table lists
# them as not applicable (a text job on mistral4 is a text decoder's: hpcmem/models/coverage.json classifies it)
NO_IMAGE_INPUT: dict[str, str] = {
    "evolla": "protein-text, not image-text: {cls} reads protein sequences through a SaProt encoder and a resampler "
              "(models/evolla/modeling_evolla.py), and EvollaProcessor.__call__ (processing_evolla.py) takes proteins "
              "(amino-acid and Foldseek strings) and messages, no images; hpcmem models neither the protein encoder "
              "nor protein tokens",
    "mistral4": "a text decoder with no image input: {cls} (models/mistral4/modeling_mistral4.py) is the class "
                "transformers maps mistral4 to for image-text-to-text, and it has no vision tower and takes token ids "
                "only (TRL builds it by the config's architectures[0]); a text job on it is a text "
                "decoder's, estimated from a learned profile (hpcmem models learn CONFIG)",
}


def trl_cannot_train(model_type: str) -> bool:
    """TRL 1.16's trainers cannot train this image-text type (`TRL_REFUSES`, `TRL_REFUSES_TEXT_DECODER`)."""
    return model_type in TRL_REFUSES or model_type in TRL_REFUSES_TEXT_DECODER


def derived_reason(model_type: str) -> str:
    """Which trainers take this type's images, which of them a trace held (hpcmem.models.vision)."""
    allowed, traced = IMAGE_TRAINERS_ALLOWED.get(model_type, ()), IMAGE_TRAINERS_TRACED.get(model_type, ())
    untraced = [x.upper() for x in allowed if x not in traced]
    refused = [x.upper() for x in ("sft", "dpo", "grpo", "rloo") if x not in allowed]
    left = (f"; {'/'.join(untraced)} by the same rules, not traced" if untraced else "") + \
        (f"; {'/'.join(refused)} with images refused" if refused else "")
    return DERIVED.format(trainers=", ".join(x.upper() for x in traced), left=left)


@lru_cache(maxsize=1)
def vision_language_types() -> dict[str, str]:
    """model_type → the image-text-to-text class transformers builds for it (the table's transformers version)."""
    data = json.loads((PACKAGE_DIR / "models" / "coverage_vlm.json").read_text(encoding="utf-8"))
    return dict(data["types"])


def vision_language_reason(model_type: str) -> str | None:
    """Why a type that transformers builds only as image-text-to-text is refused, or None for any other type."""
    cls = vision_language_types().get(model_type)
    if cls and model_type in NO_IMAGE_INPUT:
        return NO_IMAGE_INPUT[model_type].format(cls=cls)
    if cls and model_type in TRL_REFUSES:
        return f"TRL cannot train it: {TRL_REFUSES[model_type].format(cls=cls)}"
    if not cls or model_type in VISION_LANGUAGE:
        return None
    found = TRL_WITH_IMAGES.get(model_type)
    return NOT_MODELLED.format(cls=cls) + (f"; {found}" if found else "")
