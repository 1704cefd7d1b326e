"""`aiayn report`: Table 3 per preset (Markdown, CSV, LaTeX, HTML) and its plots, from every metrics.json of a runs dir.

Everything here is generated; each file's first line says by which command.
"""

from __future__ import annotations

import html
import logging
import math
import re
from pathlib import Path

import pandas as pd

from aiayn.ablations.knobs import KNOBS, MODEL_KEYS
from aiayn.ablations.predictions import (
    MIN_PAPER_DELTA_BLEU,
    MIN_PAPER_DELTA_PPL,
    PREDICTIONS_FILE,
    SCORED,
    predictions,
    registration_sha256,
)
from aiayn.ablations.presets import PRESETS, get_preset
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_text
from aiayn.common.secrets import redact
from aiayn.lightning_modules.run.spec import sweep_key
from aiayn.reports import plots, significance, stats, verdicts
from aiayn.reports.runs import Run, Scan, read_curve, scan
from aiayn.reports.table import build_table, rounded, row_order, set_verdicts

log = logging.getLogger(__name__)

# Where every run leaves the paper, whatever its row (README "Faithful to the paper, and where not").
GLOBAL_DEVIATIONS = (
    "label smoothing spreads ε over all V classes (PyTorch), not the V − 1 others (tensor2tensor)",
    "initialization (not stated in the paper): Xavier-uniform projections, N(0, d_model^-0.5) embeddings",
    "the table's BLEU is sacreBLEU on detokenized output; the paper's tokenized BLEU (Moses tokenizer, compound "
    "splitting, multi-bleu) is each run's `dev_tok_bleu` in metrics.json (`aiayn score` scores any output so)",
)
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
    return f"table3-{sweep_key(preset, data)}"  # a file name: hf:wmt/wmt16:de-en is hf-wmt--wmt16-de-en


def _dirs(runs_dir) -> list[Path]:
    return [Path(runs_dir)] if isinstance(runs_dir, (str, Path)) else [Path(d) for d in runs_dir]


def command_line(runs_dir, out_dir, preset: str | None) -> str:
    runs = " ".join(f"--runs {d}" for d in _dirs(runs_dir))
    return f"aiayn report {runs} --out {out_dir}" + (f" --preset {preset}" if preset else "")


