"""The report's notes: the prose under each table (what was run, how it was judged, what it found), from the runs
and the verdicts; `headline`, the line the terminal prints; `capped_lead`, a look's first lines. Built by
reports/build.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import pandas as pd

from aiayn.ablations.predictions import (
    MIN_PAPER_DELTA_BLEU,
    MIN_PAPER_DELTA_PPL,
    PREDICTIONS_FILE,
    SCORED,
    predictions,
    registration_sha256,
)
from aiayn.ablations.presets import PRESETS
from aiayn.reports import significance, stats, verdicts
from aiayn.reports.render import fmt_number, fmt_p
from aiayn.reports.runs import Run

# Where every run leaves the paper, whatever its row (README "Faithful to the paper, and where not").
GLOBAL_DEVIATIONS = (
    "label smoothing spreads ε over all V classes (PyTorch), not the V − 1 others (tensor2tensor)",
    "initialization (not stated in the paper): Xavier-uniform projections, N(0, d_model^-0.5) embeddings",
    "the table's BLEU is sacreBLEU on detokenized output; the paper's tokenized BLEU (Moses tokenizer, compound "
    "splitting, multi-bleu) is each run's `dev_tok_bleu` in metrics.json (`aiayn score` scores any output so)",
)


def capped_lead(capped: list[str], runs: list[Run]) -> str:
    """The first lines of a report of capped runs: what they are, and that no verdict is given."""
    if not capped:
        return ""
    done = [r for r in runs if r.completed]
    steps = sorted({int(r.metrics.steps) for r in done if r.metrics.steps is not None})
    budgets = sorted({int(r.budget) for r in done if r.budget is not None})
    sentences = sorted({int(r.metrics.dev_sentences) for r in done if r.metrics.dev_sentences is not None})
    evaluated = f", evaluated on {'/'.join(map(str, sentences))} dev sentences" if sentences else ""
    return (
        f"**A look, not the table: {len(capped)} of {len(done)} completed run(s) stopped short of their budget "
        f"(`--max-steps`: {'/'.join(map(str, steps))} of {'/'.join(map(str, budgets))} steps{evaluated}).** Its "
        "numbers are not the preset's and no pre-registered verdict is given; the same command without --max-steps "
        "(into the same --out) extends these runs to their budget, their final evaluation on the whole dev set."
    )


def runs_recorded(runs: list[Run]) -> dict:
    """What the runs recorded of their code and their pre-registration (aiayn.common.provenance)."""
    commits = sorted({r.metrics.commit for r in runs if r.metrics.commit})
    return {
        "commits": commits,
        "dirty_runs": sorted(f"{r.row} seed {r.seed}" for r in runs if r.metrics.dirty),
        "unrecorded_runs": sum(r.metrics.commit is None for r in runs),
        "predictions_sha256": sorted({r.metrics.predictions_sha256 for r in runs if r.metrics.predictions_sha256}),
    }


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


class Note(NamedTuple):
    """One note under a report's table: its text and its sub-items; `code` spans are the only markup. The renderers
    (reports/render.py: Markdown, HTML, LaTeX) lay every note out alike."""

    text: str
    items: list[str] | tuple[str, ...] = ()


@dataclass(frozen=True)
class Facts:
    """What a report's notes are written from: its table, runs and verdicts, as reports/build.py made them."""

    table: pd.DataFrame
    runs: list[Run]
    preset: str
    data: str
    skipped: list  # (path, why) of unreadable metrics.json files
    family: dict  # (cell, row) -> Verdict of the registration
    baselines: dict  # baseline name -> its verdicts on the same numbers
    scored_preset: str | None  # the preset whose registration scores these runs (None: no verdict)
    convergence: str
    slopes: pd.DataFrame | None = None
    reading: str = "nearest"
    mismatched: dict = field(default_factory=dict)  # row -> why its Δ is left blank

    @cached_property
    def done(self) -> list[Run]:
        return [r for r in self.runs if r.completed]

    @cached_property
    def score(self) -> dict:
        return verdicts.score(self.family, self.baselines)

    @cached_property
    def scored(self) -> list:
        return [v for v in self.family.values() if v.predicted in SCORED]

    @cached_property
    def cells(self) -> list[str]:
        return list(dict.fromkeys(v.cell for v in self.family.values()))

    def where(self, v) -> str:
        """A verdict's cell, where the report has more than one."""
        return f" [{v.cell}]" if len(self.cells) > 1 else ""


