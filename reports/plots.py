"""The report's PNG plots (matplotlib, Agg), each saved atomically."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from aiayn.common.files import atomic_open


def _color(group: str, groups: list[str]) -> str:
    return f"C{groups.index(group) % 10}"


def save_png(fig, path: Path) -> Path:
    """Save `fig` to a temp file beside `path`, then os.replace: readers never see half a PNG."""
    try:
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def bleu_vs_params(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Our dev BLEU (mean, ± std as error bars) against our parameter count, log-x, one point per row."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    df = table.dropna(subset=["bleu", "params_m"])
    groups = list(dict.fromkeys(table["group"]))
    for group, part in df.groupby("group", sort=False):
        ax.errorbar(
            part["params_m"],
            part["bleu"],
            yerr=part["bleu_std"].fillna(0),
            fmt="o",
            capsize=3,
            color=_color(group, groups),
            label=group,
        )
        for _, r in part.iterrows():
            ax.annotate(r["row"], (r["params_m"], r["bleu"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if df.empty:
        _no_data(ax, "no completed runs yet")
    else:
        ax.set_xscale("log")
        # labels at 1, 2 and 5 of each decade only: a label on every minor tick overlaps its neighbours
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8, title="group", title_fontsize=8)
    ax.set_xlabel("parameters (M, log scale)")
    ax.set_ylabel("dev BLEU (sacreBLEU)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    return save_png(fig, path)


class FamilyLine(NamedTuple):
    """One row of a families panel: its seeds' Δs against their stage's base mean, the paper's Δ, Welch's 95% interval
    of the row's Δ, its verdict, and an equivalence's margin (half the band) in the panel's units."""

    row: str
    stage: int
    deltas: list
    paper: float | None = None
    ci: tuple | None = None
    verdict: str = ""
    band: float | None = None


SCORED_PREDICTIONS = ("worse", "better", "equivalent")  # a row is scored when its registration predicts one of these


def _scored(table: pd.DataFrame) -> pd.Series:
    """The one definition of a scored row in every plot: its registration predicts worse, better or equivalent."""
    return table["predicted"].isin(SCORED_PREDICTIONS)


def _spread(values: pd.Series) -> bool:
    """Whether one value dwarfs the rest (the largest more than 5x the next): a linear axis would squash them."""
    v = sorted(values.abs().dropna(), reverse=True)
    return len(v) > 1 and v[0] > 5 * max(v[1], 1e-9)


def _symlog(ax, axis: str, pad: bool = True) -> None:
    """Linear within ±1 (one BLEU, one percent), logarithmic beyond: no row squashes the others. `pad` widens the
    limits by a fifth of a decade, so that the farthest point is not drawn on the frame."""
    getattr(ax, f"set_{axis}scale")("symlog", linthresh=1.0)
    getattr(ax, f"{axis}axis").set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if pad:
        low, high = getattr(ax, f"get_{axis}lim")()
        getattr(ax, f"set_{axis}lim")(low * 1.6 if low < -1 else low, high * 1.6 if high > 1 else high)


