"""Pure statistics of a length profile (stdlib only): percentiles, max_length candidates, the recommendation.

Percentiles are nearest-rank: pXX is the smallest length such that at least XX % of the sequences are no longer, so
`max_length = p95` truncates at most 5 % of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from hpcmem.data.batches import nearest_rank
from hpcmem.job.trainers import REGISTRY

PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p95", 0.95), ("p99", 0.99), ("p99.9", 0.999))
MAX_POWER_OF_TWO_CANDIDATES = 6
# The recommendation: the shortest candidate that truncates at most this share of the examples …
TRUNCATED_EXAMPLES_OK = 0.01
# … packing when padded micro-batches would waste more than this share of their tokens …
PADDING_FRACTION_OK = 0.10
# … and bfd_split rather than bfd when bfd would cut more than this share of the tokens.
TOKENS_LOST_OK = 0.01


def histogram(lengths: Iterable[int]) -> list[list[int]]:
    """[[length, count], …] sorted by length: the profile's order-free record of every sequence."""
    return [[n, c] for n, c in sorted(Counter(lengths).items())]


def expand(hist: Sequence[Sequence[int]]) -> list[int]:
    """The sorted lengths a histogram stands for."""
    return [n for n, c in hist for _ in range(c)]


def length_stats(sorted_lengths: Sequence[int]) -> dict:
    """count, total, min, mean, p50 … p99.9, max of lengths sorted ascending."""
    n = len(sorted_lengths)
    total = sum(sorted_lengths)
    out = {"count": n, "total_tokens": total, "min": sorted_lengths[0] if n else 0,
           "mean": total / n if n else 0.0}
    for name, fraction in PERCENTILES:
        out[name] = nearest_rank(sorted_lengths, fraction)
    out["max"] = sorted_lengths[-1] if n else 0
    return out


def candidates(stats: Mapping, extra: Iterable[int] = ()) -> list[tuple[int, str]]:
    """(max_length, label) to profile, ascending: powers of two from the one at or below p50 up to the one at or
    above the longest sequence (at most MAX_POWER_OF_TWO_CANDIDATES, the longest kept), the p95 and p99 points, and
    the user's own values. Labels of equal values are joined ("p99 · 2^9")."""
    labels: dict[int, list[str]] = {}
    low = 1 << max(0, int(stats["p50"]).bit_length() - 1)
    high = 1 << max(0, (int(stats["max"]) - 1).bit_length())
    powers = []
    p = low
    while p <= high:
        powers.append(p)
        p <<= 1
    for name in ("p95", "p99"):
        labels.setdefault(max(1, int(stats[name])), []).append(name)
    for p in powers[-MAX_POWER_OF_TWO_CANDIDATES:]:
        labels.setdefault(p, []).append(f"2^{p.bit_length() - 1}")
    for value in extra:
        labels.setdefault(int(value), []).insert(0, "asked")
    return [(value, " · ".join(names)) for value, names in sorted(labels.items())]


def recommend(trainer: str, rows: Sequence[Mapping], stats: Mapping) -> dict:
    """Pick max_length and a batching strategy from the candidate rows of a profile; say why with the numbers.

    max_length: the shortest candidate that truncates (or drops) at most TRUNCATED_EXAMPLES_OK of the examples.
    Image-text data: only candidates that cut no example's image tokens (TRL fails on such a cut), always padded
    (TRL refuses packing and padding-free for image datasets).
    Strategy (SFT only; DPO/Reward/GRPO always pad): padded if that wastes at most PADDING_FRACTION_OK of the
    micro-batch tokens, else packing — bfd (TRL's default: whole sequences, padding-free rows) unless bfd cuts
    more than TOKENS_LOST_OK of the tokens, then bfd_split (which keeps them).
    """
    if not REGISTRY[trainer].lengths.truncates:
        padded = rows[0]["strategies"]["padded"]
        return {"max_length": None, "packing": False, "packing_strategy": None, "padding_free": False,
                "reason": f"GRPO prompts are not truncated; the longest is {stats['max']:,} tokens "
                          f"(estimate with --max-prompt-length {stats['max']}); padded prompt batches waste "
                          f"{padded['padding_fraction']:.0%} of their tokens"}
    vision = "image_cut_examples" in rows[0]      # image-text data: a cut into image tokens fails in TRL
    sized = [r for r in rows if r["max_length"] is not None and not r.get("image_cut_examples")]
    ok = [r for r in sized
          if r["truncated_examples"] + r["dropped_examples"] <= TRUNCATED_EXAMPLES_OK * r["examples"]]
    pick = ok[0] if ok else sized[-1] if sized else rows[0]
    cut = pick["truncated_examples"] + pick["dropped_examples"]
    why = (f"max_length {pick['max_length']} ({pick['label']}) cuts or drops {cut / pick['examples']:.1%} of the "
           f"examples and {pick['tokens_lost'] / max(1, pick['tokens_total']):.2%} of the tokens")
    if vision:
        why += " and keeps every example's image tokens whole"
    padded = pick["strategies"]["padded"]
    out = {"max_length": pick["max_length"], "packing": False, "packing_strategy": None, "padding_free": False}
    if not REGISTRY[trainer].packs or vision or padded["padding_fraction"] <= PADDING_FRACTION_OK:
        kl = pick["strategies"].get("kl")           # KTO: its KL rows go through the model too
        worst = max(padded["worst_tokens_per_micro_batch"], kl["worst_tokens_per_micro_batch"] if kl else 0)
        out["reason"] = (f"{why}; padded micro-batches waste {padded['padding_fraction']:.0%} of their tokens, "
                         f"worst micro-batch {worst:,} tokens" + (" (its KL rows)" if kl and worst >
                                                                  padded["worst_tokens_per_micro_batch"] else ""))
        return out
    bfd_lost = pick["strategies"]["bfd"]["tokens_lost"] / max(1, pick["tokens_total"])
    strategy = "bfd_split" if bfd_lost > TOKENS_LOST_OK else "bfd"
    packed = pick["strategies"][strategy]
    out.update(packing=True, packing_strategy=strategy, padding_free=True)
    out["reason"] = (f"{why}; padded micro-batches would waste {padded['padding_fraction']:.0%} of their tokens, "
                     f"packing {strategy} cuts the rows from {padded['rows']:,} to {packed['rows']:,} and the waste "
                     f"to {packed['padding_fraction']:.0%} (worst micro-batch "
                     f"{packed['worst_tokens_per_micro_batch']:,} tokens); packing needs a FlashAttention kernel "
                     "(padding-free rows)")
    return out
