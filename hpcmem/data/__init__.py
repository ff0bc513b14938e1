"""Dataset token-length profiles: how long the examples are once a TRL trainer tokenizes them, what each max_length
truncates, and what each batching strategy (padded, padding-free, packing bfd / bfd_split / wrapped via TRL's own
`pack_dataset`) puts in a micro-batch.

`hpcmem.data.profile` (stdlib only) defines the profile JSON and `tokens_per_micro_batch`, which the estimator calls;
everything that reads datasets or tokenizers imports them inside functions.
"""
