"""The report's PNG plots (matplotlib, Agg), each saved atomically."""

from __future__ import annotations

from pathlib import Path

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


def delta_vs_paper(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Our Δ vs base against the paper's, Δ PPL (%) and Δ BLEU side by side, with the diagonal (perfect
    agreement); the rows of the pre-registered scored set are filled, the others hollow."""
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 5.0))
    groups = list(dict.fromkeys(table["group"]))
    scored = table["predicted"].isin(("worse", "better"))
    for ax, (ours, paper, what) in zip(
        axes, (("delta_ppl_pct", "paper_delta_ppl_pct", "Δ PPL (%)"), ("delta_bleu", "paper_delta_bleu", "Δ BLEU"))
    ):
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
        if df.empty:
            _no_data(ax, "no rows with both deltas yet")
            lim = 1.0
        else:
            lim = 1.1 * max(1e-3, df[paper].abs().max(), df[ours].abs().max())
            ax.legend(fontsize=8, title="group (filled: scored)", title_fontsize=8)
        ax.plot([-lim, lim], [-lim, lim], color="gray", linestyle="--", linewidth=1, label="_diagonal")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.axvline(0, color="black", linewidth=0.5)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_xlabel(f"paper: {what} vs base")
        ax.set_ylabel(f"ours: {what} vs base")
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, path)


def forest(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Every row's Δ dev PPL against base (percent, mean over seeds) with its 95% Welch interval, the paper's Δ as a
    cross, and the equivalence band of the rows registered as equivalent: the differences at a glance, with their
    uncertainty."""
    df = table[(table["row"] != "base") & table["delta_ppl_pct"].notna()].iloc[::-1]
    fig, ax = plt.subplots(figsize=(7.2, 0.9 + 0.32 * max(len(df), 1)))
    if df.empty:
        _no_data(ax, "no row with a completed run beside base's")
    else:
        y = range(len(df))
        scored = df["predicted"].isin(("worse", "better", "equivalent")).to_numpy()
        low = (df["delta_ppl_pct"] - df["delta_ppl_ci_low"]).fillna(0).clip(lower=0)
        high = (df["delta_ppl_ci_high"] - df["delta_ppl_pct"]).fillna(0).clip(lower=0)
        for i, (x, lo, hi, filled) in enumerate(zip(df["delta_ppl_pct"], low, high, scored)):
            ax.errorbar(
                x,
                i,
                xerr=[[lo], [hi]],
                fmt="o",
                color="C0",
                capsize=3,
                markerfacecolor="C0" if filled else "white",
                zorder=3,
            )
        ax.scatter(df["paper_delta_ppl_pct"], list(y), marker="x", color="C3", label="the paper's Δ", zorder=4)
        labelled = False  # each equivalence's band on its own line, around its registered center (0: base)
        for i, (m, c) in enumerate(zip(df["margin_pct"], df.get("center_pct", pd.Series(0.0, index=df.index)))):
            if pd.isna(m):
                continue
            c = 0.0 if pd.isna(c) else float(c)
            ax.fill_betweenx(
                [i - 0.4, i + 0.4],
                c - m,
                c + m,
                color="C2",
                alpha=0.2,
                linewidth=0,
                label=None if labelled else "equivalence band",
            )
            labelled = True
        ax.set_yticks(list(y))
        ax.set_yticklabels([f"{r} ({v})" if v else r for r, v in zip(df["row"], df["verdict"])], fontsize=7)
        ax.legend(fontsize=7, loc="best")
    ax.axvline(0, color="black", linewidth=0.6)
    intervals = table["delta_ppl_ci_low"].notna().any()
    bars = "; bars: 95% interval over seeds" if intervals else "; one seed a side: no interval"
    ax.set_xlabel(f"Δ dev PPL against base, % (filled: scored{bars})")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    return save_png(fig, path)


def curves(
    runs: dict[tuple[str, int], pd.DataFrame],
    path: Path,
    title: str,
    capped: list[str] = (),
    points: tuple[float, ...] = (),
) -> Path:
    """Training loss, learning rate, dev PPL and, where the runs logged it, dev BLEU against step: one panel each,
    only the panels with data, one line per run (row and seed; a row's seeds share its colour), so the spread between
    seeds is seen beside the differences between rows. The learning rate is drawn once per distinct schedule (rows
    that share one are named together). Dev PPL is on a linear scale zoomed to the second half of training, where the
    final differences are, with the stability rule's `points` (fractions of the last step) marked; runs cut short by
    --max-steps are named in the title."""
    metrics = [
        ("train/loss", "training loss (label-smoothed, per token)"),
        ("lr", "learning rate"),
        ("val/ppl", "dev PPL (whole dev set), second half of training"),
        ("val/bleu", "dev BLEU (validation subset)"),
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
            _per_run(ax, runs, rows, metric, last)
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
    fig.suptitle(title + note, fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def _per_run(ax, runs, rows, metric, last) -> None:
    shown, tail = set(), []
    for (row, _seed), df in runs.items():
        part = df[["step", metric]].dropna() if metric in df else pd.DataFrame()
        if metric == "val/ppl" and len(part):
            part = part[part["step"] >= last / 2]
            tail += list(part[metric])
        if part.empty:
            continue
        ax.plot(
            part["step"],
            part[metric],
            color=f"C{rows.index(row) % 10}",
            linewidth=0.9,
            alpha=0.8,
            label=row if row not in shown else "_",
        )
        shown.add(row)
    if not shown:
        _no_data(ax, f"{metric} not in these runs' logs")
        return
    if tail:
        lo, hi = min(tail), max(tail)
        pad = 0.05 * (hi - lo or hi)
        ax.set_ylim(lo - pad, hi + pad)
    ax.legend(fontsize=6, ncol=2)


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
