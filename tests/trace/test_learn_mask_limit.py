"""The learner's longest row length where a layer reads the causal mask's values (Qwen4-Exp's QSA indexer takes
`torch.nonzero` of each query's mask row, modeling_qwen4_exp.py `Qwen4ExpTextQSAIndexer.forward`): the trace knows a
tensor's values up to hpcmem.trace.oracle.MAX_KNOWN_NUMEL elements, so the [2, 1, S, S] mask of the learner's two
rows must fit."""

from hpcmem.trace.learn import SEQS, learn_lengths, mask_read_limit
from hpcmem.trace.oracle import MAX_KNOWN_NUMEL


def test_the_indexed_layers_mask_fits_the_known_values_by_hand():
    # 2 · 1408² = 3,964,928 ≤ 2²² = 4,194,304 < 2 · 1472² = 4,333,568 (the next multiple of 64)
    assert MAX_KNOWN_NUMEL == 4_194_304
    assert mask_read_limit(("linear_attention", "indexed_attention")) == 1408
    assert learn_lengths(1408) == (88, 352, 1408)


def test_layers_that_read_no_mask_values_keep_the_usual_lengths():
    assert mask_read_limit(("linear_attention", "full_attention")) == SEQS[-1]
    assert mask_read_limit(()) == SEQS[-1]