def report_notes(facts: Facts) -> list[Note]:
    """Every note, in the order a reader meets them: each of NOTES' writers gives none, one or more."""
    return [note for write in NOTES for note in write(facts)]


def _setting(f: Facts) -> list[Note]:
    done = f.done
    signatures = sorted({str(r.metrics.dev_bleu_signature) for r in done if r.metrics.dev_bleu_signature})
    sentences = sorted({int(r.metrics.dev_sentences) for r in done if r.metrics.dev_sentences})
    sig_text = ", ".join(f"`{s}`" for s in signatures) or "(none recorded)"
    mixed = " (mixed signatures: the rows are not comparable)" if len(signatures) > 1 else ""
    on = f" on {'/'.join(map(str, sentences))} dev sentences" if sentences else ""
    return [
        Note(f"Preset `{f.preset}`, corpus `{f.data}`; scaling rule: {_rule(f.runs, f.preset)}.", []),
        _code_note(f.runs, f.scored_preset),
        Note(
            f"BLEU: sacreBLEU of the final model's beam search on detokenized output{on}, signature {sig_text}{mixed}; "
            "PPL: dev perplexity per target token, teacher-forced. Ours: mean ± sample std (n − 1) over the n "
            "completed seeds (std blank for n = 1); steps: optimizer steps trained (the plan where no run completed). "
            "Δ: the row against base, ours (means over seeds) and the paper's; Δ PPL in percent of base's.",
            [],
        ),
    ]


def _mismatched(f: Facts) -> list[Note]:
    if not f.mismatched:
        return []
    return [
        Note(
            "Not comparable with base: trained to another share of their budget than base's runs (a look that "
            "mixes --max-steps), or evaluated on other dev sentences (a sweep resumed with another --eval-subset); "
            "their Δ is left blank and they are not tested:",
            [f"{row}: {why}" for row, why in f.mismatched.items()],
        )
    ]


def _unjudged(f: Facts) -> list[Note]:
    """Why a report gives no verdict: no registration of its preset applies, or it scores nothing."""
    if not f.scored_preset:
        preset, data = f.preset, f.data
        why = (
            f"corpus `{data}` is not the preset's own"
            if preset in PRESETS and data != PRESETS[preset].corpus
            else "runs stopped short of their budget (`--max-steps`)"
            if preset in PRESETS
            else "the preset is not aiayn's"
        )
        return [
            Note(
                f"No pre-registered verdicts: {why}, and `ablations/{PREDICTIONS_FILE.name}` is about the "
                "presets' own regimes.",
                [],
            )
        ]
    if not f.scored:
        return [Note(f"Preset `{f.preset}` has no pre-registered scored rows (`ablations/{PREDICTIONS_FILE.name}`).")]
    return []


def _judged(f: Facts) -> bool:
    return bool(f.scored_preset and f.scored)


def _protocol(f: Facts) -> list[Note]:
    if not _judged(f):
        return []
    suite = (
        f" The tests of cell(s) {', '.join(f'`{x}`' for x in f.cells[1:])} (run by the same command, each against "
        "its own base) are in the same family and the same score."
        if len(f.cells) > 1
        else ""
    )
    return [
        Note(
            f"Pre-registered (`ablations/{PREDICTIONS_FILE.name}`, committed before these runs): which rows are "
            f"scored, on which metric, and the prediction, each with its reason; a row may be predicted worse or "
            f"better only where the paper's Δ is beyond its own noise (|Δ BLEU| ≥ {MIN_PAPER_DELTA_BLEU:g} or |Δ PPL| "
            f"≥ {MIN_PAPER_DELTA_PPL:.1%}), and equivalent only where it is under both. Each scored row is tested "
            f"against base over seeds on per-seed dev log-perplexity (PPL rows) or dev BLEU (BLEU rows): a "
            f"predicted difference by Welch's t-test, two-sided; a predicted equivalence by two one-sided Welch tests "
            f"(TOST) against its registered margin. The p-values are Holm-adjusted together; significant at α = "
            f"{_level_text(f.scored_preset)}.{suite} Every row trains the same budget and is compared at the end, as "
            "in the paper; "
            f"{verdicts.stability_text(f.reading)}.",
            [],
        )
    ]


