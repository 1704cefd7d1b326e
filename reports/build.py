"""`aiayn report`: Table 3 per preset (Markdown, CSV, LaTeX, HTML) and its plots, from every metrics.json of a runs dir.

Everything here is generated; each file's first line says by which command.
"""

from __future__ import annotations

import html
import logging
import re
from pathlib import Path

import pandas as pd

from aiayn.ablations.knobs import KNOBS, MODEL_KEYS
from aiayn.ablations.predictions import MIN_PAPER_DELTA_BLEU, MIN_PAPER_DELTA_PPL, PREDICTIONS_FILE, predictions
from aiayn.ablations.presets import PRESETS, get_preset
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_text
from aiayn.common.secrets import redact
from aiayn.lightning_modules.corpora import corpus_dirname
from aiayn.lightning_modules.spec import RunSpec
from aiayn.reports import plots, significance, stats, verdicts
from aiayn.reports.runs import Run, Scan, read_curve, scan
from aiayn.reports.table import build_table, rounded, row_order

log = logging.getLogger(__name__)

# Where every run leaves the paper, whatever its row (README "Faithful to the paper, and where not").
GLOBAL_DEVIATIONS = (
    "label smoothing spreads ε over all V classes (PyTorch), not the V − 1 others (tensor2tensor)",
    "initialization (not stated in the paper): Xavier-uniform projections, N(0, d_model^-0.5) embeddings",
    "the table's BLEU is sacreBLEU on detokenized output; the paper's tokenized BLEU (Moses tokenizer, compound "
    "splitting, multi-bleu) is each run's `dev_tok_bleu` in metrics.json (`aiayn score` scores any output so)",
)
PLOTS = {
    "bleu_vs_params.png": "dev BLEU vs parameters",
    "delta_vs_paper.png": "our Δ PPL and Δ BLEU vs the paper's",
    "curves.png": "training loss, learning rate, dev PPL and dev BLEU of every row and seed",
}
CURVES = ("train/loss", "lr", "val/ppl", "val/bleu")


def report_name(preset: str, data: str) -> str:
    """table3-PRESET, or table3-PRESET-CORPUS for runs of a preset on another corpus than its own."""
    known = PRESETS.get(preset)
    if not data or known is None or data == known.corpus:
        return f"table3-{preset}"
    return f"table3-{preset}-{corpus_dirname(data)}"  # a file name: hf:wmt/wmt16:de-en is hf-wmt--wmt16-de-en


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
        written += write_report(runs, found, p, data, Path(out_dir), command)
    return written


def write_report(runs: list[Run], found: Scan, preset: str, data: str, out_dir: Path, command: str) -> list[Path]:
    name = report_name(preset, data)
    runs = _dedupe(runs)
    known = PRESETS.get(preset)
    # the pre-registered verdicts are about the preset's own regime: its corpus
    scored_preset = preset if known is not None and data == known.corpus else None
    convergence = known.convergence if known is not None else "endpoints"
    t3 = build_table(runs, scored_preset, convergence)
    table, per_run, judged = t3.rows, t3.runs, t3.verdicts
    title = f"Table 3 at preset {preset} ({data or 'unknown corpus'})"
    plot_dir = out_dir / f"{name}-plots"
    written = [
        plots.bleu_vs_params(table, plot_dir / "bleu_vs_params.png", title),
        plots.delta_vs_paper(table, plot_dir / "delta_vs_paper.png", title),
        plots.curves(_curves(runs), plot_dir / "curves.png", title),
    ]
    plot_links = [(f"{plot_dir.name}/{file}", alt) for file, alt in PLOTS.items()]
    skipped = [(path, why) for path, why in found.skipped if _belongs(path, preset)]
    notes = _notes(table, runs, preset, data, skipped, judged, scored_preset, convergence)
    log.info("%s: %s", name, headline(table, judged))
    notice = f"Generated by `{command}`; do not edit."
    # CSVs as tools read them: the header on the first line, provenance in the .json beside them
    texts = {
        ".md": markdown(table, notes, title, notice, plot_links),
        ".csv": rounded(table).to_csv(index=False, na_rep="", lineterminator="\n"),
        "-runs.csv": rounded(per_run).to_csv(index=False, na_rep="", lineterminator="\n"),
        ".tex": latex(table, notes, title, notice),
        ".html": html_page(table, notes, title, notice, plot_links),
        ".json": _provenance(command, notice, preset, data, table, judged, scored_preset, convergence),
    }
    # masked again: a metrics.json written by an older aiayn (or by hand) may hold a secret in its error
    files = [atomic_write_text(out_dir / f"{name}{suffix}", redact(text)) for suffix, text in texts.items()]
    return files + written