def delta_vs_paper(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Our Δ vs base against the paper's, Δ PPL (%) and Δ BLEU side by side, with the diagonal (perfect
    agreement); filled: scored on that panel's metric, hollow: the others; a symmetric log axis where one row dwarfs
    the others."""
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 5.0))
    groups = list(dict.fromkeys(table["group"]))
    for ax, (ours, paper, what, metric) in zip(
        axes,
        (
            ("delta_ppl_pct", "paper_delta_ppl_pct", "Δ PPL (%)", "ppl"),
            ("delta_bleu", "paper_delta_bleu", "Δ BLEU", "bleu"),
        ),
    ):
        scored = _scored(table) & table["metric"].eq(metric)
        df = table[table[ours].notna() & table[paper].notna()]
        for group, part in df.groupby("group", sort=False):
            filled = scored[part.index]
            color = _color(group, groups)
            ax.scatter(
                part[paper],
                part[ours],
                color=color,
                label=group,
                zorder=3,
                facecolors=[color if f else "none" for f in filled],
            )
            for _, r in part.iterrows():
                ax.annotate(r["row"], (r[paper], r[ours]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        log = not df.empty and _spread(pd.concat([df[paper], df[ours]]))
        if df.empty:
            _no_data(ax, "no rows with both deltas yet")
            lim = 1.0
        else:  # a fifth of a decade beyond the farthest point on a log axis: not drawn on the frame
            lim = (1.6 if log else 1.1) * max(1e-3, df[paper].abs().max(), df[ours].abs().max())
            ax.legend(fontsize=8, title=f"group (filled: scored on {metric.upper()})", title_fontsize=8)
        ax.plot([-lim, lim], [-lim, lim], color="gray", linestyle="--", linewidth=1, label="_diagonal")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.axvline(0, color="black", linewidth=0.5)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        if log:
            _symlog(ax, "x", pad=False)
            _symlog(ax, "y", pad=False)
        ax.set_xlabel(f"paper: {what} vs base" + (" (symmetric log)" if log else ""))
        ax.set_ylabel(f"ours: {what} vs base" + (" (symmetric log)" if log else ""))
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, path)


def forest(table: pd.DataFrame, path: Path, title: str, metric: str = "ppl") -> Path:
    """Each row's Δ against base on one metric (`ppl`: percent of dev PPL; `bleu`: BLEU points), mean over seeds with
    its 95% Welch interval, the paper's Δ as a cross, labelled with its verdict where it is scored on that metric; the
    equivalence band of the rows registered equivalent; a symmetric log axis where one row dwarfs the others. The
    PPL forest holds every row not scored on BLEU (scored rows filled, the others hollow), the BLEU forest the rows
    scored on BLEU: no verdict sits beside another metric's interval."""
    ppl = metric == "ppl"
    col, low_col, high_col, paper_col = (
        ("delta_ppl_pct", "delta_ppl_ci_low", "delta_ppl_ci_high", "paper_delta_ppl_pct")
        if ppl
        else ("delta_bleu", "delta_bleu_ci_low", "delta_bleu_ci_high", "paper_delta_bleu")
    )
    df = forest_rows(table, metric).iloc[::-1]
    fig, ax = plt.subplots(figsize=(7.2, 0.9 + 0.32 * max(len(df), 1)))
    if df.empty:
        _no_data(ax, "no row scored on BLEU" if not ppl else "no row with a completed run beside base's")
    else:
        y = range(len(df))
        scored = (_scored(df) & df["metric"].eq(metric)).to_numpy()
        low = (df[col] - df[low_col]).fillna(0).clip(lower=0)
        high = (df[high_col] - df[col]).fillna(0).clip(lower=0)
        for i, (x, lo, hi, filled) in enumerate(zip(df[col], low, high, scored)):
            ax.errorbar(
                x, i, xerr=[[lo], [hi]], fmt="o", color="C0", capsize=3, markerfacecolor="C0" if filled else "white"
            )
        ax.scatter(df[paper_col], list(y), marker="x", color="C3", label="the paper's Δ", zorder=4)
        labelled = False  # each equivalence's band on its own line, around its registered center (0: base)
        if ppl:
            for i, (m, c) in enumerate(zip(df["margin_pct"], df.get("center_pct", pd.Series(0.0, index=df.index)))):
                if pd.isna(m):
                    continue
                c = 0.0 if pd.isna(c) else float(c)
                band = None if labelled else "equivalence band"
                ax.fill_betweenx([i - 0.4, i + 0.4], c - m, c + m, color="C2", alpha=0.2, linewidth=0, label=band)
                labelled = True
        names = [f"{r} ({v})" if v and s else r for r, v, s in zip(df["row"], df["verdict"], scored)]
        ax.set_yticks(list(y))
        ax.set_yticklabels(names, fontsize=7)
        ax.legend(fontsize=7, loc="best")
    ax.axvline(0, color="black", linewidth=0.6)
    log = not df.empty and _spread(pd.concat([df[col], df[paper_col]]))
    if log:
        _symlog(ax, "x")
    intervals = df[low_col].notna().any() if not df.empty else False
    bars = "; bars: 95% interval over seeds" if intervals else "; one seed a side: no interval"
    what = f"Δ dev {'PPL against base, %' if ppl else 'BLEU against base'}{', symmetric log' if log else ''}"
    ax.set_xlabel(f"{what} (filled: scored on it, its verdict beside it{bars})")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    return save_png(fig, path)