def _level_text(preset: str) -> str:
    from aiayn.ablations.stages import level, stages

    k = 1 + len(stages(preset))
    if k == 1:
        return f"{stats.ALPHA:g}"
    return f"{level(preset):.4f} (Šidák's share of {stats.ALPHA:g} for its {k} stages)"


def _score(f: Facts) -> list[Note]:
    if not _judged(f):
        return []
    s, c = f.score, f.score["counts"]
    return [
        Note(
            f"Score: {s['passed']} of {s['scored']} pre-registered tests pass ({c[stats.SIGNIFICANT_AGREE]} "
            f"significant in the predicted direction, {c[stats.EQUIVALENT]} equivalent); {c[stats.AGREE]} more agree "
            f"in sign without significance, {c[stats.DISAGREE] + c[stats.SIGNIFICANT_DISAGREE]} disagree "
            f"({c[stats.SIGNIFICANT_DISAGREE]} significantly), {c[stats.NOT_EQUIVALENT]} not equivalent, "
            f"{c[stats.INCONCLUSIVE]} inconclusive, "
            f"{c[stats.EQUIVALENT_UNASSAYED]} equivalent without assay sensitivity (not counted), "
            f"{c[stats.NOT_STABLE]} not stable. {_baselines_text(s)}" + _not_run_text(s),
            [f"{v.row}{f.where(v)} ({v.metric}, predicted {v.predicted}): {v.verdict}" + _p_text(v) for v in f.scored],
        ),
        _baselines_note(f.scored, s, f.where),
        Note(
            "Why each test passed or failed, point by point (the stability rule):",
            [f"{v.row}{f.where(v)}: {v.why}" for v in f.scored],
        ),
    ]


def _equivalences(f: Facts) -> list[Note]:
    equiv = [v for v in f.scored if v.predicted == "equivalent"] if _judged(f) else []
    if not equiv:
        return []
    return [
        Note(
            'Equivalence: TOST\'s p is the larger of the two one-sided p-values of "worse by the margin or more" '
            'and "better by the margin or more" (equivalently, the 1 - 2α interval of the difference, its level '
            "given below, lies inside ± the margin, around the registered center where one is registered, else "
            "around 0). An equivalence counts only where the same cell also shows a row of the same knob (one that "
            "varies only knobs the equivalence varies: A1 or B1 for A3, no-pe for E1) significantly different as "
            "predicted (assay sensitivity: the seeds can see a difference that knob makes), and is refuted where "
            "Welch's two-sided test, Bonferroni-adjusted over the family, finds a difference.",
            [f"{v.row}{f.where(v)}: {_margin_text(v)}" for v in equiv if v.margin],
        )
    ]


def _margin_text(v) -> str:
    """An equivalence's margin, center, Δ and intervals."""
    center = f" around {_pct(v.center)} (its registered center: the difference the regime predicts)" if v.center else ""
    interval = (
        f"({stats.tost_level(v.alpha)} interval {_pct(v.tost_low)} to {_pct(v.tost_high)}, TOST's; "
        f"95% {_pct(v.ci_low)} to {_pct(v.ci_high)})"
        if not pd.isna(v.tost_low)
        else "(no interval: fewer than two seeds on a side)"
    )
    return f"margin ±{100 * math.expm1(v.margin):.2f}% of dev PPL{center}; Δ {_pct(v.delta_worse)} {interval}"