def _provenance(command, notice, preset, data, table, judged, scored_preset, convergence) -> str:
    import json

    from aiayn import __version__

    summary = verdicts.score(judged) if judged else None
    doc = {
        "generated_by": command, "notice": notice, "aiayn": __version__, "preset": preset, "corpus": data,
        "predictions": f"ablations/{PREDICTIONS_FILE.name}" if scored_preset else None,
        "convergence_rule": verdicts.rule_text(convergence), "alpha": stats.ALPHA, "score": summary,
        "files": {"table": "one line per row (the .csv)", "runs": "one line per run (the -runs.csv)"},
    }  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"


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
            return RunSpec.from_dict(run.config.spec).preset.rule()
    known = PRESETS.get(preset)
    return known.rule() if known else "unknown preset (not in ablations/presets.py)"


def _notes(table, runs, preset, data, skipped, judged, scored_preset, convergence) -> list[tuple[str, list[str]]]:
    """(text, sub-items) pairs; `code` spans are the only markup."""
    done = [r for r in runs if r.completed]
    notes = [(f"Preset `{preset}`, corpus `{data}`; scaling rule: {_rule(runs, preset)}.", [])]
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
    notes += _verdict_notes(judged, scored_preset, preset, data)
    notes.append(_convergence_note(table, convergence))
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


