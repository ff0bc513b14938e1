"""`hpcmem calibrate --collect CAMPAIGN` (what the campaign's last job runs): merge, fit, report, install.

1. the campaign's records (records/<gpu>.jsonl: every case that ran, ok or out of memory) are held to the estimate
   with `hpcmem validate probes` (hpcmem.validate.against_probes), cell by cell and peak by peak;
2. the GPU's calibration is fitted from them (hpcmem.validate.calibration: context, allocator, margins per peak with
   the coverage n allows; the throughput model's MFU curve from the timed steps) — twice: the margins are fitted
   again once the fitted context is in place, so they measure the estimate the calibration will make;
3. the calibration names the campaign (site, date, n, the cases planned, done, failed) and is installed as
   <install_dir>/calibrations/<gpu>.json, on the search path (hpcmem.gpus.calibration) — from then on every estimate
   on that GPU, and every preset naming it, says "calibrated at <site> on <date>, n = …";
4. report/ gets report.md, report.json, accuracy.png (matplotlib when installed) and a copy of the calibration.
A partial campaign (cases failed or still missing) is collected the same way and says its n.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from hpcmem.calibrate.campaign import Campaign, now
from hpcmem.datapath import ENV_DATA, site_dirs
from hpcmem.gpus.catalog import gpu_slug
from hpcmem.validate import against_probes
from hpcmem.validate.speed import render as render_speed
from hpcmem.validate.table import render


def _on_search_path(install_dir: Path) -> None:
    """Make this process read the calibration it installs (the second fit must see the fitted context)."""
    if install_dir.resolve() not in {d.resolve() for d in site_dirs()}:
        os.environ[ENV_DATA] = os.pathsep.join([str(install_dir), os.environ.get(ENV_DATA, "")]).rstrip(os.pathsep)


def campaign_block(camp: Campaign) -> dict[str, Any]:
    planned = sorted(camp.data["cases"])
    done, failed = camp.done(), camp.failed()
    return {"name": camp.name, "site": camp.data["site"], "date": now()[:10], "n": len(camp.records()),
            "device": camp.data["device"], "preset": camp.data["preset"], "folder": str(camp.root),
            "cases": {"planned": len(planned), "done": len(done & set(planned)), "failed": len(failed),
                      "missing": sorted(set(planned) - done - set(failed))}}


def collect(camp: Campaign, *, install_dir: str | Path | None = None, png: bool = True) -> dict[str, Any]:
    install = Path(install_dir or camp.data["install_dir"]).absolute()
    _on_search_path(install)
    report_dir = camp.root / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    block = campaign_block(camp)
    slug = gpu_slug(camp.gpu_name)
    extra = {"gpu": slug, "catalog_name": camp.gpu_name, "campaign": block,
             "source": f"campaign {camp.name} at {block['site']}: {block['n']} probe records, fitted {block['date']}"}
    records = [camp.records_file] if camp.records_file.is_file() else []
    out: dict[str, Any] = {"campaign": block, "calibration": None, "report": str(report_dir / "report.md")}
    if records:
        against_probes(records, fit=True, fit_dir=install / "calibrations", extra=extra)       # the context first
        report = against_probes(records, fit=True, fit_dir=install / "calibrations", extra=extra, speed=True,
                                png=report_dir / "accuracy.png" if png else None)
        if report.calibrations:
            installed = Path(report.calibrations[0])
            shutil.copyfile(installed, report_dir / installed.name)
            out["calibration"] = str(installed)
        out["accuracy"] = report.to_json()
    else:
        report = None
    _write_report(camp, block, report, out, report_dir)
    return out


def _case_lines(camp: Campaign) -> list[str]:
    done, failed = camp.done(), camp.failed()
    lines = ["| case | family | GPUs × nodes | predicted | state |", "|---|---|---|---|---|"]
    for name, cc in sorted(camp.cases().items()):
        state = "recorded" if name in done else f"failed: {failed[name]}" if name in failed else "missing"
        frac = "-" if cc.fraction is None else f"{100 * cc.fraction:.0f} %"
        lines.append(f"| {name} | {cc.family} | {cc.gpus} × {cc.nodes} | {frac} | {state.replace('|', '/')} |")
    return lines


def _write_report(camp: Campaign, block: dict[str, Any], report: Any, out: dict[str, Any], folder: Path) -> None:
    c = block["cases"]
    text = [f"# Calibration campaign {camp.name}", "",
            f"{camp.gpu_name} at {block['site']} ({camp.data['device']}), preset {camp.data['preset']}, collected "
            f"{now()}: {block['n']} records; cases planned {c['planned']}, recorded {c['done']}, failed "
            f"{c['failed']}, missing {len(c['missing'])}.", "",
            f"Calibration: {out['calibration'] or 'none (no record to fit)'}", ""]
    if report is not None:
        text += ["## Accuracy per cell and peak", "", "```", render(report.rows) if report.rows else "no pairs", "```",
                 "", "## Speed", "", "```", render_speed(report.speed) if report.speed else "no timed runs", "```",
                 "", *[f"- {n}" for n in report.notes], ""]
    text += ["## Cases", "", *_case_lines(camp), ""]
    (folder / "report.md").write_text("\n".join(text), encoding="utf-8")
    (folder / "report.json").write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