def _controls(f: Facts) -> list[Note]:
    controls = [v for v in f.family.values() if v.predicted == "control" and v.verdict != stats.NOT_RUN]
    if not _judged(f) or not controls:
        return []
    return [
        Note(
            "Controls, never scored: rows beyond the paper's claims, predicted worse and tested in the same family, "
            "so that an equivalence of their knob can count (a significant difference shows the seeds can see what "
            "that knob does):",
            [f"{v.row}{f.where(v)} ({v.metric}): {v.verdict}" + _p_text(v) for v in controls],
        )
    ]


def _checks(f: Facts) -> list[Note]:
    checks = [v for v in f.family.values() if v.predicted == "check"] if _judged(f) else []
    if not checks:
        return []
    return [
        Note(
            "Checks, not findings: label smoothing ε over V classes leaves a model that learns its smoothed "
            "target exactly a dev perplexity of 1/(1 − ε + ε/V) against one-hot references, so where a model is "
            "near that floor, no smoothing must read better and more smoothing worse by arithmetic. These rows "
            "are reported against their floors (a smoothed model cannot go below its own) and never scored.",
            [
                f"{v.row}{f.where(v)}: dev PPL {fmt_number(v.ppl, '.3f') or 'none'} against its floor "
                f"{fmt_number(v.floor, '.3f') or 'unknown'}: {v.verdict}"
                for v in checks
            ],
        )
    ]


def _unscored(f: Facts) -> list[Note]:
    out = []
    for cell in f.cells if _judged(f) else []:
        unscored = [p for p in predictions(cell).values() if p.predicted in ("not scored", "not testable")]
        if unscored:
            out.append(
                Note(
                    f"Not scored in `{cell}`, as pre-registered (the rows a reader might expect, and why not):",
                    [f"{p.row} ({p.predicted}): {p.reason}" for p in unscored],
                )
            )
    return out


def _single(f: Facts) -> list[Note]:
    single = [v.row for v in f.scored if min(v.n_row, v.n_base) == 1] if _judged(f) else []
    if not single:
        return []
    return [
        Note(
            f"One seed on a side ({', '.join(single)}): no seed-level test, so the verdict is the sign of one run "
            "against another, an anecdote. Single runs can show an effect that is large against the spread "
            "between seeds (the same command with `--first-seed 1`, `2` then gives the same signs), not a "
            "smaller one: that takes seeds (`--seeds`, `--base-seeds`, the `evidence` preset, or seed sets run "
            "apart and pooled: `aiayn report --runs A --runs B ...`).",
            [],
        )
    ]


def _convergence(f: Facts) -> list[Note]:
    rule = verdicts.rule_text(f.convergence)
    falls = [f"{r} {100 * d:.1f}%" for r, d in zip(f.table["row"], f.table["last_drop"]) if pd.notna(d)]
    text = (
        f"{rule[0].upper()}{rule[1:]} (`last_drop` in the CSVs; each run's in the -runs.csv, its curve in the "
        "-curves.csv)."
    )
    return [Note(text, [", ".join(falls)] if falls else [])]


def _slopes(f: Facts) -> list[Note]:
    if f.slopes is None or not len(f.slopes):
        return []
    items = [
        f"{r.series} ({r.knob} {r.values}; rows {r.rows}; {r.n} runs): {r.slope_pct:+.2f}% per doubling"
        + ("" if pd.isna(r.ci_low_pct) else f" (95% interval {r.ci_low_pct:+.2f} to {r.ci_high_pct:+.2f})")
        for r in f.slopes.itertuples()
    ]
    return [
        Note(
            "Series: each of Table 3's series as a trend, the least-squares slope of dev log-PPL against log2 of the "
            "knob through every completed run of base and the series' rows, as percent of dev PPL per doubling of the "
            "knob (negative: more is better), with its 95% interval (the seeds' spread is the residual's). "
            "Descriptive: the pre-registered tests are the pairwise ones. In the -slopes.csv.",
            items,
        )
    ]


