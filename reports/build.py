"""`aiayn report`: Table 3 per preset (Markdown, CSV, LaTeX, HTML) and its plots, from every metrics.json of a runs dir.

Everything here is generated; each file's first line says by which command.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from aiayn.ablations.predictions import (
    PREDICTIONS_FILE,
    registration_sha256,
)
from aiayn.ablations.presets import PRESETS, get_preset
from aiayn.ablations.stages import Stage, level, stages
from aiayn.ablations.table import FAMILIES
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_text
from aiayn.common.secrets import redact
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.spec import sweep_key
from aiayn.reports import findings, plots, stats, verdicts
from aiayn.reports.against import write_against
from aiayn.reports.notes import Facts, capped_lead, headline, report_notes, runs_recorded, stage_notes
from aiayn.reports.render import Page, html_page, latex, markdown
from aiayn.reports.runs import Run, Scan, read_curve, scan
from aiayn.reports.table import Table3, build_table, rounded, row_order, set_verdicts

log = logging.getLogger(__name__)

PLOTS = {
    "families.png": "each family of Table 3: every seed's Δ against base on the metric the family is scored on, the "
    "mean with its 95% interval, the paper's Δ",
    "forest.png": "every row not scored on BLEU: its Δ dev PPL against base with its 95% interval, the paper's Δ, the "
    "verdict of the rows scored on PPL and the equivalence band",
    "forest_bleu.png": "the rows scored on BLEU: their Δ dev BLEU against base with its 95% interval, the paper's Δ "
    "and the verdict",
    "delta_vs_paper.png": "our Δ PPL and Δ BLEU vs the paper's",
    "curves.png": "training loss, learning rate (once per schedule), dev PPL (the stability rule's points dotted) and, "
    "where logged, dev BLEU: each row's mean over its seeds and their range",
    "bleu_vs_params.png": "dev BLEU vs parameters",
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
    t3, scored_preset, convergence, reading, family, baselines, staged, first_stage = _judged(
        runs, found, preset, data, capped
    )
    table = t3.rows
    per_run = pd.concat(
        [t3.runs.assign(stage=1)] + [r.t3.runs.assign(stage=r.stage.number) for r in staged if r.t3 is not None],
        ignore_index=True,
    )
    title = f"Table 3 at preset {preset} ({data or 'unknown corpus'})"
    plot_dir = out_dir / f"{name}-plots"
    panels = _family_panels(t3, staged, family, first_stage)
    plot_files = _write_plots(
        table, _decided_rows(t3, staged), runs, panels, plot_dir, title, capped, scored=scored_preset is not None
    )
    plots_alt = [(path.name, PLOTS[path.name]) for path in plot_files]
    facts = _facts(t3, runs, found, preset, data, family, baselines, scored_preset, convergence, reading)
    notes = report_notes(facts) + stage_notes(staged)
    log.info("%s: %s", name, headline(table, family, baselines) + (f"; capped: {len(capped)} run(s)" if capped else ""))
    notice = f"Generated by `{command}`; do not edit."
    found_first = _findings(t3, staged, runs, family, first_stage, baselines, preset) if family and not capped else None
    page = Page(
        title,
        notice,
        table,
        notes,
        capped_lead(capped, runs),
        found_first,
        [(f"Stage {r.stage.number}", r.t3.rows) for r in staged if r.t3 is not None],
        level(preset) if scored_preset else stats.ALPHA,
    )
    provenance = _provenance(
        command, notice, preset, data, runs, family, baselines, scored_preset, convergence, reading, found_first
    )
    texts = _texts(page, t3, per_run, runs, plot_dir, plots_alt, provenance)
    # masked again: a metrics.json written by an older aiayn (or by hand) may hold a secret in its error
    files = [atomic_write_text(out_dir / f"{name}{suffix}", redact(text)) for suffix, text in texts.items()]
    if against is not None:
        files += write_against(out_dir / f"{name}.csv", against, notice)
    return files + plot_files


def _facts(t3: Table3, runs, found: Scan, preset, data, family, baselines, scored_preset, convergence, reading):
    """What the report's notes are written from (reports/notes.py)."""
    skipped = [(path, why) for path, why in found.skipped if _belongs(path, preset)]
    return Facts(
        t3.rows,
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


def _findings(t3: Table3, staged, runs: list[Run], family, first_stage, baselines, preset: str):
    """What the table found, first: each registered test's verdict with its evidence (stage 1 and later stages)."""
    evidence, stage_of = _evidence(t3, staged, runs)
    cells = [preset, *PRESETS[preset].cells]
    return findings.build(t3.rows, family, first_stage, stage_of, evidence, baselines, cells, _by_row(t3, runs))


def _texts(page: Page, t3: Table3, per_run, runs: list[Run], plot_dir: Path, plots_alt, provenance: str) -> dict:
    """Each file of a report by its suffix. CSVs as tools read them: the header on the first line, provenance in the
    .json beside them."""
    csv = dict(index=False, na_rep="", lineterminator="\n")
    return {
        ".md": markdown(page, [(f"{plot_dir.name}/{file}", alt) for file, alt in plots_alt]),
        ".csv": rounded(t3.rows).to_csv(**csv),
        "-runs.csv": rounded(per_run).to_csv(**csv),
        "-slopes.csv": rounded(t3.slopes).to_csv(**csv),
        "-curves.csv": curves_csv(runs),
        ".tex": latex(page),
        ".html": html_page(page, [(_data_uri(plot_dir / file), alt) for file, alt in plots_alt]),
        ".json": provenance,
    }


def _by_row(t3: Table3, runs: list[Run]) -> dict[str, list[Run]]:
    """Stage 1's completed runs (those in its table), by row."""
    seeds = {(row, int(seed)) for row, seed in zip(t3.runs["row"], t3.runs["seed"])}
    out: dict[str, list[Run]] = {}
    for r in runs:
        if r.completed and (r.row, r.seed) in seeds:
            out.setdefault(r.row, []).append(r)
    return out


def _evidence(t3: Table3, staged: list, runs: list[Run]) -> tuple[dict, dict]:
    """row -> the cell and runs its decided verdict was judged on (a whole later stage's, else stage 1's), and
    row -> the stage that decided it (stage 1's rows absent)."""
    first = findings.Evidence(t3.cell, _by_row(t3, runs))
    out = {row: first for row in t3.cell.values} if t3.cell is not None else {}
    stage_of = {}
    for r in staged:
        if r.whole:
            ev = findings.Evidence(r.t3.cell, _by_row(r.t3, runs))
            for row in r.stage.tests:
                out[row] = ev
                stage_of[row] = r.stage.number
    return out, stage_of


def _decided_rows(t3: Table3, staged: list) -> pd.DataFrame:
    """Stage 1's table with each row a whole later stage decided drawn from that stage's table (its Δ, interval and
    verdict over its own seeds), named `ROW, stage N`: the forests and delta_vs_paper show the evidence each verdict on
    the first screen stands on."""
    later = {
        row: r.t3.rows[r.t3.rows["row"] == row].assign(row=f"{row}, stage {r.stage.number}")
        for r in staged
        if r.whole
        for row in r.stage.tests
    }
    lines = [later.get(row, t3.rows.iloc[[i]]) for i, row in enumerate(t3.rows["row"])]
    return pd.concat(lines, ignore_index=True)


def _family_panels(t3: Table3, staged: list, family: dict, first: dict) -> list:
    """The families figure's panels (plots.families): per family, its metric (BLEU where a test of it is scored on
    BLEU) and its lines: base's seeds (their noise), then per row each seed's Δ against its own stage's base, stage
    1's first, then each whole later stage's, with the row's interval, verdict and any equivalence band."""
    scored_on = {row: v.metric for (_, row), v in family.items() if v.metric}
    tables = [(1, t3, first)] + [(r.stage.number, r.t3, r.family) for r in staged if r.whole]
    panels = []
    for name, rows in FAMILIES:
        metric = "bleu" if any(scored_on.get(r) == "bleu" for r in rows) else "ppl"
        lines = [plots.FamilyLine("base", 1, _seed_deltas(t3, "base", metric))]
        for row in rows:
            for stage, t, judged in tables:
                deltas = _seed_deltas(t, row, metric)
                if deltas:
                    paper = _paper_delta(t3.rows, row, metric)
                    margin = next((v.margin for (_, r), v in judged.items() if r == row), None)
                    lines.append(_family_line(t, row, stage, deltas, metric, paper, margin))
        panels.append((name, metric, lines if len(lines) > 1 else []))
    return panels


def _family_line(t: Table3, row: str, stage: int, deltas: list, metric: str, paper, margin) -> plots.FamilyLine:
    """A row's line in its family's panel; `margin`: its test's equivalence margin in the metric's scale, if any."""
    line = t.rows[t.rows["row"] == row].iloc[0]
    ci = (
        (line["delta_ppl_ci_low"], line["delta_ppl_ci_high"])
        if metric == "ppl"
        else (line["delta_bleu_ci_low"], line["delta_bleu_ci_high"])
    )
    scored = line["metric"] == metric and line["predicted"] in plots.SCORED_PREDICTIONS
    band = None  # half the band in the panel's units: BLEU points, or percent of dev PPL from a log-PPL margin
    if scored and margin:
        band = margin if metric == "bleu" else 100 * math.expm1(margin)
    return plots.FamilyLine(row, stage, deltas, paper, ci, line["verdict"] if scored else "", band)


def _seed_deltas(t: Table3, row: str, metric: str) -> list[float]:
    """Each completed seed of `row` against its table's base mean: percent of dev PPL (geometric mean), or BLEU; for
    base, its own seeds against their mean."""
    import numpy as np

    done = t.runs[t.runs["status"] == "completed"]
    col = "dev_ppl" if metric == "ppl" else "dev_bleu"
    mine, base = done.loc[done["row"] == row, col].dropna(), done.loc[done["row"] == "base", col].dropna()
    if mine.empty or base.empty:
        return []
    if metric == "ppl":
        return list(100 * (mine / float(np.exp(np.log(base).mean())) - 1))
    return list(mine - float(base.mean()))


def _paper_delta(table: pd.DataFrame, row: str, metric: str):
    line = table[table["row"] == row]
    if line.empty:
        return None
    value = line["paper_delta_ppl_pct" if metric == "ppl" else "paper_delta_bleu"].iloc[0]
    return None if pd.isna(value) else float(value)


@dataclass(frozen=True)
class StageResult:
    """A later stage of a table (ablations/stages.py) as its own runs judge it: its table (None before any of its runs
    completed), its verdicts and the baselines' on them, and whether it is whole (every registered seed completed:
    only a whole stage decides, no verdict is read from part of one)."""

    stage: Stage
    t3: Table3 | None
    family: dict
    baselines: dict
    whole: bool


def _judged(runs: list[Run], found: Scan, preset: str, data: str, capped: list) -> tuple:
    """(table, the preset scored, its convergence rule, its stability reading, the verdicts, the baselines', each
    later stage's result, stage 1's verdicts): the pre-registered verdicts are about the preset's own regime, its corpus
    and budget, so runs cut short by --max-steps are a look, reported and never scored. The table is stage 1's (the
    runs of no later stage); a whole later stage decides the tests it carries on, in the verdicts returned."""
    known = PRESETS.get(preset)
    scored_preset = preset if known is not None and data == known.corpus and not capped else None
    convergence = known.convergence if known is not None else "endpoints"
    reading = known.stability if known is not None else "nearest"
    later = stages(preset) if scored_preset else []
    first = [r for r in runs if not any(s.holds(r.seed) for s in later)]
    t3 = build_table(first, scored_preset, convergence, reading)
    family, baselines = _family(t3, found, known) if scored_preset else ({}, {})
    set_verdicts(t3.rows, {row: v for (cell, row), v in family.items() if cell == preset})
    staged = [_stage(s, [r for r in runs if s.holds(r.seed)], convergence, reading) for s in later]
    decided, decided_baselines = dict(family), {k: dict(v) for k, v in baselines.items()}
    for result in staged:
        if result.whole:
            decided.update(result.family)
            for name, judged in result.baselines.items():
                decided_baselines.setdefault(name, {}).update(judged)
    return t3, scored_preset, convergence, reading, decided, decided_baselines, staged, family


def _stage(stage: Stage, runs: list[Run], convergence: str, reading: str) -> StageResult:
    done = [r for r in runs if r.completed]
    if not done:
        return StageResult(stage, None, {}, {}, False)
    t3 = build_table(runs, stage.preset, convergence, reading, stage=stage)
    family, baselines = verdicts.judge_cells([t3.cell]), verdicts.judge_baselines([t3.cell])
    set_verdicts(t3.rows, {row: v for (_, row), v in family.items()})
    have = {row: sum(r.row == row for r in done) for row in stage.seeds}
    return StageResult(stage, t3, family, baselines, all(have[row] >= n for row, n in stage.seeds.items()))


def _write_plots(
    table, decided, runs: list[Run], panels: list, plot_dir: Path, title: str, capped: list, scored: bool
) -> list[Path]:
    """The report's plots (PLOTS, in the order a reader meets them; the BLEU forest where a row is scored on BLEU);
    every plot pasted alone says it is a look where runs were capped: the capped runs' numbers are no result. The
    forests and delta_vs_paper draw each row as its verdict was decided (`decided`: a later stage's where one did)."""
    look = f"{title}\na look: {len(capped)} run(s) capped by --max-steps, no verdict" if capped else title
    written = [
        plots.families(panels, plot_dir / "families.png", look),
        plots.forest(decided, plot_dir / "forest.png", look, "ppl"),
    ]
    if decided["metric"].eq("bleu").any():
        written.append(plots.forest(decided, plot_dir / "forest_bleu.png", look, "bleu"))
    return written + [
        plots.delta_vs_paper(decided, plot_dir / "delta_vs_paper.png", look),
        plots.curves(
            _curves(runs),
            plot_dir / "curves.png",
            title,
            capped=capped,
            points=verdicts.STABILITY[:-1] if scored else (),
            bleu_sets=_bleu_sets(runs),
        ),
        plots.bleu_vs_params(table, plot_dir / "bleu_vs_params.png", look),
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


def _provenance(
    command, notice, preset, data, runs, family, baselines, scored_preset, convergence, reading, found=None
) -> str:
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
        "findings": {"families": found.families, "predictors": found.predictors, "misses": found.misses}
        if found
        else None,
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


def _bleu_sets(runs: list[Run]) -> str:
    """Which dev sentences the runs beam-decoded for BLEU at their validations, said only where runs differ (the real
    table's stage 1 decoded the first 500, stage 2 all 1014): a row's line then mixes two instruments."""
    sets = set()
    for run in runs:
        config, dev = run.config, run.metrics.dev_sentences
        if config is not None and dev:
            k = config.options.get("val_bleu_sentences")
            k = config.spec.preset.val_bleu_sentences if k is None else k
            sets.add("all" if k >= dev else f"the first {k}")
    if len(sets) < 2:
        return ""
    return f"runs differ: {' or '.join(sorted(sets, key=lambda s: (s == 'all', s)))} dev sentences"


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
