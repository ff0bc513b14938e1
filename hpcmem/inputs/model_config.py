"""A model's config.json, checked where it is read: each key hpcmem reads has the JSON type transformers expects
and a value in range, so the spec built from it never meets a string where a count belongs (stdlib only).

Keys hpcmem does not read are not checked (a config.json carries dozens). Counts are bounded: sizes by MAX_COUNT,
the layer count by MAX_LAYERS, because the estimator walks the layers one by one.
"""

from __future__ import annotations

from typing import Any

from hpcmem.errors import Problems
from hpcmem.inputs import values as v

MAX_LAYERS = 10_000         # decoder layers (the deepest public decoders have a few hundred)
# key → (smallest value, nullable); a nullable key takes the config class default when null
_COUNTS: dict[str, tuple[int, bool]] = {
    "vocab_size": (1, False), "hidden_size": (1, False), "intermediate_size": (1, False),
    "num_attention_heads": (1, False), "num_key_value_heads": (1, True), "head_dim": (1, True),
    "max_position_embeddings": (1, True), "num_local_experts": (0, True), "num_experts": (0, True),
    "num_experts_per_tok": (0, True), "moe_intermediate_size": (0, True),
    "shared_expert_intermediate_size": (0, True), "decoder_sparse_step": (1, True), "sliding_window": (0, True),
}
_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "qkv_bias", "use_sliding_window")
_FLOATS = ("final_logit_softcapping", "attn_logit_softcapping")
_NAMES = ("model_type", "hidden_act", "hidden_activation", "dtype", "torch_dtype")


def check_model_config(cfg: Any, name: str) -> None:
    """Raises SpecError listing every key of the wrong type or range ("model NAME: key must be …; got …")."""
    if not isinstance(cfg, dict):
        raise v.InputError(f"model {name}: config must be a JSON object; got {v.shown(cfg)}")
    problems = Problems()
    inner = cfg.get("text_config")
    # the embedding is the decoder's: a composite config's own pad_token_id builds nothing (SmolVLM2's top level
    # says 128002 over its text_config's 49,280 rows)
    _check(cfg, problems, embedding=not isinstance(inner, dict))
    if isinstance(inner, dict):
        _check(inner, problems)
    elif inner is not None:
        problems.add(v.fail("text_config", inner, "an object (the decoder's config)").problems[0])
    problems.items = [f"model {name}: {p}" for p in problems.items]
    problems.raise_if_any()


def _gather(problems: Problems, check, *args: Any, **kw: Any) -> Any:
    try:
        return check(*args, **kw)
    except v.InputError as exc:
        problems.add(exc.problems[0])
        return None


def _check(cfg: dict, p: Problems, embedding: bool = True) -> None:
    for key, (lo, nullable) in _COUNTS.items():
        if key in cfg and not (nullable and cfg[key] is None):
            _gather(p, v.integer, key, cfg[key], lo=lo, text_ok=False)
    layers = MAX_LAYERS
    if "num_hidden_layers" in cfg:
        layers = _gather(p, v.integer, "num_hidden_layers", cfg["num_hidden_layers"], lo=1, hi=MAX_LAYERS,
                         text_ok=False) or MAX_LAYERS
    only = cfg.get("mlp_only_layers")
    if only is not None and (not isinstance(only, list) or len(only) > MAX_LAYERS):
        p.add(v.fail("mlp_only_layers", only, "a list of layer indices").problems[0])
    elif only is not None:
        for i, index in enumerate(only):
            _gather(p, v.integer, f"mlp_only_layers[{i}]", index, lo=0, hi=layers - 1, text_ok=False)
    types = cfg.get("layer_types")
    if types is not None and (not isinstance(types, list) or len(types) > MAX_LAYERS or
                              not all(isinstance(t, str) and len(t) <= 64 for t in types)):
        p.add(v.fail("layer_types", types, "a list of attention type names").problems[0])
    _check_head_width(cfg, p)
    _check_kv_heads(cfg, p)
    if embedding:
        _check_pad_token(cfg, p)
    for key in _FLAGS:
        if cfg.get(key) is not None:
            _gather(p, v.boolean, key, cfg[key], text_ok=False)
    for key in _FLOATS:
        if cfg.get(key) is not None and (_gather(p, v.number, key, cfg[key], text_ok=False) or 0) < 0:
            p.add(v.fail(key, cfg[key], "a number ≥ 0 or null").problems[0])
    for key in _NAMES:
        if cfg.get(key) is not None:
            _gather(p, v.text, key, cfg[key], max_len=128)


def _check_pad_token(cfg: dict, p: Problems) -> None:
    """A pad_token_id the config names must be a row of the embedding: transformers' models build
    `nn.Embedding(vocab_size, hidden_size, padding_idx=config.pad_token_id)` (modeling_llama.py `LlamaModel.__init__`
    and its copies), and torch refuses a padding_idx outside [-vocab_size, vocab_size) (torch/nn/modules/sparse.py
    `Embedding.__init__`: "Padding_idx must be within num_embeddings"). The class default of a config that names none
    is checked where transformers builds the config (hpcmem.trace.layer_map `hf_config`)."""
    pad, vocab = cfg.get("pad_token_id"), cfg.get("vocab_size")
    if pad is None or not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        return
    if _gather(p, v.integer, "pad_token_id", pad, text_ok=False) is not None and not -vocab <= pad < vocab:
        p.add(v.fail("pad_token_id", pad, f"a row of the embedding: below vocab_size ({vocab:,}); torch's "
                     "nn.Embedding refuses a padding_idx outside it").problems[0])


def _check_kv_heads(cfg: dict, p: Problems) -> None:
    """The attention heads share key/value heads in equal groups: transformers' `repeat_kv` repeats each key/value head
    num_attention_heads // num_key_value_heads times (modeling_llama.py and its copies), and a count that does not
    divide fails in the first forward. The same rule as hpcmem.models.spec's, here where the config is read, so that
    `models learn` refuses it before a minute of traces that all fail."""
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    counts = all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in (heads, kv))
    if counts and heads % kv:
        p.add(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv} (each key/value head serves "
              "an equal group of heads)")


def _check_head_width(cfg: dict, p: Problems) -> None:
    """Without a head_dim, transformers' attention takes hidden_size // num_attention_heads as the head width (e.g.
    modeling_llama.py LlamaAttention: `getattr(config, "head_dim", hidden_size // num_attention_heads)`), which must
    be at least 1 (a width of 0 ends the model's build in `head_dim ** -0.5`)."""
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    counts = all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in (hidden, heads))
    if cfg.get("head_dim") is None and counts and hidden // heads < 1:
        p.add(v.fail("num_attention_heads", heads, f"at most hidden_size ({hidden:,}) when head_dim is not given "
                     "(head_dim = hidden_size // num_attention_heads must be ≥ 1)").problems[0])