def _bootstrap(f: Facts) -> list[Note]:
    tested = f.table[f.table["bootstrap_p"].notna()]
    seeds = sorted(set(tested["bootstrap_seed"].astype(int)))
    return [
        Note(
            f"`{significance.MARK}` (secondary): p < {significance.ALPHA:g} in sacreBLEU's paired bootstrap resampling "
            f"({significance.N_SAMPLES} resamples, seed {significance.bootstrap_seed()}) of the row's dev "
            "hypotheses against base's of the same seed (seed 0, else the first common seed), on the same "
            f"references; tested {len(tested)} row(s)"
            + (f" with seed(s) {', '.join(map(str, seeds))}" if seeds else "")
            + ". It covers the sampling of dev sentences only, not the seed-to-seed spread of training, which is "
            "several times larger: the verdicts rest on seeds, not on it. p-values are in the CSV.",
            [],
        )
    ]


def _deviations(f: Facts) -> list[Note]:
    deviations = list(GLOBAL_DEVIATIONS)
    if f.preset != "paper":
        deviations.append(f"scaled down by the preset's rule, corpus `{f.data}` (paper: WMT14 En-De, newstest2013)")
    per_dev: dict[str, list[str]] = {}
    for run in f.runs:
        for d in run.metrics.deviations:
            rows = per_dev.setdefault(str(d), [])
            if run.row not in rows:
                rows.append(run.row)
    deviations += [f"{d} (rows: {', '.join(rows)})" for d, rows in per_dev.items()]
    return [Note("Deviations from the paper:", deviations)]


def _books(f: Facts) -> list[Note]:
    """Compute, rows changed since they ran, runs that did not complete, files skipped."""
    total = sum(float(r.metrics.train_time_s or 0) for r in f.runs)
    out = [Note(f"Compute: {_hours(total)} of training ({total:.0f} s summed over {len(f.done)} completed run(s)).")]
    changed = _changed_rows(f.done)
    if changed:
        out.append(
            Note(
                "Rows that resolve otherwise now than when they ran (edited in ablations/, or the preset's rule "
                "changed): their numbers here are the old rows'; delete their run directories and sweep again "
                "to train them anew:",
                changed,
            )
        )
    failed = sorted((r for r in f.runs if not r.completed), key=lambda r: (r.row, r.seed))
    out.append(
        Note(
            f"Runs that did not complete ({len(failed)}):" if failed else "Runs that did not complete: none.",
            [f"{r.row} seed {r.seed}: {r.metrics.status}: {_one_line(r.metrics.error)}" for r in failed],
        )
    )
    skipped = f.skipped
    out.append(
        Note(
            f"Skipped files, unreadable metrics.json ({len(skipped)}):" if skipped else "Skipped files: none.",
            [f"`{p.as_posix()}`: {why}" for p, why in skipped],
        )
    )
    return out


# The notes in the order a reader meets them
NOTES = (
    _setting,
    _mismatched,
    _unjudged,
    _protocol,
    _score,
    _equivalences,
    _controls,
    _checks,
    _unscored,
    _single,
    _convergence,
    _slopes,
    _bootstrap,
    _deviations,
    _books,
)


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
    return [
        f"{row} (seed {', '.join(map(str, sorted(seeds)))}): {', '.join(change)}"
        for row, (seeds, change) in by_row.items()
    ]


def _code_note(runs: list[Run], scored_preset: str | None) -> Note:
    """Which commit the runs ran from, and which pre-registration they recorded against the one scored here."""
    src = runs_recorded(runs)
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
            text += (
                f" Pre-registration: the runs recorded sha256 {held}, but this report scores with "
                f"`{(now or 'none')[:16]}`: the predictions changed after the runs."
            )
    return Note(text, [])


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
    return f" ({seeds}: {test} = {fmt_p(v.p)}, Holm-adjusted {fmt_p(v.p_holm)}; {_tested_delta(v)})"


def _tested_delta(v) -> str:
    """The difference the verdict tested at the end and its interval (the table's Δ is the final evaluation's; a
    preset that reads each point as a median of validations tests that median): in percent of dev PPL, or BLEU."""
    low, high = (v.tost_low, v.tost_high) if v.predicted == "equivalent" else (v.ci_low, v.ci_high)
    level = stats.tost_level(v.alpha) if v.predicted == "equivalent" else "95%"
    if v.metric == "ppl":
        pct = lambda x: f"{100 * math.expm1(x):+.2f}"
        return f"Δ tested {pct(v.delta_worse)}% PPL, {level} interval {pct(low)} to {pct(high)}"
    return f"Δ tested {-v.delta_worse:+.2f} BLEU, {level} interval {-high:+.2f} to {-low:+.2f}"


