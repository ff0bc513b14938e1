"""Show a profile: the terminal report (pure text) and the PNG histogram (matplotlib, imported inside `plot`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hpcmem.data.stats import PERCENTILES
from hpcmem.plots.mpl import pyplot, save

BAR_WIDTH = 40
NUM_BINS = 20
STRATEGY_NAMES = {"padded": "padded", "padding_free": "padding-free", "bfd": "packing bfd",
                  "bfd_split": "packing bfd_split", "wrapped": "packing wrapped", "kl": "KTO KL rows"}


def bins(hist: Sequence[Sequence[int]], *, log_x: bool, num_bins: int = NUM_BINS) -> list[tuple[int, int, int]]:
    """(low, high, count) bins covering min…max of a [[length, count], …] histogram; geometric when log_x."""
    low, high = hist[0][0], hist[-1][0]
    if log_x and low >= 1 and high > low:
        edges = [low * (high / low) ** (i / num_bins) for i in range(num_bins + 1)]
    else:
        edges = [low + (high + 1 - low) * i / num_bins for i in range(num_bins + 1)]
    bounds = sorted({math.ceil(e) for e in edges[:-1]} | {high + 1})
    out = [[a, b - 1, 0] for a, b in zip(bounds, bounds[1:])]
    j = 0
    for length, count in hist:
        while length > out[j][1]:
            j += 1
        out[j][2] += count
    return [tuple(b) for b in out]


def histogram_lines(hist: Sequence[Sequence[int]], *, log_x: bool) -> list[str]:
    rows = bins(hist, log_x=log_x)
    top = max(c for _, _, c in rows) or 1
    width = len(f"{rows[-1][1]:,}")
    lines = []
    for low, high, count in rows:
        bar = "█" * round(BAR_WIDTH * count / top)
        lines.append(f"  {low:>{width},} – {high:>{width},} │{bar:<{BAR_WIDTH}}│ {count:,}")
    return lines


def _stats_line(name: str, stats: Mapping) -> str:
    cells = [f"{stats['min']:>7,}", f"{stats['mean']:>9,.1f}"] + [f"{stats[p]:>7,}" for p, _ in PERCENTILES]
    return f"  {name:<14}" + "".join(cells) + f"{stats['max']:>8,}"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f} %" if whole else "    – "


def candidate_lines(profile: Mapping) -> list[str]:
    head = (f"  {'max_length':>10}  {'label':<12}{'cut':>8}{'tok lost':>10}  {'strategy':<18}{'rows':>10}"
            f"{'µbatches':>10}{'padding':>9}{'worst µb':>11}{'typical µb':>12}")
    lines = [head]
    for cand in profile["candidates"]:
        cut = cand["truncated_examples"] + cand["dropped_examples"]
        first = (f"  {cand['max_length'] if cand['max_length'] is not None else 'none':>10}  {cand['label']:<12}"
                 f"{_pct(cut, cand['examples']):>8}{_pct(cand['tokens_lost'], cand['tokens_total']):>10}")
        for i, (name, s) in enumerate(cand["strategies"].items()):
            lead = first if i == 0 else " " * len(first)
            lost = "" if s["tokens_lost"] == cand["tokens_lost"] else "  (keeps every token)" \
                if s["tokens_lost"] == 0 else f"  (loses {_pct(s['tokens_lost'], cand['tokens_total']).strip()})"
            same = "  (= bfd: nothing longer than max_length)" if "same_as" in s else ""
            images = cand.get("image_cut_examples")
            cuts = f"  (cuts into the image tokens of {images:,} examples: TRL fails)" if images else ""
            lines.append(f"{lead}  {STRATEGY_NAMES[name]:<18}{s['rows']:>10,}{s['micro_batches']:>10,}"
                         f"{100 * s['padding_fraction']:>7.1f} %{s['worst_tokens_per_micro_batch']:>11,}"
                         f"{s['typical_tokens_per_micro_batch']:>12,}{same or lost}{cuts}")
    return lines


VISION_ROWS = (("images", "images / example"), ("image_tokens", "image tok / ex"), ("tiles", "tiles / ex"),
               ("patches", "patches / ex"), ("text_tokens", "text tok / row"))


def vision_lines(profile: Mapping) -> list[str]:
    """The image-text counts of a /2 profile: the processor, per-example stats, the worst micro-batch."""
    v = profile["vision"]
    if v.get("family") == "tiles":
        how = (f"resized to {v.get('longest_edge')} px, tiles of {v.get('tile_size')} px"
               f"{'' if v.get('image_splitting') else ' (no splitting: one tile)'}, {v.get('image_seq_len')} tokens "
               f"and {v.get('patches_per_tile')} patches per tile")
    else:
        pixels = "·".join(f"{v[k]:,}" if v.get(k) is not None else "?" for k in ("min_pixels", "max_pixels"))
        how = f"min·max pixels {pixels} · patch {v.get('patch_size')} · merge {v.get('merge_size')}"
    lines = [f"images · processor {v['processor']} ({v['image_processor']}) · {how} · image token "
             f"{v['image_token']!r}", f"  {'':<16}" + "".join(f"{p:>9}" for p in ("p50", "p90", "p99", "max"))]
    for key, name in VISION_ROWS:
        if key in v["stats"]:
            st = v["stats"][key]
            lines.append(f"  {name:<16}" + "".join(f"{st[p]:>9,}" for p in ("p50", "p90", "p99", "max")))
    worst = v["per_micro_batch"]
    copies = " (each example's images once per row: chosen and rejected)" if v["rows_per_example"] > 1 else ""
    tiles = f"{worst['tiles']:,} tiles, " if "tiles" in worst else ""
    lines.append(f"  worst micro-batch of {profile['settings']['per_device_train_batch_size']}: {worst['images']:,} "
                 f"images, {worst['image_tokens']:,} image tokens, {tiles}{worst['patches']:,} vision patches"
                 + copies)
    return lines


def report(profile: Mapping, *, log_x: bool = False) -> str:
    """The terminal report of a profile."""
    src, stats, settings = profile["source"], profile["stats"], profile["settings"]
    what = f"{src['format']}" + (f", field {src['dataset_text_field']!r}" if src["format"] == "text" else "")
    unit = "example" if profile["row_parts"] == ["length"] else "sequence"
    tool = f"processor {src['processor']}" if src.get("processor") else f"tokenizer {src['tokenizer']}"
    lines = [f"hpcmem lengths · {src['data']} ({src['split']}) · {tool} · "
             f"{src['trainer']} ({what})",
             f"{profile['examples']:,} examples · {stats['count']:,} sequences · {stats['total_tokens']:,} tokens"
             + (" (text and image tokens)" if "vision" in profile else ""),
             "",
             f"  {'tokens per ' + unit:<14}" + f"{'min':>7}{'mean':>9}"
             + "".join(f"{p:>7}" for p, _ in PERCENTILES) + f"{'max':>8}"]
    if len(profile["part_stats"]) > 1 or profile["row_parts"] != ["length"]:
        lines += [_stats_line(name, s) for name, s in profile["part_stats"].items()]
    lines += [_stats_line("all" if len(profile["part_stats"]) > 1 else "length", stats), ""]
    if "vision" in profile:
        lines += vision_lines(profile) + [""]
    lines += [f"histogram of tokens per {unit}{' (log x)' if log_x else ''}"]
    lines += histogram_lines(profile["histogram"], log_x=log_x)
    multiple = settings["pad_to_multiple_of"]
    lines += ["", f"max_length candidates · per_device_train_batch_size {settings['per_device_train_batch_size']} "
                  f"· pad_to_multiple_of {multiple if multiple else 'none'} · cut = examples truncated or dropped "
                  "· µb = tensor tokens per micro-batch"]
    lines += candidate_lines(profile)
    if "padding_free" in profile["candidates"][0]["strategies"]:
        lines.append("  padding-free without packing: TRL needs max_length none; under a max_length the row assumes "
                     "data pre-truncated to it")
    rec = profile["recommendation"]
    how = "padded" if not rec["packing"] else f"packing=True, packing_strategy={rec['packing_strategy']}"
    chosen = f"max_length {rec['max_length']}" if rec["max_length"] is not None else "prompts not truncated"
    lines += ["", f"recommendation: {chosen} · {how}", f"  {rec['reason']}"]
    return "\n".join(lines)


def plot(profile: Mapping, path: str, *, log_x: bool = False) -> None:
    """Histogram of tokens per sequence with p50/p95/p99 and the recommended max_length, saved as a PNG."""
    plt = pyplot("hpcmem lengths --plot")
    hist, stats = profile["histogram"], profile["stats"]
    edges = [low for low, _, _ in bins(hist, log_x=log_x, num_bins=60)] + [hist[-1][0] + 1]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.hist([n for n, _ in hist], bins=edges, weights=[c for _, c in hist], color="#4c72b0")
    rec = profile["recommendation"]["max_length"]
    if rec is not None:  # drawn first and wide, so a percentile at the same length stays visible on top
        ax.axvline(rec, color="#c44e52", linewidth=4, alpha=0.5, label=f"recommended max_length = {rec:,}")
    for name, style in (("p50", ":"), ("p95", "--"), ("p99", "-.")):
        ax.axvline(stats[name], color="#222222", linestyle=style, label=f"{name} = {stats[name]:,}")
    if log_x:
        ax.set_xscale("log")
    src = profile["source"]
    ax.set_xlabel("tokens per sequence")
    ax.set_ylabel("sequences")
    ax.set_title(f"{src['data']} · {src['trainer']} · {stats['count']:,} sequences")
    ax.legend()
    fig.tight_layout()
    save(fig, path)