def _verdict_notes(judged: dict, scored_preset: str | None, preset: str, data: str) -> list[tuple[str, list[str]]]:
    if not scored_preset:
        why = f"corpus `{data}` is not the preset's own" if preset in PRESETS else "the preset is not aiayn's"
        return [(f"No pre-registered verdicts: {why}, and `ablations/{PREDICTIONS_FILE.name}` is about the "
                 "presets' own regimes.", [])]  # fmt: skip
    s = verdicts.score(judged)
    scored = [v for v in judged.values() if v.predicted in ("worse", "better")]
    if not scored:
        return [(f"Preset `{preset}` has no pre-registered scored rows (`ablations/{PREDICTIONS_FILE.name}`).", [])]
    t, c = s["trivial"], s["counts"]
    single = [v.row for v in scored if min(v.n_row, v.n_base) == 1]
    out = [
        (
            f"Pre-registered (`ablations/{PREDICTIONS_FILE.name}`, committed before these runs): which rows are "
            f"scored, on which metric, and the predicted sign, each with its reason; candidates are the rows whose "
            f"paper Δ is beyond the paper's own noise (|Δ BLEU| ≥ {MIN_PAPER_DELTA_BLEU:g} or |Δ PPL| ≥ "
            f"{MIN_PAPER_DELTA_PPL:.0%}). Each scored row is tested against base over seeds: Welch's t-test, "
            f"two-sided, on per-seed dev log-perplexity (PPL rows) or dev BLEU (BLEU rows); p-values Holm-adjusted "
            f"over the scored set's tests; significant at α = {stats.ALPHA:g}.",
            [],
        ),
        (
            f"Verdict: {s['agree']} of {s['scored']} scored rows agree with the prediction "
            f"({c[stats.SIGNIFICANT_AGREE]} significantly); {c[stats.DISAGREE] + c[stats.SIGNIFICANT_DISAGREE]} "
            f"disagree ({c[stats.SIGNIFICANT_DISAGREE]} significantly), {c[stats.INCONCLUSIVE]} inconclusive, "
            f'{c[stats.NOT_CONVERGED]} not converged. On the same set, "every change hurts" would agree on '
            f"{t['every_change_hurts']} of {t['n']}; random signs on {t['random_expected']:g} on average, and on "
            f"{s['agree']} or more with probability {t['random_p']:.3f}.",
            [f"{v.row} ({v.metric}, predicted {v.predicted}): {v.verdict}" + _p_text(v) for v in scored],
        ),
    ]
    unscored = [p for p in predictions(scored_preset).values() if not p.scored]
    if unscored:
        out.append(
            (
                "Not scored here, as pre-registered (the rows a reader might expect, and why not):",
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


def _p_text(v) -> str:
    if min(v.n_row, v.n_base) == 0:
        return f" (no completed run of {'base' if v.n_base == 0 else v.row})"
    seeds = f"{v.n_row} vs {v.n_base} seeds"
    if v.verdict == stats.NOT_CONVERGED:
        return f" ({seeds})"
    if pd.isna(v.p):
        return f" ({seeds}: no test)"
    return f" ({seeds}: p = {_p(v.p)}, Holm-adjusted {_p(v.p_holm)})"


def headline(table: pd.DataFrame, judged: dict) -> str:
    """The report's verdict in one line, for the terminal: base, the pre-registered score, the trivial baselines."""
    parts = []
    base = table[table["row"] == "base"]
    if len(base) and pd.notna(base["ppl"].iloc[0]):
        conv = {"yes": "converged", "no": "NOT converged"}.get(base["converged"].iloc[0], "convergence unknown")
        parts.append(f"base dev PPL {base['ppl'].iloc[0]:.3f}, BLEU {base['bleu'].iloc[0]:.2f} ({conv})")
    s = verdicts.score(judged) if judged else None
    if s and s["scored"]:
        c, t = s["counts"], s["trivial"]
        parts.append(
            f"{s['agree']} of {s['scored']} pre-registered rows agree ({c[stats.SIGNIFICANT_AGREE]} significant, "
            f"{c[stats.DISAGREE] + c[stats.SIGNIFICANT_DISAGREE]} disagree, {c[stats.NOT_CONVERGED]} not converged, "
            f"{c[stats.INCONCLUSIVE]} inconclusive); every-change-hurts: {t['every_change_hurts']} of {t['n']}, "
            f"random signs: P(>= {s['agree']}) = {t['random_p']:.3f}"
        )
    else:
        parts.append("no pre-registered verdict")
    return "; ".join(parts)


def _convergence_note(table: pd.DataFrame, convergence: str) -> tuple[str, list[str]]:
    marked = table[table["converged"] != ""]
    climbing = list(marked.loc[marked["converged"] == "no", "row"])
    rule = verdicts.rule_text(convergence)
    text = (
        f"{rule[0].upper()}{rule[1:]} (`last_drop` in the CSVs: the largest over the row's seeds). "
        f"{len(marked) - len(climbing)} of {len(marked)} rows with curves converged"
        + (f" (still improving: {', '.join(climbing)})." if climbing else ".")
        + " A row that has not converged gets no sign verdict when base has; when base has not, no row does."
    )
    return text, []


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
    return "" if x is None or pd.isna(x) else f"{x:{fmt}}"


def _p(x) -> str:
    return "" if pd.isna(x) else (f"{x:.2g}" if x >= 0.001 else f"{x:.1e}")


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The paper's layout: the group named on its first line, settings, ours, the paper's, Δs, the verdict."""
    first = table["group"].ne(table["group"].shift())
    return pd.DataFrame(
        {
            "group": table["group"].where(first, ""),
            "row": table["row"],
            "N": table["N"].map(lambda x: _fmt(x, "d")),
            "d_model": table["d_model"].map(lambda x: _fmt(x, "d")),
            "d_ff": table["d_ff"].map(lambda x: _fmt(x, "d")),
            "h": table["h"].map(lambda x: _fmt(x, "d")),
            "d_k": table["d_k"].map(lambda x: _fmt(x, "d")),
            "d_v": table["d_v"].map(lambda x: _fmt(x, "d")),
            "P_drop": table["P_drop"].map(lambda x: _fmt(x, "g")),
            "eps_ls": table["eps_ls"].map(lambda x: _fmt(x, "g")),
            "PE": table["pe"].fillna("").astype(str),
            "LN": table["norm_first"].map(lambda x: "" if x is None or pd.isna(x) else ("pre" if x else "post")),
            "steps": table["steps"].map(_text),
            "n": table["n"].astype(str),
            "PPL (dev)": [_pm(m, s, ".3f") for m, s in zip(table["ppl"], table["ppl_std"])],
            "BLEU (dev)": [_pm(m, s, ".2f") for m, s in zip(table["bleu"], table["bleu_std"])],
            "params ×10⁶": table["params_m"].map(lambda x: _fmt(x, ".2f")),
            "paper PPL": table["paper_ppl"].map(lambda x: _fmt(x, ".2f")),
            "paper BLEU": table["paper_bleu"].map(lambda x: _fmt(x, ".1f")),
            "paper params ×10⁶": table["paper_params_m"].map(lambda x: _fmt(x, "g")),
            "Δ PPL %": table["delta_ppl_pct"].map(lambda x: _fmt(x, "+.1f")),
            "paper Δ PPL %": table["paper_delta_ppl_pct"].map(lambda x: _fmt(x, "+.1f")),
            "Δ BLEU": table["delta_bleu"].map(lambda x: _fmt(x, "+.2f")),
            "paper Δ BLEU": table["paper_delta_bleu"].map(lambda x: _fmt(x, "+.1f")),
            "scored on": table["metric"].map(lambda m: {"ppl": "PPL", "bleu": "BLEU"}.get(m, "")),
            "predicted": table["predicted"],
            "p (Holm)": table["p_holm"].map(_p),
            "verdict": table["verdict"],
            "converged": table["converged"],
            "boot.": table["sig"],
        }
    )


LEFT = {"group", "row", "PE", "LN", "scored on", "predicted", "verdict", "converged", "boot."}


def _md_table(table: pd.DataFrame) -> str:
    df = display(table)
    align = ["left" if c in LEFT else "right" for c in df.columns]
    return df.to_markdown(index=False, disable_numparse=True, colalign=align)


def markdown(table, notes, title, notice, plot_links) -> str:
    lines = [notice, "", f"# {title}", "", _md_table(table), "", "## Notes", ""]
    for text, items in notes:
        lines.append(f"- {text}")
        lines += [f"  - {item}" for item in items]
    lines += ["", "## Plots", ""]
    lines += [f"![{alt}]({path})" for path, alt in plot_links]
    return "\n".join(lines) + "\n"


def _html_text(text: str) -> str:
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text, quote=False))


def html_page(table, notes, title, notice, plot_links) -> str:
    body = display(table).to_html(index=False, na_rep="", border=0, classes="table3", escape=True)
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
        "body{font-family:sans-serif;margin:2em}table.table3{border-collapse:collapse;font-size:13px}"
        ".table3 td,.table3 th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}"
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
    parts = re.split(r"`([^`]*)`", text)
    return "".join(tex_escape(p) if i % 2 == 0 else r"\texttt{" + tex_escape(p) + "}" for i, p in enumerate(parts))


# the knobs' own LaTeX headers (ablations/knobs.py), for the columns named by the knob
TEX_HEADERS = {k: KNOBS[k].tex for k in MODEL_KEYS if KNOBS[k].tex.startswith("$")}


def latex(table, notes, title, notice) -> str:
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
    notes_tex = []
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