def write_reports(runs_dir, out_dir: str | Path, preset: str | None = None) -> list[Path]:
    """Write Table 3 (md, csv, tex, html) and its plots for each (preset, corpus) found; return the paths written.
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
    command = command_line(dirs, out_dir, preset)
    written = []
    for p, data in keys:
        runs = [r for r in found.runs if (r.preset, r.data) == (p, data)]
        # runs that recorded no corpus beside runs of the preset's own: two groups, two names (one overwrote the other)
        apart = not data and any(q == p and d for q, d in keys)
        written += write_report(runs, found, p, data, Path(out_dir), command, apart=apart)
    return written


def report(runs_dir, out_dir, preset: str | None = None, *, wandb: bool = False) -> list[Path]:
    """`aiayn report` (and a sweep's --report): write the reports of `runs_dir` into `out_dir`; with `wandb`, log
    each to W&B as well (its table and its files). The files written."""
    paths = write_reports(runs_dir, out_dir, preset=preset)
    if wandb:
        from aiayn.reports.wandb_export import log_reports

        log_reports(paths, command_line(runs_dir, out_dir, preset))
    return paths


def write_report(runs: list[Run], found: Scan, preset: str, data: str, out_dir: Path, command: str,
                 apart: bool = False) -> list[Path]:  # fmt: skip
    name = report_name(preset, data, apart=apart)
    runs = _dedupe(runs)
    known = PRESETS.get(preset)
    capped = _capped(runs)
    # the pre-registered verdicts are about the preset's own regime, its corpus and budget: runs cut short by
    # --max-steps are a look, reported and never scored
    scored_preset = preset if known is not None and data == known.corpus and not capped else None
    convergence = known.convergence if known is not None else "endpoints"
    reading = known.stability if known is not None else "nearest"
    t3 = build_table(runs, scored_preset, convergence, reading)
    table, per_run = t3.rows, t3.runs
    family, baselines = _family(t3, found, known) if scored_preset else ({}, {})
    judged = {row: v for (cell, row), v in family.items() if cell == preset}
    set_verdicts(table, judged)
    title = f"Table 3 at preset {preset} ({data or 'unknown corpus'})"
    plot_dir = out_dir / f"{name}-plots"
    written = [
        plots.bleu_vs_params(table, plot_dir / "bleu_vs_params.png", title),
        plots.delta_vs_paper(table, plot_dir / "delta_vs_paper.png", title),
        plots.forest(table, plot_dir / "forest.png", title),
        plots.curves(_curves(runs), plot_dir / "curves.png", title, capped=capped,
                     points=verdicts.STABILITY[:-1] if scored_preset else ()),
    ]
    plot_links = [(f"{plot_dir.name}/{file}", alt) for file, alt in PLOTS.items()]
    skipped = [(path, why) for path, why in found.skipped if _belongs(path, preset)]
    notes = _notes(table, runs, preset, data, skipped, family, baselines, scored_preset, convergence, t3.slopes,
                   reading, t3.mismatched)  # fmt: skip
    log.info("%s: %s", name, headline(table, family, baselines) + (f"; capped: {len(capped)} run(s)" if capped else ""))
    notice = f"Generated by `{command}`; do not edit."
    first = _capped_lead(capped, runs) or lead(family, baselines)
    # CSVs as tools read them: the header on the first line, provenance in the .json beside them
    texts = {
        ".md": markdown(table, notes, title, notice, plot_links, first),
        ".csv": rounded(table).to_csv(index=False, na_rep="", lineterminator="\n"),
        "-runs.csv": rounded(per_run).to_csv(index=False, na_rep="", lineterminator="\n"),
        "-slopes.csv": rounded(t3.slopes).to_csv(index=False, na_rep="", lineterminator="\n"),
        "-curves.csv": curves_csv(runs),
        ".tex": latex(table, notes, title, notice, first),
        ".html": html_page(table, notes, title, notice, [(_data_uri(plot_dir / file), alt) for file, alt in
                                                           PLOTS.items()], first),  # fmt: skip
        ".json": _provenance(command, notice, preset, data, runs, family, baselines, scored_preset, convergence,
                             reading),  # fmt: skip
    }
    # masked again: a metrics.json written by an older aiayn (or by hand) may hold a secret in its error
    files = [atomic_write_text(out_dir / f"{name}{suffix}", redact(text)) for suffix, text in texts.items()]
    return files + written


def _data_uri(png: Path) -> str:
    """A plot inlined into the HTML report (a data URI), so that the page alone, mailed or uploaded, shows it."""
    import base64

    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def _capped_lead(capped: list[str], runs: list[Run]) -> str:
    """The first lines of a report of capped runs: what they are, and that no verdict is given."""
    if not capped:
        return ""
    done = [r for r in runs if r.completed]
    steps = sorted({int(r.metrics.steps) for r in done if r.metrics.steps is not None})
    budgets = sorted({int(r.budget) for r in done if r.budget is not None})
    return (f"**A look, not the table: {len(capped)} of {len(done)} completed run(s) stopped short of their budget "
            f"(`--max-steps`: {'/'.join(map(str, steps))} of {'/'.join(map(str, budgets))} steps).** Its numbers are "
            "not the preset's and no pre-registered verdict is given; `aiayn table3` without --max-steps (into the "
            "same --out) extends these runs to their budget.")  # fmt: skip


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


def _sources(runs: list[Run]) -> dict:
    """What the runs recorded of their code and their pre-registration (aiayn.common.provenance)."""
    commits = sorted({r.metrics.commit for r in runs if r.metrics.commit})
    return {
        "commits": commits,
        "dirty_runs": sorted(f"{r.row} seed {r.seed}" for r in runs if r.metrics.dirty),
        "unrecorded_runs": sum(r.metrics.commit is None for r in runs),
        "predictions_sha256": sorted({r.metrics.predictions_sha256 for r in runs if r.metrics.predictions_sha256}),
    }


def _provenance(command, notice, preset, data, runs, family, baselines, scored_preset, convergence, reading) -> str:
    import json

    from aiayn import __version__

    summary = verdicts.score(family, baselines) if family else None
    doc = {
        "generated_by": command, "notice": notice, "aiayn": __version__, "preset": preset, "corpus": data,
        "predictions": f"ablations/{PREDICTIONS_FILE.name}" if scored_preset else None,
        "predictions_sha256": registration_sha256(scored_preset) if scored_preset else None,
        "cells": list(PRESETS[preset].cells) if scored_preset else [],
        "runs_recorded": _sources(runs),
        "last_quarter_fall": verdicts.rule_text(convergence), "stability_rule": verdicts.stability_text(reading),
        "alpha": stats.ALPHA, "score": summary,
        "files": {"table": "one line per row (the .csv)", "runs": "one line per run (the -runs.csv)",
                  "slopes": "one line per series of Table 3 (the -slopes.csv)",
                  "curves": "one line per validation of every completed run (the -curves.csv)"},
    }  # fmt: skip
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
        df = pd.concat(frames, axis=1).reset_index() if any(len(f) for f in frames) else pd.DataFrame()
        if not df.empty:
            out[(run.row, run.seed)] = df
    return out


# ---------------------------------------------------------------- notes


def _hours(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _rule(runs: list[Run], preset: str) -> str:
    """The preset's scaling rule as the runs recorded it in config.json (else as ablations/ says it now)."""
    for run in runs:
        if run.config is not None:
            return run.config.spec.preset.rule()
    known = PRESETS.get(preset)
    return known.rule() if known else "unknown preset (not in ablations/presets.py)"


def _notes(
    table, runs, preset, data, skipped, family, baselines, scored_preset, convergence, slopes, reading="nearest",
    mismatched=None,
) -> list[tuple[str, list[str]]]:
    """(text, sub-items) pairs; `code` spans are the only markup."""
    done = [r for r in runs if r.completed]
    notes = [(f"Preset `{preset}`, corpus `{data}`; scaling rule: {_rule(runs, preset)}.", [])]
    notes.append(_code_note(runs, scored_preset))
    signatures = sorted({str(r.metrics.dev_bleu_signature) for r in done if r.metrics.dev_bleu_signature})
    sentences = sorted({int(r.metrics.dev_sentences) for r in done if r.metrics.dev_sentences})
    sig_text = ", ".join(f"`{s}`" for s in signatures) or "(none recorded)"
    mixed = " (mixed signatures: the rows are not comparable)" if len(signatures) > 1 else ""
    on = f" on {'/'.join(map(str, sentences))} dev sentences" if sentences else ""
    notes.append(
        (
            f"BLEU: sacreBLEU of the final model's beam search on detokenized output{on}, signature {sig_text}{mixed}; "
            "PPL: dev perplexity per target token, teacher-forced. Ours: mean ± sample std (n − 1) over the n "
            "completed seeds (std blank for n = 1); steps: optimizer steps trained (the plan where no run completed). "
            "Δ: the row against base, ours (means over seeds) and the paper's; Δ PPL in percent of base's.",
            [],
        )
    )
    if mismatched:
        notes.append(("Not comparable with base: trained to another share of their budget than base's runs (a look "
                      "that mixes --max-steps); their Δ is left blank and they are not tested:",
                      [f"{row}: {why}" for row, why in mismatched.items()]))  # fmt: skip
    notes += _verdict_notes(family, baselines, scored_preset, preset, data, reading)
    notes.append(_convergence_note(table, convergence))
    if slopes is not None and len(slopes):
        notes.append(_slopes_note(slopes))
    tested = table[table["bootstrap_p"].notna()]
    seeds = sorted(set(tested["bootstrap_seed"].astype(int)))
    notes.append(
        (
            f"`{significance.MARK}` (secondary): p < {significance.ALPHA:g} in sacreBLEU's paired bootstrap resampling "
            f"({significance.N_SAMPLES} resamples, seed {significance.bootstrap_seed()}) of the row's dev "
            "hypotheses against base's of the same seed (seed 0, else the first common seed), on the same "
            f"references; tested {len(tested)} row(s)"
            + (f" with seed(s) {', '.join(map(str, seeds))}" if seeds else "")
            + ". It covers the sampling of dev sentences only, not the seed-to-seed spread of training, which is "
            "several times larger: the verdicts rest on seeds, not on it. p-values are in the CSV.",
            [],
        )
    )
    deviations = list(GLOBAL_DEVIATIONS)
    if preset != "paper":
        deviations.append(f"scaled down by the preset's rule, corpus `{data}` (paper: WMT14 En-De, newstest2013)")
    per_dev: dict[str, list[str]] = {}
    for run in runs:
        for d in run.metrics.deviations:
            rows = per_dev.setdefault(str(d), [])
            if run.row not in rows:
                rows.append(run.row)
    deviations += [f"{d} (rows: {', '.join(rows)})" for d, rows in per_dev.items()]
    notes.append(("Deviations from the paper:", deviations))
    total = sum(float(r.metrics.train_time_s or 0) for r in runs)
    notes.append(
        (f"Compute: {_hours(total)} of training ({total:.0f} s summed over {len(done)} completed run(s)).", [])
    )
    changed = _changed_rows(done)
    if changed:
        notes.append(("Rows that resolve otherwise now than when they ran (edited in ablations/, or the preset's rule "
                      "changed): their numbers here are the old rows'; delete their run directories and sweep again "
                      "to train them anew:", changed))  # fmt: skip
    failed = sorted((r for r in runs if not r.completed), key=lambda r: (r.row, r.seed))
    notes.append(
        (
            f"Runs that did not complete ({len(failed)}):" if failed else "Runs that did not complete: none.",
            [f"{r.row} seed {r.seed}: {r.metrics.status}: {_one_line(r.metrics.error)}" for r in failed],
        )
    )
    notes.append(
        (
            f"Skipped files, unreadable metrics.json ({len(skipped)}):" if skipped else "Skipped files: none.",
            [f"`{p.as_posix()}`: {why}" for p, why in skipped],
        )
    )
    return notes


def _changed_rows(runs: list[Run]) -> list[str]:
    """'ROW (seeds S, ...): d_model 128 -> 256' for every row whose completed runs' recorded spec differs from what
    its row resolves to now (spec.changed_since)."""
    from aiayn.lightning_modules.run.spec import changed_since

    by_row: dict[str, tuple[list[int], tuple]] = {}
    for run in runs:
        if run.config is None:
            continue
        change = tuple(changed_since(run.config.spec, run.config.tables))
        if change:
            seeds, _ = by_row.setdefault(run.row, ([], change))
            seeds.append(run.seed)
    return [f"{row} (seed {', '.join(map(str, sorted(seeds)))}): {', '.join(change)}"
            for row, (seeds, change) in by_row.items()]


def _code_note(runs: list[Run], scored_preset: str | None) -> tuple[str, list[str]]:
    """Which commit the runs ran from, and which pre-registration they recorded against the one scored here."""
    src = _sources(runs)
    commits = ", ".join(f"`{c[:12]}`" for c in src["commits"]) or "not recorded"
    text = f"Code: the runs ran from commit(s) {commits}"
    if src["dirty_runs"]:
        text += f", with uncommitted changes in {len(src['dirty_runs'])} run(s) ({', '.join(src['dirty_runs'][:6])})"
    if src["unrecorded_runs"]:
        text += f"; {src['unrecorded_runs']} run(s) recorded no commit (an older aiayn, or not a git checkout)"
    text += "."
    if scored_preset:
        now = registration_sha256(scored_preset)
        recorded = src["predictions_sha256"]
        if not recorded:
            text += f" Pre-registration scored here: sha256 `{(now or 'none')[:16]}`; the runs recorded none."
        elif recorded == [now]:
            text += f" Pre-registration: the runs recorded sha256 `{now[:16]}`, the one scored here."
        else:
            held = ", ".join(f"`{x[:16]}`" for x in recorded)
            text += (f" Pre-registration: the runs recorded sha256 {held}, but this report scores with "
                     f"`{(now or 'none')[:16]}`: the predictions changed after the runs.")  # fmt: skip
    return text, []


def _slopes_note(slopes: pd.DataFrame) -> tuple[str, list[str]]:
    items = [
        f"{r.series} ({r.knob} {r.values}; rows {r.rows}; {r.n} runs): {r.slope_pct:+.2f}% per doubling"
        + ("" if pd.isna(r.ci_low_pct) else f" (95% interval {r.ci_low_pct:+.2f} to {r.ci_high_pct:+.2f})")
        for r in slopes.itertuples()
    ]
    return (
        "Series: each of Table 3's series as a trend, the least-squares slope of dev log-PPL against log2 of the knob "
        "through every completed run of base and the series' rows, as percent of dev PPL per doubling of the knob "
        "(negative: more is better), with its 95% interval (the seeds' spread is the residual's). Descriptive: the "
        "pre-registered tests are the pairwise ones. In the -slopes.csv.",
        items,
    )


def _verdict_notes(family: dict, baselines: dict, scored_preset: str | None, preset: str, data: str,
                   reading: str = "nearest") -> list[tuple[str, list[str]]]:  # fmt: skip
    if not scored_preset:
        why = (f"corpus `{data}` is not the preset's own" if preset in PRESETS and data != PRESETS[preset].corpus
               else "runs stopped short of their budget (`--max-steps`)" if preset in PRESETS
               else "the preset is not aiayn's")  # fmt: skip
        return [(f"No pre-registered verdicts: {why}, and `ablations/{PREDICTIONS_FILE.name}` is about the "
                 "presets' own regimes.", [])]  # fmt: skip
    s = verdicts.score(family, baselines)
    scored = [v for v in family.values() if v.predicted in SCORED]
    if not scored:
        return [(f"Preset `{preset}` has no pre-registered scored rows (`ablations/{PREDICTIONS_FILE.name}`).", [])]
    c = s["counts"]
    cells = list(dict.fromkeys(v.cell for v in family.values()))
    where = lambda v: f" [{v.cell}]" if len(cells) > 1 else ""  # noqa: E731
    single = [v.row for v in scored if min(v.n_row, v.n_base) == 1]
    suite = (f" The tests of cell(s) {', '.join(f'`{x}`' for x in cells[1:])} (run by the same command, each against "
             "its own base) are in the same family and the same score." if len(cells) > 1 else "")  # fmt: skip
    equiv = [v for v in scored if v.predicted == "equivalent"]
    out = [
        (
            f"Pre-registered (`ablations/{PREDICTIONS_FILE.name}`, committed before these runs): which rows are "
            f"scored, on which metric, and the prediction, each with its reason; a row may be predicted worse or "
            f"better only where the paper's Δ is beyond its own noise (|Δ BLEU| ≥ {MIN_PAPER_DELTA_BLEU:g} or |Δ PPL| "
            f"≥ {MIN_PAPER_DELTA_PPL:.1%}), and equivalent only where it is under both. Each scored row is tested "
            f"against base over seeds on per-seed dev log-perplexity (PPL rows) or dev BLEU (BLEU rows): a "
            f"predicted difference by Welch's t-test, two-sided; a predicted equivalence by two one-sided Welch tests "
            f"(TOST) against its registered margin. The p-values are Holm-adjusted together; significant at α = "
            f"{stats.ALPHA:g}.{suite} Every row trains the same budget and is compared at the end, as in the paper; "
            f"{verdicts.stability_text(reading)}.",
            [],
        ),
        (
            f"Score: {s['passed']} of {s['scored']} pre-registered tests pass ({c[stats.SIGNIFICANT_AGREE]} "
            f"significant in the predicted direction, {c[stats.EQUIVALENT]} equivalent); {c[stats.AGREE]} more agree "
            f"in sign without significance, {c[stats.DISAGREE] + c[stats.SIGNIFICANT_DISAGREE]} disagree "
            f"({c[stats.SIGNIFICANT_DISAGREE]} significantly), {c[stats.INCONCLUSIVE]} inconclusive, "
            f"{c[stats.EQUIVALENT_UNASSAYED]} equivalent without assay sensitivity (not counted), "
            f"{c[stats.NOT_STABLE]} not stable. {_baselines_text(s)}" + _not_run_text(s),
            [f"{v.row}{where(v)} ({v.metric}, predicted {v.predicted}): {v.verdict}" + _p_text(v) for v in scored],
        ),
        _baselines_note(scored, s, where),
        (
            "Why each test passed or failed, point by point (the stability rule):",
            [f"{v.row}{where(v)}: {v.why}" for v in scored],
        ),
    ]
    if equiv:
        out.append(
            (
                'Equivalence: TOST\'s p is the larger of the two one-sided p-values of "worse by the margin or more" '
                'and "better by the margin or more" (equivalently, the 90% interval of the difference lies inside '
                "± the margin, around the registered center where one is registered, else around 0). An equivalence "
                "counts only where the same cell also shows a row predicted worse "
                "significantly worse (assay sensitivity: the seeds can see a difference), and is refuted where Welch's "
                "two-sided test, Bonferroni-adjusted over the family, finds a difference.",
                [
                    f"{v.row}{where(v)}: margin ±{100 * math.expm1(v.margin):.2f}% of dev PPL"
                    + (f" around {_pct(v.center)} (its registered center: the difference the regime predicts)"
                       if v.center else "")
                    + f"; Δ {_pct(v.delta_worse)} "
                    + (f"(90% interval {_pct(v.tost_low)} to {_pct(v.tost_high)}, TOST's; 95% {_pct(v.ci_low)} to "
                       f"{_pct(v.ci_high)})" if not pd.isna(v.tost_low) else "(no interval: fewer than two seeds "
                       "on a side)")
                    for v in equiv
                    if v.margin
                ],  # fmt: skip
            )
        )
    checks = [v for v in family.values() if v.predicted == "check"]
    if checks:
        out.append(
            (
                "Checks, not findings: label smoothing ε over V classes leaves a model that learns its smoothed "
                "target exactly a dev perplexity of 1/(1 − ε + ε/V) against one-hot references, so where a model is "
                "near that floor, no smoothing must read better and more smoothing worse by arithmetic. These rows "
                "are reported against their floors (a smoothed model cannot go below its own) and never scored.",
                [
                    f"{v.row}{where(v)}: dev PPL {_fmt(v.ppl, '.3f') or 'none'} against its floor "
                    f"{_fmt(v.floor, '.3f') or 'unknown'}: {v.verdict}"
                    for v in checks
                ],  # fmt: skip
            )
        )
    for cell in cells:
        unscored = [p for p in predictions(cell).values() if p.predicted in ("not scored", "not testable")]
        if unscored:
            out.append(
                (
                    f"Not scored in `{cell}`, as pre-registered (the rows a reader might expect, and why not):",
                    [f"{p.row} ({p.predicted}): {p.reason}" for p in unscored],
                )
            )
    if single:
        out.append(
            (
                f"One seed on a side ({', '.join(single)}): no seed-level test, so the verdict is the sign of one run "
                "against another, an anecdote. Single runs can show an effect that is large against the spread "
                "between seeds (the same command with `--first-seed 1`, `2` then gives the same signs), not a "
                "smaller one: that takes seeds (`--seeds`, `--base-seeds`, the `evidence` preset, or seed sets run "
                "apart and pooled: `aiayn report --runs A --runs B ...`).",
                [],
            )
        )
    return out


def _pct(log_diff: float) -> str:
    return "" if pd.isna(log_diff) else f"{100 * math.expm1(log_diff):+.2f}%"


def _p_text(v) -> str:
    if v.verdict == stats.NOT_RUN:
        return f" (no run of {v.row} among these runs)"
    if min(v.n_row, v.n_base) == 0:
        return f" (no completed run of {'base' if v.n_base == 0 else v.row})"
    seeds = f"{v.n_row} vs {v.n_base} seeds"
    if pd.isna(v.p):
        return f" ({seeds}: no test)"
    test = "TOST p" if v.predicted == "equivalent" else "p"
    return f" ({seeds}: {test} = {_p(v.p)}, Holm-adjusted {_p(v.p_holm)})"


def _baselines_text(s: dict) -> str:
    """What each naive baseline and random signs score on the same tests."""
    parts = [f'"{b["label"]}" passes {b["passed"]} of {s["scored"]} and agrees in sign on {b["agree"]}'
             for b in s["baselines"].values()]  # fmt: skip
    r = s["random_signs"]
    text = f"Judged on the same numbers by the same rules, {' and '.join(parts)}; " if parts else ""
    return (f"{text}on the {r['directional_tests']} directional tests random signs agree on {r['expected_agree']:g} on "
            f"average, and on {s['agree']} or more with probability {r['p_at_least_as_many']:.3f}.")  # fmt: skip


def _baselines_note(scored: list, s: dict, where) -> tuple[str, list[str]]:
    """Test by test, wherever a naive baseline predicts otherwise than the registration: each one's prediction and
    its verdict on the same numbers."""
    items = []
    for v in scored:
        name = f"{v.row}{where(v)}"
        others = [(b["label"], b["predictions"].get(name), b["verdicts"].get(name)) for b in s["baselines"].values()]
        if any(p is not None and p != v.predicted for _, p, _ in others):
            items.append(f"{name}: registered {v.predicted}: {v.verdict}; "
                         + "; ".join(f'"{label}" {p}: {verdict}' for label, p, verdict in others if p is not None))
    where_text = "every registered prediction" if not items else "the tests where they predict otherwise"
    return (f"The naive baselines on {where_text} (each judged like the registration: every point of the stability "
            "rule, one Holm family; \"more parameters help\" by each row's parameter count at this preset against "
            "base's, as many or fewer predicted worse):", items)  # fmt: skip


def _not_run_text(s: dict) -> str:
    """The scored rows the runs reported hold no run of (a `--rows` selection): outside the score, named."""
    if not s.get("not_run"):
        return ""
    return (f" Not run here, so not in the score: {', '.join(s['not_run'])} (scored by the registration; no run of "
            "theirs among these runs: `aiayn table3` without --rows runs them).")  # fmt: skip


def _versus(s: dict, b: dict) -> str:
    """One baseline against the registration: its passes, the difference, and who passed where they differ."""
    gap = s["passed"] - b["passed"]
    standing = (f"the registration {gap} ahead" if gap > 0 else f"the registration {-gap} behind" if gap < 0
                else "level with the registration")  # fmt: skip
    text = f'"{b["label"]}" passes {b["passed"]} ({standing}'
    if b["differs_on"]:
        mine, theirs = b["registered_passed_where_it_did_not"], b["passed_where_registered_did_not"]
        text += (f"; of the tests where they predict otherwise, {', '.join(b['differs_on'])}, the registration alone "
                 f"passed {', '.join(mine) or 'none'}, the baseline alone {', '.join(theirs) or 'none'}")  # fmt: skip
    return text + ")"


def lead(family: dict, baselines: dict) -> str:
    """The report's first lines: the score, each baseline beside it and where they differ, and, where a baseline
    scores higher, that it does (a reader at a glance learns what the table shows before its rows)."""
    if not family:
        return ""
    s = verdicts.score(family, baselines)
    if not s["scored"]:
        return ""
    single = all(min(v.n_row, v.n_base) <= 1 for v in family.values() if v.predicted in SCORED)
    if single:
        text = (f"**{s['agree']} of {s['scored']} pre-registered rows agree in sign at every point** (one seed a side: "
                "signs, not tests).")  # fmt: skip
        for b in s["baselines"].values():
            text += f' "{b["label"]}" agrees on {b["agree"]}.'
        return text
    text = f"**Score: {s['passed']} of {s['scored']} pre-registered tests pass.**"
    if s["baselines"]:
        text += " Judged on the same numbers by the same rules, " + "; ".join(
            _versus(s, b) for b in s["baselines"].values()) + "."  # fmt: skip
    higher = [b["label"] for b in s["baselines"].values() if b["passed"] > s["passed"]]
    if higher:
        text += (" A naive baseline scores higher than the paper's predictions here ("
                 + ", ".join(f'"{x}"' for x in higher)
                 + "): at this scale, that guess explains this table better than the paper's claims do.")
    return text


def headline(table: pd.DataFrame, family: dict, baselines: dict | None = None) -> str:
    """The report's verdict in one line, for the terminal: base, the pre-registered score, the naive baselines."""
    parts = []
    base = table[table["row"] == "base"]
    if len(base) and pd.notna(base["ppl"].iloc[0]):
        parts.append(f"base dev PPL {base['ppl'].iloc[0]:.3f}, BLEU {base['bleu'].iloc[0]:.2f}")
    s = verdicts.score(family, baselines) if family else None
    if s and s["scored"]:
        c = s["counts"]
        single = all(min(v.n_row, v.n_base) <= 1 for v in family.values() if v.predicted in SCORED)
        if single:  # one seed a side: signs, not tests
            parts.append(
                f"{s['agree']} of {s['scored']} pre-registered rows agree in sign at every point (one seed a side: "
                "signs, no tests)"
                + "".join(f"; {b['label']}: {b['agree']} of {s['scored']}" for b in s["baselines"].values())
            )
        else:
            parts.append(
                f"{s['passed']} of {s['scored']} pre-registered tests pass ({c[stats.SIGNIFICANT_AGREE]} significant, "
                f"{c[stats.EQUIVALENT]} equivalent; {c[stats.DISAGREE] + c[stats.SIGNIFICANT_DISAGREE]} disagree, "
                f"{c[stats.NOT_STABLE]} not stable, {c[stats.INCONCLUSIVE]} inconclusive)"
                + "".join(f"; {b['label']}: {b['passed']} of {s['scored']}" for b in s["baselines"].values())
            )
    else:
        parts.append("no pre-registered verdict")
    return "; ".join(parts)


def _convergence_note(table: pd.DataFrame, convergence: str) -> tuple[str, list[str]]:
    rule = verdicts.rule_text(convergence)
    falls = [f"{r} {100 * d:.1f}%" for r, d in zip(table["row"], table["last_drop"]) if pd.notna(d)]
    text = (f"{rule[0].upper()}{rule[1:]} (`last_drop` in the CSVs; each run's in the -runs.csv, its curve in the "
            "-curves.csv).")  # fmt: skip
    return text, ([", ".join(falls)] if falls else [])


def _one_line(text) -> str:
    if not text:
        return "(no error recorded)"
    line = str(text).strip().splitlines()[0]
    return line if len(line) <= 200 else line[:197] + "..."


# ---------------------------------------------------------------- the table for people


def _pm(mean, std, fmt: str) -> str:
    if pd.isna(mean):
        return ""
    return f"{mean:{fmt}}" if pd.isna(std) else f"{mean:{fmt}} ± {std:{fmt}}"


def _text(x) -> str:
    return "" if x is None or (not isinstance(x, str) and pd.isna(x)) else str(x)


def _fmt(x, fmt: str) -> str:
    if x is None or pd.isna(x):
        return ""
    return f"{int(x) if fmt == 'd' else x:{fmt}}"  # an Int64 column with a blank maps its integers as floats


def _p(x) -> str:
    return "" if pd.isna(x) else (f"{x:.2g}" if x >= 0.001 else f"{x:.1e}")


def display_wide(table: pd.DataFrame) -> pd.DataFrame:
    """Every column: the group named on its first line, settings, ours, the paper's, Δs, the tests, the verdict."""
    first = table["group"].ne(table["group"].shift())
    return pd.DataFrame(
        {
            "group": table["group"].where(first, ""),
            "row": table["row"],
            **{KNOBS[k].header(): table[k].map(KNOBS[k].cell) for k in MODEL_KEYS},  # each knob as it says
            "steps": table["steps"].map(_text),
            "n": table["n"].astype(str),
            "PPL (dev)": [_pm(m, s, ".3f") for m, s in zip(table["ppl"], table["ppl_std"])],
            "BLEU (dev)": [_pm(m, s, ".2f") for m, s in zip(table["bleu"], table["bleu_std"])],
            "params ×10⁶": table["params_m"].map(lambda x: _fmt(x, ".2f")),
            "paper PPL": table["paper_ppl"].map(lambda x: _fmt(x, ".2f")),
            "paper BLEU": table["paper_bleu"].map(lambda x: _fmt(x, ".1f")),
            "paper params ×10⁶": table["paper_params_m"].map(lambda x: _fmt(x, "g")),
            _delta_header(table): _delta_ci(table),
            "paper Δ PPL %": table["paper_delta_ppl_pct"].map(lambda x: _fmt(x, "+.1f")),
            "Δ BLEU": table["delta_bleu"].map(lambda x: _fmt(x, "+.2f")),
            "paper Δ BLEU": table["paper_delta_bleu"].map(lambda x: _fmt(x, "+.1f")),
            "scored on": table["metric"].map(lambda m: {"ppl": "PPL", "bleu": "BLEU"}.get(m, "")),
            "predicted": table["predicted"],
            "margin %": table["margin_pct"].map(lambda x: _fmt(x, ".2f")),
            "p (Holm)": table["p_holm"].map(_p),
            "verdict": table["verdict"],
            "last-quarter fall %": table["last_drop"].map(lambda x: _fmt(100 * x if pd.notna(x) else x, ".1f")),
            "boot.": table["sig"],
        }
    )


def _differs(row: pd.Series, base: pd.Series | None) -> str:
    """The knobs in which a row differs from base, as the paper's symbols ("h 1, d_k 64, d_v 64")."""
    if base is None or row["row"] == "base":
        return ""
    out = []
    for k in MODEL_KEYS:
        mine, theirs = row[k], base[k]
        if pd.isna(mine) or (not pd.isna(theirs) and mine == theirs):
            continue
        value = ("pre-LN" if mine else "post-LN") if k == "norm_first" else f"{mine:g}" if isinstance(
            mine, float) else str(mine)  # fmt: skip
        out.append(value if k == "norm_first" else f"{k} {value}")
    return ", ".join(out)


def _delta_ci(table: pd.DataFrame) -> list[str]:
    return [
        "" if pd.isna(d) else (f"{d:+.1f}" if pd.isna(lo) else f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]")
        for d, lo, hi in zip(table["delta_ppl_pct"], table["delta_ppl_ci_low"], table["delta_ppl_ci_high"])
    ]


def _delta_header(table: pd.DataFrame) -> str:
    """The Δ PPL column's header: with "[95%]" only where some row has an interval (two seeds a side or more)."""
    return "Δ PPL % [95%]" if table["delta_ppl_ci_low"].notna().any() else "Δ PPL %"


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table a person reads first, in the paper's layout: the row, what it changes, ours, our Δ beside the paper's
    Δ (the only numbers that compare: our corpus and scale are not the paper's), the prediction and the verdict
    (every setting, absolute paper number, p-value and test is in the wide table: the CSV and the HTML)."""
    base = table[table["row"] == "base"]
    base = base.iloc[0] if len(base) else None
    first = table["group"].ne(table["group"].shift())
    return pd.DataFrame(
        {
            "group": table["group"].where(first, ""),
            "row": table["row"],
            "differs from base": [_differs(r, base) for _, r in table.iterrows()],
            "n": table["n"].astype(str),
            "PPL (dev)": [_pm(m, s, ".3f") for m, s in zip(table["ppl"], table["ppl_std"])],
            "BLEU (dev)": [_pm(m, s, ".2f") for m, s in zip(table["bleu"], table["bleu_std"])],
            "params ×10⁶": table["params_m"].map(lambda x: _fmt(x, ".2f")),
            _delta_header(table): _delta_ci(table),
            "paper Δ PPL %": table["paper_delta_ppl_pct"].map(lambda x: _fmt(x, "+.1f")),
            "Δ BLEU": table["delta_bleu"].map(lambda x: _fmt(x, "+.2f")),
            "paper Δ BLEU": table["paper_delta_bleu"].map(lambda x: _fmt(x, "+.1f")),
            "predicted": table["predicted"],
            "verdict": table["verdict"],
        }
    )


def key(table: pd.DataFrame) -> str:
    """What the table's verdicts and columns mean, printed under every table."""
    single = table["n"].fillna(0).astype(int).le(1) & table["predicted"].isin(SCORED)
    return (
        f"**Key.** Only the Δ columns compare with the paper's: our corpus and scale are not WMT14's, so absolute PPL "
        f"and BLEU do not (the paper's are in the CSV and the HTML's wide table). A test **passes** when it is "
        f"`{stats.SIGNIFICANT_AGREE}` (Holm-adjusted Welch p < {stats.ALPHA:g} over seeds, in the predicted direction) "
        f"or `{stats.EQUIVALENT}` (TOST within the registered margin, with a row in the same table significantly "
        f"worse), at each of the validations nearest 75% and 87.5% of the budget and at its end. "
        f"`{stats.AGREE}`: the predicted sign at every point, without significance"
        + (" (one seed a side: a sign, not a test)" if single.any() else "")
        + f". `{stats.NOT_STABLE}`: passed at the end but not at an earlier point, a miss. `{stats.DISAGREE}` / "
        f"`{stats.SIGNIFICANT_DISAGREE}`: the opposite sign. `{stats.INCONCLUSIVE}`: neither shown. "
        f"`{stats.CHECK_PASSED}`: label smoothing's arithmetic floor, an implementation check, not a finding. "
        f"`{stats.NOT_SCORED}` / `{stats.NOT_TESTABLE}`: as registered, each with its reason in the notes."
        + (f" `{stats.NOT_RUN}`: scored by the registration, but no run of it is among these runs (not in the score)."
           if (table["verdict"] == stats.NOT_RUN).any() else "")
    )


LEFT = {"group", "row", "differs from base", "PE", "LN", "scored on", "predicted", "verdict", "boot."}


def _md_table(table: pd.DataFrame) -> str:
    df = display(table)
    align = ["left" if c in LEFT else "right" for c in df.columns]
    return df.to_markdown(index=False, disable_numparse=True, colalign=align)


def markdown(table, notes, title, notice, plot_links, first: str = "") -> str:
    lines = [notice, "", f"# {title}", "", *([first, ""] if first else []), _md_table(table), "", key(table), "",
             "## Notes", ""]  # fmt: skip
    for text, items in notes:
        lines.append(f"- {text}")
        lines += [f"  - {item}" for item in items]
    lines += ["", "## Plots", ""]
    lines += [f"![{alt}]({path})" for path, alt in plot_links]
    return "\n".join(lines) + "\n"


def _html_text(text: str) -> str:
    text = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text, quote=False))
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