def forest_rows(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The rows a forest on `metric` draws: every row with a Δ but base, on PPL those not scored on BLEU, on BLEU those
    scored on it (a verdict is drawn beside its own metric's interval only)."""
    on_bleu = table["metric"].eq("bleu")
    keep = ~on_bleu if metric == "ppl" else on_bleu
    col = "delta_ppl_pct" if metric == "ppl" else "delta_bleu"
    return table[(table["row"] != "base") & table[col].notna() & keep]


def families(panels: list, path: Path, title: str) -> Path:
    """One panel per family of Table 3 (ablations.table.FAMILIES): each row's Δ against base on the metric the family
    is scored on, every seed a point (base's own seeds first, against their mean: the noise; a later stage's seeds
    beside stage 1's, in its own colour), the mean with Welch's 95% interval of the difference, the paper's Δ as a
    cross, the verdict under the row, an equivalence's band. `panels`: (family, metric, [FamilyLine, ...])."""
    shown = [p for p in panels if any(line.row != "base" for line in p[2])]
    cols = min(3, max(len(shown), 1))
    rows = -(-max(len(shown), 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    for ax, (name, metric, lines) in zip(axes.ravel(), shown):
        ticks = []
        for i, line in enumerate(lines):
            deltas = line.deltas
            color = "gray" if line.row == "base" else "C0" if line.stage == 1 else f"C{line.stage}"
            jitter = [(k - (len(deltas) - 1) / 2) * min(0.06, 0.6 / len(deltas)) for k in range(len(deltas))]
            ax.scatter([i + j for j in jitter], deltas, s=12, color=color, alpha=0.7, zorder=3)
            mean = sum(deltas) / len(deltas)
            if line.ci is not None and not any(pd.isna(x) for x in line.ci):
                lo, hi = line.ci
                ax.errorbar(i, mean, yerr=[[mean - lo], [hi - mean]], fmt="_", color="black", capsize=5, zorder=4)
            elif line.row != "base":
                ax.scatter([i], [mean], marker="_", s=200, color="black", zorder=4)
            if line.paper is not None and not pd.isna(line.paper):
                ax.scatter([i], [line.paper], marker="x", color="C3", s=40, zorder=5)
            if line.band is not None:
                ax.fill_between([i - 0.4, i + 0.4], -line.band, line.band, color="C2", alpha=0.2, linewidth=0)
            stage = "" if line.stage == 1 else f", stage {line.stage}"
            ticks.append(f"{line.row}{stage}\n{line.verdict}" if line.verdict else f"{line.row}{stage}")
        ax.set_xticks(range(len(ticks)))
        ax.set_xticklabels(ticks, fontsize=7)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xlim(-0.6, len(ticks) - 0.4)
        log = _spread(pd.Series([sum(line.deltas) / len(line.deltas) for line in lines if line.row != "base"]))
        if log:
            _symlog(ax, "y")
        what = f"Δ dev {'PPL, %' if metric == 'ppl' else 'BLEU'} against base{' (symmetric log)' if log else ''}"
        ax.set_title(f"{name}: {what}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in axes.ravel()[len(shown) :]:
        ax.set_visible(False)
    if not shown:
        _no_data(axes[0][0], "no row with a completed run beside base's")
    key = (
        "dots: seeds (base's against their own mean); bar: the row's Δ and its 95% interval; ×: the paper's Δ; "
        "green: an equivalence's margin"
    )
    fig.suptitle(f"{title}\n{textwrap.fill(key, width=int(15 * 4.6 * cols))}", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def curves(
    runs: dict[tuple[str, int], pd.DataFrame],
    path: Path,
    title: str,
    capped: list[str] = (),
    points: tuple[float, ...] = (),
    bleu_sets: str = "",
) -> Path:
    """Training loss, learning rate, dev PPL and, where the runs logged it, dev BLEU against step (`bleu_sets`: which
    dev sentences the runs decoded there, where they differ): one panel each,
    only the panels with data, one line per row (the mean over its seeds) with a band (their range), so the spread
    between seeds is seen beside the differences between rows. The learning rate is drawn once per distinct schedule
    (rows that share one are named together). Dev PPL is on a linear scale zoomed to the second half of training,
    where the final differences are, with the stability rule's `points` (fractions of the last step) marked; runs cut
    short by --max-steps are named in the title."""
    metrics = [
        ("train/loss", "training loss per token (label-smoothed where the row smooths; running mean of 20 logs)"),
        ("lr", "learning rate"),
        ("val/ppl", "dev PPL (whole dev set), second half of training"),
        ("val/bleu", "dev BLEU at validations" + (f" ({bleu_sets})" if bleu_sets else "")),
    ]
    logged = lambda m: any(m in df and df[m].notna().any() for df in runs.values())
    shown_metrics = [m for m in metrics if logged(m[0])] or metrics[:1]
    cols = min(len(shown_metrics), 2 if len(shown_metrics) == 4 else 3)
    nrows = -(-len(shown_metrics) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.0 * cols, 3.8 * nrows), squeeze=False)
    rows = list(dict.fromkeys(row for row, _ in runs))
    last = max((df["step"].max() for df in runs.values() if len(df)), default=0)
    for ax, (metric, label) in zip(axes.ravel(), shown_metrics):
        if metric == "lr":
            _schedules(ax, runs, rows)
        else:
            _per_row(ax, runs, rows, metric, last)
        if metric == "val/ppl":
            for f in points:
                ax.axvline(f * (last + 1) - 1, color="gray", linestyle=":", linewidth=0.8)
            if points:
                label += "; dotted: the stability rule's points"
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    for ax in axes.ravel()[len(shown_metrics) :]:
        ax.set_visible(False)
    note = f" (capped by --max-steps: {'; '.join(capped[:4])}{' ...' if len(capped) > 4 else ''})" if capped else ""
    fig.suptitle(f"{title}{note}\nlines: each row's mean over its seeds; bands: their range", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def _per_row(ax, runs, rows, metric, last) -> None:
    """Each row's mean over its seeds at every logged step, and the seeds' range as a band."""
    tail = []
    shown = False
    for row in rows:
        parts = [df[["step", metric]].dropna() for (r, _s), df in runs.items() if r == row and metric in df]
        parts = [p.set_index("step")[metric] for p in parts if len(p)]
        if not parts:
            continue
        frame = pd.concat(parts, axis=1).sort_index()
        if metric == "val/ppl":
            frame = frame[frame.index >= last / 2]
        frame = frame.dropna(how="all")
        if frame.empty:
            continue
        mean, low, high = frame.mean(axis=1), frame.min(axis=1), frame.max(axis=1)
        if metric == "train/loss" and len(frame) > 40:  # per-batch losses: a running mean of 20 logged steps
            mean, low, high = (x.rolling(20, min_periods=1).mean() for x in (mean, low, high))
        color = f"C{rows.index(row) % 10}"
        ax.plot(mean.index, mean.values, color=color, linewidth=1.0, label=f"{row} ({frame.shape[1]})")
        if frame.shape[1] > 1:
            ax.fill_between(mean.index, low.values, high.values, color=color, alpha=0.2, linewidth=0)
        if metric == "val/ppl":
            tail += list(low) + list(high)
        shown = True
    if not shown:
        _no_data(ax, f"{metric} not in these runs' logs")
        return
    if tail:
        lo, hi = min(tail), max(tail)
        pad = 0.05 * (hi - lo or hi)
        ax.set_ylim(lo - pad, hi + pad)
    ax.legend(fontsize=6, ncol=2, title="row (seeds)", title_fontsize=6)


def _schedules(ax, runs, rows) -> None:
    """One line per distinct learning-rate schedule, labelled with every row that follows it."""
    schedules: dict[tuple, list[str]] = {}
    curves = {}
    for (row, _seed), df in runs.items():
        part = df[["step", "lr"]].dropna() if "lr" in df else pd.DataFrame()
        if part.empty:
            continue
        key = tuple(part["lr"].round(12))
        names = schedules.setdefault(key, [])
        if row not in names:
            names.append(row)
        curves[key] = part
    if not schedules:
        _no_data(ax, "lr not in these runs' logs")
        return
    for key, names in schedules.items():
        ax.plot(
            curves[key]["step"],
            curves[key]["lr"],
            color=f"C{rows.index(names[0]) % 10}",
            linewidth=1.0,
            label=", ".join(names) if len(schedules) > 1 else f"every row ({', '.join(names)})",
        )
    ax.legend(fontsize=6)