def _baselines_text(s: dict) -> str:
    """What each naive baseline and random signs score on the same tests."""
    parts = [
        f'"{b["label"]}" passes {b["passed"]} of {s["scored"]} and agrees in sign on {b["agree"]}'
        for b in s["baselines"].values()
    ]
    r = s["random_signs"]
    text = f"Judged on the same numbers by the same rules, {' and '.join(parts)}; " if parts else ""
    return (
        f"{text}on the {r['directional_tests']} directional tests random signs agree on {r['expected_agree']:g} on "
        f"average, and on {s['agree']} or more with probability {r['p_at_least_as_many']:.3f}."
    )


def _baselines_note(scored: list, s: dict, where) -> Note:
    """Test by test, wherever a naive baseline predicts otherwise than the registration: each one's prediction and
    its verdict on the same numbers."""
    items = []
    for v in scored:
        name = f"{v.row}{where(v)}"
        others = [(b["label"], b["predictions"].get(name), b["verdicts"].get(name)) for b in s["baselines"].values()]
        if any(p is not None and p != v.predicted for _, p, _ in others):
            items.append(
                f"{name}: registered {v.predicted}: {v.verdict}; "
                + "; ".join(f'"{label}" {p}: {verdict}' for label, p, verdict in others if p is not None)
            )
    where_text = "every registered prediction" if not items else "the tests where they predict otherwise"
    return Note(
        f"The naive baselines on {where_text} (each judged like the registration: every point of the stability "
        'rule, one Holm family; "more parameters help" by each row\'s parameter count at this preset against '
        'base\'s, as many or fewer predicted worse; "the parameter count alone" the same, but a row within 1% of '
        "base's count predicted equivalent, within the test's margin or its preset's):",
        items,
    )


def _not_run_text(s: dict) -> str:
    """The scored rows the runs reported hold no run of (a `--rows` selection): outside the score, named."""
    if not s.get("not_run"):
        return ""
    return (
        f" Not run here, so not in the score: {', '.join(s['not_run'])} (scored by the registration; no run of "
        "theirs among these runs: `aiayn table3` without --rows runs them)."
    )


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


def _one_line(text) -> str:
    if not text:
        return "(no error recorded)"
    line = str(text).strip().splitlines()[0]
    return line if len(line) <= 200 else line[:197] + "..."


def stage_notes(staged: list) -> list[Note]:
    """One note per later stage of the table (ablations/stages.csv): what it re-tests on which fresh seeds, at which
    level, whether it is whole, and its tests point by point."""
    from aiayn.ablations.stages import level

    out = []
    for r in staged:
        s = r.stage
        seeds = ", ".join(f"{row} {n}" for row, n in s.seeds.items())
        arms = [f"{row} with an equivalence arm of ±{t.margin:g}" for row, t in s.tests.items() if t.margin is not None]
        done = sum(int(n) for n in r.t3.rows["n"].fillna(0)) if r.t3 is not None else 0
        state = (
            "whole: it decides its tests (the verdicts above are its)"
            if r.whole
            else f"not whole ({done} of {sum(s.seeds.values())} runs completed): no verdict is read from it yet, and "
            "stage 1's stand"
        )
        items = [f"{v.row}: {v.why}" for v in r.family.values() if v.predicted in SCORED] if r.whole else []
        out.append(
            Note(
                f"Stage {s.number} (`ablations/stages.csv`, registered before its runs): re-tests "
                f"{', '.join(s.tests)} on fresh seeds from {s.first_seed} ({seeds})"
                + (f", {'; '.join(arms)}" if arms else "")
                + f", decided on its own seeds alone at α {level(s.preset):.4f} (Šidák's share of 0.05 for "
                f"{1 + len([x for x in staged])} stages; stage 1 at the same level); {state}.",
                items,
            )
        )
    return out
