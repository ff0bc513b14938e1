"""A learned profile of a vision-language type carries the whole config; its ModelSpec's attention shape and MLP width
must be the decoder's (text_config), not placeholders. The allocator's layer block (hpcmem.estimate.allocator
`largest_layer_block`) and the planner's FLOP count read them: a dots3 Note spec read one head of width 5,120 and an
MLP of 4 × hidden from the outer config, which names none of them.

Known answer: the config's own text_config."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests.helpers.random_records import stored_trace_record  # noqa: E402


@pytest.mark.parametrize("job_id", ["s1-370", "s1-96"])
def test_learned_vlm_spec_reads_the_decoder(job_id: str) -> None:
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec

    rec = stored_trace_record(job_id)
    text = rec["job"]["config"]["text_config"]
    m = job_spec(RandomJob.from_dict(rec["job"])).model
    assert m.learned is not None and "num_attention_heads" not in rec["job"]["config"]
    assert m.num_attention_heads == text["num_attention_heads"]
    assert m.num_key_value_heads == text["num_key_value_heads"]
    assert m.head_dim == text["head_dim"]
    assert m.intermediate_size == text["intermediate_size"]