# the verdicts' colours in the HTML: passes green, a sign without a test pale green, misses red, the rest grey
VERDICT_COLOURS = {
    stats.SIGNIFICANT_AGREE: "#c8e6c9", stats.EQUIVALENT: "#c8e6c9", stats.AGREE: "#e8f5e9",
    stats.NOT_STABLE: "#ffe0b2", stats.DISAGREE: "#ffcdd2", stats.SIGNIFICANT_DISAGREE: "#ef9a9a",
    stats.INCONCLUSIVE: "#eeeeee", stats.EQUIVALENT_UNASSAYED: "#eeeeee", stats.NOT_RUN: "#eeeeee",
    stats.CHECK_PASSED: "#e3f2fd",
    stats.CHECK_FAILED: "#ef9a9a",
}  # fmt: skip


def _styled(df: pd.DataFrame) -> str:
    """A table as HTML through pandas' Styler: verdict cells coloured, numbers right-aligned, no index."""
    styler = df.style.hide(axis="index").set_table_attributes('class="table3"')
    if "verdict" in df:
        styler = styler.map(lambda v: f"background-color: {VERDICT_COLOURS[v]}" if v in VERDICT_COLOURS else "",
                            subset=["verdict"])  # fmt: skip
    left = [c for c in df.columns if c in LEFT]
    if left:
        styler = styler.set_properties(subset=left, **{"text-align": "left"})
    return styler.to_html(escape="html")


