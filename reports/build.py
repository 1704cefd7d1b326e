"""`aiayn report`: Table 3 per preset (Markdown, CSV, LaTeX, HTML) and its plots, from every metrics.json of a runs dir.

Everything here is generated; each file's first line says by which command.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from aiayn.ablations.predictions import (
    PREDICTIONS_FILE,
    registration_sha256,
)
from aiayn.ablations.presets import PRESETS, get_preset
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_text
from aiayn.common.secrets import redact
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.spec import sweep_key
from aiayn.reports import plots, stats, verdicts
from aiayn.reports.against import write_against
from aiayn.reports.notes import Facts, capped_lead, headline, lead, report_notes, runs_recorded
from aiayn.reports.render import html_page, latex, markdown
from aiayn.reports.runs import Run, Scan, read_curve, scan
from aiayn.reports.table import build_table, rounded, row_order, set_verdicts

log = logging.getLogger(__name__)

PLOTS = {
    "forest.png": "every row's Δ dev PPL against base (with its 95% interval where seeds allow), the paper's Δ and the "
    "equivalence band",
    "bleu_vs_params.png": "dev BLEU vs parameters",
    "delta_vs_paper.png": "our Δ PPL and Δ BLEU vs the paper's",
    "curves.png": "training loss, learning rate (once per schedule), dev PPL (the stability rule's points dotted) and, "
    "where logged, dev BLEU of every row and seed",
}
CURVES = ("train/loss", "lr", "val/ppl", "val/bleu")


UNRECORDED_CORPUS = "corpus-unrecorded"  # the name part of runs whose metrics.json names no corpus, beside others


def report_name(preset: str, data: str, *, apart: bool = False) -> str:
    """table3-PRESET, or table3-PRESET-CORPUS for runs of a preset on another corpus than its own; `apart`: runs
    that recorded no corpus, reported beside runs that did (table3-PRESET-corpus-unrecorded), so that neither
    group's files overwrite the other's."""
    known = PRESETS.get(preset)
    if not data:
        return f"table3-{preset}-{UNRECORDED_CORPUS}" if apart else f"table3-{preset}"
    if known is None or data == known.corpus:
        return f"table3-{preset}"
    return f"table3-{sweep_key(preset, CorpusRef.recorded(data))}"  # a file name: hf:wmt/wmt16:de-en is hf-wmt--...


def _dirs(runs_dir) -> list[Path]:
    return [Path(runs_dir)] if isinstance(runs_dir, (str, Path)) else [Path(d) for d in runs_dir]


def command_line(runs_dir, out_dir, preset: str | None, against: Path | None = None) -> str:
    runs = " ".join(f"--runs {d}" for d in _dirs(runs_dir))
    tail = (f" --preset {preset}" if preset else "") + (f" --against {against}" if against else "")
    return f"aiayn report {runs} --out {out_dir}{tail}"


def write_reports(runs_dir, out_dir: str | Path, preset: str | None = None, against: Path | None = None) -> list[Path]:
    """Write Table 3 (md, csv, tex, html) and its plots for each (preset, corpus) found, and with `against` (a report
    folder) each one's comparison with that folder's report of the same name (reports/against.py); return the paths
    written.
    `runs_dir` is one output directory or several (seed sets run separately, pooled into one table: a (row, seed)
    found in two of them is kept once, from the first, with a warning)."""
    if preset is not None:
        get_preset(preset)  # UserError naming the presets there are
    dirs = _dirs(runs_dir)
    found = Scan()
    for d in dirs:
        one = scan(d)
        found.runs += one.runs
        found.skipped += one.skipped
    keys = sorted({(r.preset, r.data) for r in found.runs})
    if preset is not None:
        keys = [k for k in keys if k[0] == preset]
    if not keys:
        what = f"metrics.json of preset {preset!r}" if preset else "readable metrics.json"
        there = sorted({r.preset for r in found.runs})
        where = ", ".join(repr(str(d)) for d in dirs)
        raise UserError(
            f"no {what} under {where} (presets found: {', '.join(there) or 'none'}; "
            f"{len(found.skipped)} file(s) skipped); train the preset first or pick another --preset"
        )
    command = command_line(dirs, out_dir, preset, against)
    written = []
    for p, data in keys:
        runs = [r for r in found.runs if (r.preset, r.data) == (p, data)]
        # runs that recorded no corpus beside runs of the preset's own: two groups, two names (one overwrote the other)
        apart = not data and any(q == p and d for q, d in keys)
        written += write_report(runs, found, p, data, Path(out_dir), command, apart=apart, against=against)
    return written


def report(runs_dir, out_dir, preset: str | None = None, *, wandb: bool = False, against: Path | None = None):
    """`aiayn report` (and a sweep's --report): write the reports of `runs_dir` into `out_dir`; with `wandb`, log
    each to W&B as well (its table and its files); with `against`, compare each with that folder's. The files
    written."""
    paths = write_reports(runs_dir, out_dir, preset=preset, against=against)
    if wandb:
        from aiayn.reports.wandb_export import log_reports

        log_reports(paths, command_line(runs_dir, out_dir, preset))
    return paths


def write_report(
    runs: list[Run],
    found: Scan,
    preset: str,
    data: str,
    out_dir: Path,
    command: str,
    apart: bool = False,
    against: Path | None = None,
) -> list[Path]:
    name = report_name(preset, data, apart=apart)
    runs = _dedupe(runs)
    capped = _capped(runs)
    t3, scored_preset, convergence, reading, family, baselines = _judged(runs, found, preset, data, capped)
    table, per_run = t3.rows, t3.runs
    title = f"Table 3 at preset {preset} ({data or 'unknown corpus'})"
    plot_dir = out_dir / f"{name}-plots"
    written = _write_plots(table, runs, plot_dir, title, capped, scored=scored_preset is not None)
    plot_links = [(f"{plot_dir.name}/{file}", alt) for file, alt in PLOTS.items()]
    skipped = [(path, why) for path, why in found.skipped if _belongs(path, preset)]
    facts = Facts(
        table,
        runs,
        preset,
        data,
        skipped,
        family,
        baselines,
        scored_preset,
        convergence,
        t3.slopes,
        reading,
        t3.mismatched or {},
    )
    notes = report_notes(facts)
    log.info("%s: %s", name, headline(table, family, baselines) + (f"; capped: {len(capped)} run(s)" if capped else ""))
    notice = f"Generated by `{command}`; do not edit."
    first = capped_lead(capped, runs) or lead(family, baselines)
    # CSVs as tools read them: the header on the first line, provenance in the .json beside them
    texts = {
        ".md": markdown(table, notes, title, notice, plot_links, first),
        ".csv": rounded(table).to_csv(index=False, na_rep="", lineterminator="\n"),
        "-runs.csv": rounded(per_run).to_csv(index=False, na_rep="", lineterminator="\n"),
        "-slopes.csv": rounded(t3.slopes).to_csv(index=False, na_rep="", lineterminator="\n"),
        "-curves.csv": curves_csv(runs),
        ".tex": latex(table, notes, title, notice, first),
        ".html": html_page(
            table, notes, title, notice, [(_data_uri(plot_dir / file), alt) for file, alt in PLOTS.items()], first
        ),
        ".json": _provenance(
            command, notice, preset, data, runs, family, baselines, scored_preset, convergence, reading
        ),
    }
    # masked again: a metrics.json written by an older aiayn (or by hand) may hold a secret in its error
    files = [atomic_write_text(out_dir / f"{name}{suffix}", redact(text)) for suffix, text in texts.items()]
    if against is not None:
        files += write_against(out_dir / f"{name}.csv", against, notice)
    return files + written


def _judged(runs: list[Run], found: Scan, preset: str, data: str, capped: list) -> tuple:
    """(table, the preset scored, its convergence rule, its stability reading, the registration's verdicts, the
    baselines'): the pre-registered verdicts are about the preset's own regime, its corpus and budget, so runs cut
    short by --max-steps are a look, reported and never scored."""
    known = PRESETS.get(preset)
    scored_preset = preset if known is not None and data == known.corpus and not capped else None
    convergence = known.convergence if known is not None else "endpoints"
    reading = known.stability if known is not None else "nearest"
    t3 = build_table(runs, scored_preset, convergence, reading)
    family, baselines = _family(t3, found, known) if scored_preset else ({}, {})
    set_verdicts(t3.rows, {row: v for (cell, row), v in family.items() if cell == preset})
    return t3, scored_preset, convergence, reading, family, baselines


def _write_plots(table, runs: list[Run], plot_dir: Path, title: str, capped: list, scored: bool) -> list[Path]:
    """The report's four plots (PLOTS); every plot pasted alone says it is a look where runs were capped: the
    capped runs' numbers are no result."""
    look = f"{title}\na look: {len(capped)} run(s) capped by --max-steps, no verdict" if capped else title
    return [
        plots.bleu_vs_params(table, plot_dir / "bleu_vs_params.png", look),
        plots.delta_vs_paper(table, plot_dir / "delta_vs_paper.png", look),
        plots.forest(table, plot_dir / "forest.png", look),
        plots.curves(
            _curves(runs),
            plot_dir / "curves.png",
            title,
            capped=capped,
            points=verdicts.STABILITY[:-1] if scored else (),
        ),
    ]


def _data_uri(png: Path) -> str:
    """A plot inlined into the HTML report (a data URI), so that the page alone, mailed or uploaded, shows it."""
    import base64

    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def _family(t3, found: Scan, known) -> tuple[dict, dict]:
    """(preset, row) -> Verdict of the preset's tests and, for a suite, of its cells' (each cell's runs of its own
    corpus), in one Holm family; and each naive baseline's verdicts (verdicts.BASELINES) on the same numbers."""
    cells = [t3.cell]
    for name in known.cells:
        cell = PRESETS[name]
        runs = _dedupe([r for r in found.runs if r.preset == name and r.data == cell.corpus])
        cells.append(build_table(runs, name, cell.convergence, cell.stability).cell)
    return verdicts.judge_cells(cells), verdicts.judge_baselines(cells)


def curves_csv(runs: list[Run]) -> str:
    """Every run's dev curves logged during training, compact (one line per validation: row, seed, step, val_ppl and
    val_bleu where logged, 6 significant digits), so that a reader re-derives the last-quarter falls and the
    stability rule's points from the report alone."""
    frames = []
    order = {row: i for i, row in enumerate(row_order({r.row for r in runs}))}
    for run in sorted((r for r in runs if r.completed), key=lambda r: (order[r.row], r.seed)):
        parts = [read_curve(run.dir, m).set_index("step") for m in ("val/ppl", "val/bleu")]
        df = pd.concat(parts, axis=1).reset_index()
        if df.empty:
            continue
        df = df.rename(columns={"val/ppl": "val_ppl", "val/bleu": "val_bleu"})
        frames.append(df.assign(row=run.row, seed=run.seed))
    columns = ["row", "seed", "step", "val_ppl", "val_bleu"]
    if not frames:
        return ",".join(columns) + "\n"
    df = pd.concat(frames, ignore_index=True).reindex(columns=columns)
    if df["val_bleu"].isna().all():
        df = df.drop(columns="val_bleu")
    return df.to_csv(index=False, na_rep="", lineterminator="\n", float_format="%.6g")


def _capped(runs: list[Run]) -> list[str]:
    """'ROW seed S: N of M steps' for every completed run that trained fewer steps than its row's budget at its
    preset (`--max-steps`)."""
    return [f"{r.row} seed {r.seed}: {r.metrics.steps} of {r.budget} steps" for r in runs if r.capped]


def _provenance(command, notice, preset, data, runs, family, baselines, scored_preset, convergence, reading) -> str:
    import json

    from aiayn import __version__

    summary = verdicts.score(family, baselines) if family else None
    doc = {
        "generated_by": command,
        "notice": notice,
        "aiayn": __version__,
        "preset": preset,
        "corpus": data,
        "predictions": f"ablations/{PREDICTIONS_FILE.name}" if scored_preset else None,
        "predictions_sha256": registration_sha256(scored_preset) if scored_preset else None,
        "cells": list(PRESETS[preset].cells) if scored_preset else [],
        "runs_recorded": runs_recorded(runs),
        "last_quarter_fall": verdicts.rule_text(convergence),
        "stability_rule": verdicts.stability_text(reading),
        "alpha": stats.ALPHA,
        "score": summary,
        "files": {
            "table": "one line per row (the .csv)",
            "runs": "one line per run (the -runs.csv)",
            "slopes": "one line per series of Table 3 (the -slopes.csv)",
            "curves": "one line per validation of every completed run (the -curves.csv)",
        },
    }
    return json.dumps(doc, indent=2, default=_json_number) + "\n"


def _json_number(x):
    return None if x is None else float(x)


def _dedupe(runs: list[Run]) -> list[Run]:
    """One run per (row, seed): two directories claiming the same run keep the first (path order), with a warning."""
    seen: dict[tuple[str, int], Run] = {}
    for run in runs:
        key = (run.row, run.seed)
        if key in seen:
            log.warning("%s duplicates %s (row %s, seed %d); keeping the first", run.dir, seen[key].dir, *key)
            continue
        seen[key] = run
    return list(seen.values())


def _belongs(path: Path, preset: str) -> bool:
    """A skipped file is listed in this preset's report unless its path puts it under another known preset."""
    first = path.parts[0] if len(path.parts) > 1 else None
    return first is None or first == preset or first not in PRESETS


def _curves(runs: list[Run]) -> dict[tuple[str, int], pd.DataFrame]:
    """(row, seed) -> its logged curves (CURVES), for every run that has any."""
    out = {}
    order = {row: i for i, row in enumerate(row_order({r.row for r in runs}))}
    for run in sorted(runs, key=lambda r: (order[r.row], r.seed)):
        frames = [read_curve(run.dir, m).set_index("step") for m in CURVES]
        # the union of the metrics' steps, in step order (concat appends the steps one metric alone logged at the end)
        df = pd.concat(frames, axis=1).sort_index().reset_index() if any(len(f) for f in frames) else pd.DataFrame()
        if not df.empty:
            out[(run.row, run.seed)] = df
    return out
