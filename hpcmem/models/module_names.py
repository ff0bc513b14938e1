"""Which module a `lora_modules_to_save` name reaches on a model type.

peft copies, for training, every module whose path ends with a listed name (peft/utils/other.py `_set_trainable`:
`key.endswith(target_key)` over `named_modules()`), and silently none where no path does (`strict_module_check` is
off for modules_to_save). hpcmem sizes three names: `lm_head` (the vocabulary head), `embed_tokens` (the input
embedding) and `score` (a reward model's head). Most decoders have modules of those names; the types below do not, or
name another module so. Read from transformers 5.24's modeling files, each model built from its config on the meta
device (`get_output_embeddings()`, `get_input_embeddings()`, `named_modules()` of AutoModelForCausalLM and
AutoModelForSequenceClassification).
"""

from __future__ import annotations

# the vocabulary head's path where no module path ends with "lm_head"
OUTPUT_HEAD = {"biogpt": "output_projection", "gpt_neox_japanese": "embed_out", "rwkv": "head"}
# a module named lm_head that is not the vocabulary head: ModernBERT-decoder's prediction head (dense [H, H] with its
# bias, then a LayerNorm: modeling_modernbert_decoder.py ModernBertDecoderPredictionHead); its `decoder` is the head
PREDICTION_HEAD = frozenset({"modernbert-decoder"})
# the input embedding's path where it does not end with "embed_tokens"
INPUT_EMBEDDING = {
    "bloom": "transformer.word_embeddings", "codegen": "transformer.wte", "cpmant": "cpmant.input_embedding",
    "ctrl": "transformer.w", "dbrx": "transformer.wte", "falcon": "transformer.word_embeddings",
    "falcon_mamba": "backbone.embeddings", "gpt-sw3": "transformer.wte", "gpt2": "transformer.wte",
    "gpt_bigcode": "transformer.wte", "gpt_neo": "transformer.wte", "gpt_neox": "gpt_neox.embed_in",
    "gpt_neox_japanese": "gpt_neox_japanese.embed_in", "gptj": "transformer.wte", "mamba": "backbone.embeddings",
    "mamba2": "backbone.embeddings", "modernbert-decoder": "model.embeddings.tok_embeddings", "mpt": "transformer.wte",
    "nemotron_h": "model.embeddings", "openai-gpt": "transformer.tokens_embed", "rwkv": "rwkv.embeddings",
    "xlstm": "backbone.embeddings",
}
# a sequence-classification head not named score
SCORE_HEAD = {"ctrl": "classifier", "modernbert-decoder": "classifier"}


def reaches(model_type: str, name: str) -> str | None:
    """What a `lora_modules_to_save` name (one of lm_head, embed_tokens, score) reaches on `model_type`: the name
    itself where the type has such a module as hpcmem sizes it, "prediction head" for ModernBERT-decoder's lm_head, or
    None where no module path ends with it (peft then copies nothing)."""
    if name == "lm_head":
        if model_type in PREDICTION_HEAD:
            return "prediction head"
        return None if model_type in OUTPUT_HEAD else name
    if name == "embed_tokens":
        return None if model_type in INPUT_EMBEDDING else name
    if name == "score":
        return None if model_type in SCORE_HEAD else name
    return None


def actual_names(model_type: str) -> str:
    """The type's own paths of the three modules, for a message: "head `head`, input embedding `rwkv.embeddings`"."""
    head = OUTPUT_HEAD.get(model_type, "decoder" if model_type in PREDICTION_HEAD else "lm_head")
    return (f"vocabulary head `{head}`, input embedding `{INPUT_EMBEDDING.get(model_type, 'model.embed_tokens')}`, "
            f"reward head `{SCORE_HEAD.get(model_type, 'score')}`")