def html_page(table, notes, title, notice, plot_links, first: str = "") -> str:
    compact, wide = _styled(display(table)), _styled(display_wide(table))
    opening = f'<p class="lead">{_html_text(first)}</p>\n' if first else ""
    body = (f'{opening}{compact}\n<p class="key">{_html_text(key(table))}</p>\n<h2>Every column</h2>\n'
            f'<div class="wide">{wide}</div>')  # fmt: skip
    items = []
    for text, sub in notes:
        inner = "".join(f"<li>{_html_text(s)}</li>" for s in sub)
        items.append(f"<li>{_html_text(text)}" + (f"<ul>{inner}</ul>" if inner else "") + "</li>")
    images = "\n".join(
        f'<figure><img src="{html.escape(path)}" alt="{html.escape(alt)}"><figcaption>{html.escape(alt)}</figcaption>'
        "</figure>"
        for path, alt in plot_links
    )
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:1400px}table.table3{border-collapse:collapse;font-size:13px}"
        ".table3 td,.table3 th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}"
        "div.wide{overflow-x:auto;max-width:100%}p.key{font-size:13px;max-width:1100px}"
        "img{max-width:100%}figure{display:inline-block;margin:1em}"
    )
    return (
        f'<!-- {html.escape(notice)} -->\n<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{style}</style></head>\n<body>\n"
        f"<p><em>{_html_text(notice)}</em></p>\n<h1>{html.escape(title)}</h1>\n{body}\n"
        f"<h2>Notes</h2>\n<ul>\n" + "\n".join(items) + "\n</ul>\n"
        f"<h2>Plots</h2>\n{images}\n</body></html>\n"
    )


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
    "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "|": r"\textbar{}", "±": r"$\pm$", "Δ": r"$\Delta$",
    "≥": r"$\geq$", "ε": r"$\varepsilon$", "×": r"$\times$", "−": "--", "⁶": r"$^6$", "–": "--",
}  # fmt: skip


