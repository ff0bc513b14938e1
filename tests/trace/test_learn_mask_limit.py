"""The learner's longest row length where a layer reads the causal mask's values (Qwen4-Exp's QSA indexer takes
`torch.nonzero` of each query's mask row, modeling_qwen4_exp.py `Qwen4ExpTextQSAIndexer.forward`): the trace knows a
tensor's values up to hpcmem.trace.oracle.MAX_KNOWN_NUMEL elements, so the [2, 1, S, S] mask of the learner's two
rows must fit. Types whose sparse-attention indexer reads no mask values keep the usual lengths."""

import re
from pathlib import Path

import transformers

from hpcmem.trace.learn import MASK_READING_TYPES, SEQS, learn_lengths, mask_read_limit
from hpcmem.trace.oracle import MAX_KNOWN_NUMEL

MODELS = Path(transformers.__file__).parent / "models"


def test_the_indexed_layers_mask_fits_the_known_values_by_hand():
    # 2 · 1408² = 3,964,928 ≤ 2²² = 4,194,304 < 2 · 1472² = 4,333,568 (the next multiple of 64)
    assert MAX_KNOWN_NUMEL == 4_194_304
    assert mask_read_limit("qwen4_exp_text", ("linear_attention", "indexed_attention")) == 1408
    assert mask_read_limit("qwen4_exp", ("linear_attention", "indexed_attention")) == 1408
    assert learn_lengths(1408) == (88, 352, 1408)


def test_layers_that_read_no_mask_values_keep_the_usual_lengths():
    assert mask_read_limit("qwen4_exp_text", ("linear_attention", "full_attention")) == SEQS[-1]
    assert mask_read_limit("qwen4_exp_text", ()) == SEQS[-1]
    # HY-V4's layers are all "indexed_attention" (configuration_hy_v4.py) but its indexer reads no mask values
    assert mask_read_limit("hy_v4", ("indexed_attention",) * 4) == SEQS[-1]
    assert mask_read_limit("deepseek_v32", ("indexed_attention",) * 4) == SEQS[-1]


def _reads_mask_values(model_type: str) -> bool:
    """Whether the type's modeling file takes `torch.nonzero` of a name it assigns from the attention mask (the
    mask's values then decide the result's shape)."""
    source = (MODELS / model_type / f"modeling_{model_type}.py").read_text()
    names = re.findall(r"torch\.nonzero\(\s*(\w+)", source)
    return any(re.search(rf"\b{name} = attention_mask\b", source) for name in names)


def test_the_types_read_as_mask_readers_are_those_whose_code_reads_the_mask():
    # every transformers type whose config names a layer "indexed_attention", read from its own source
    indexed = sorted(p.parent.name for p in MODELS.glob("*/configuration_*.py")
                     if '"indexed_attention"' in p.read_text())
    assert {"qwen4_exp", "hy_v4", "deepseek_v32"} <= set(indexed)
    readers = {t for t in indexed if _reads_mask_values(t)}
    assert readers == {t for t in MASK_READING_TYPES if t in indexed}
