"""A tiny causal LM, its tokenizer and a text dataset, all built locally (HF_HUB_OFFLINE): what the end-to-end jobs train.

Run as a script it writes them into a folder: `python -m tests.slurm.tiny DIR`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TINY_LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "max_position_embeddings": 128, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}
WORDS = "the quick brown fox jumps over a lazy dog while seven small models learn to count slowly".split()


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def write_model(folder: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**TINY_LLAMA)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


def write_dataset(folder: Path, rows: int = 64) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as fh:
        for i in range(rows):
            words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(6 + i % 5)]
            fh.write(json.dumps({"text": " ".join(words)}) + "\n")
    return folder


if __name__ == "__main__":
    root = Path(sys.argv[1])
    write_model(root / "model")
    write_dataset(root / "data")
    print(root)