def tex_escape(text: str) -> str:
    return "".join(_TEX_SPECIAL.get(c, c) for c in str(text))


def _tex_text(text: str) -> str:
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)  # the key's bold lead: plain in LaTeX
    parts = re.split(r"`([^`]*)`", text)
    return "".join(tex_escape(p) if i % 2 == 0 else r"\texttt{" + tex_escape(p) + "}" for i, p in enumerate(parts))


# the knobs' own LaTeX headers (ablations/knobs.py), for the columns named by the knob
TEX_HEADERS = {k: KNOBS[k].tex for k in MODEL_KEYS if KNOBS[k].tex.startswith("$")}


def latex(table, notes, title, notice, first: str = "") -> str:
    """A `table` float (needs booktabs) with the notes under the tabular; \\midrule between groups."""
    df = display(table)
    groups = list(table["group"])
    df = df.map(tex_escape)
    df.columns = [TEX_HEADERS.get(c, tex_escape(c)) for c in df.columns]
    tabular = df.to_latex(index=False, escape=False, column_format="ll" + "r" * (df.shape[1] - 2))
    lines = tabular.splitlines()
    start = lines.index(r"\midrule") + 1
    out, i = lines[:start], 0
    for line in lines[start:]:
        if line.rstrip().endswith(r"\\") and i < len(groups):
            if i > 0 and groups[i] != groups[i - 1]:
                out.append(r"\midrule")
            i += 1
        out.append(line)
    notes_tex = ([r"\item " + _tex_text(first)] if first else []) + [r"\item " + _tex_text(key(table))]
    for text, sub in notes:
        notes_tex.append(r"\item " + _tex_text(text))
        if sub:
            notes_tex += [r"\begin{itemize}"] + [r"\item " + _tex_text(s) for s in sub] + [r"\end{itemize}"]
    return (
        "\n".join(
            [
                f"% {notice}",
                "% needs \\usepackage{booktabs}",
                r"\begin{table}[t]",
                r"\centering\scriptsize",
                r"\caption{" + tex_escape(title) + "}",
                r"\resizebox{\linewidth}{!}{%",
                *out,
                "}",
                r"\par\medskip\begin{minipage}{\linewidth}\footnotesize",
                r"\begin{itemize}",
                *notes_tex,
                r"\end{itemize}",
                r"\end{minipage}",
                r"\end{table}",
            ]
        )
        + "\n"
    )
