"""The report's PNG plots (matplotlib, Agg), each saved atomically."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from aiayn.common.files import atomic_open  # noqa: E402


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
            part["params_m"], part["bleu"], yerr=part["bleu_std"].fillna(0), fmt="o", capsize=3,
            color=_color(group, groups), label=group,
        )  # fmt: skip
        for _, r in part.iterrows():
            ax.annotate(r["row"], (r["params_m"], r["bleu"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if df.empty:
        _no_data(ax, "no completed runs yet")
    else:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
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
            ax.scatter(part[paper], part[ours], color=color, label=group, zorder=3,
                       facecolors=[color if f else "none" for f in filled])  # fmt: skip
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


def curves(runs: dict[tuple[str, int], pd.DataFrame], path: Path, title: str) -> Path:
    """Training loss, learning rate, dev PPL and dev BLEU against step: one panel each, one line per run (row and
    seed; a row's seeds share its colour), so the spread between seeds is seen beside the differences between rows."""
    metrics = (("train/loss", "training loss (label-smoothed, per token)", False),
               ("lr", "learning rate", False), ("val/ppl", "dev PPL (whole dev set)", True),
               ("val/bleu", "dev BLEU (validation subset)", False))  # fmt: skip
    fig, axes = plt.subplots(2, 2, figsize=(11.0, 7.6))
    rows = list(dict.fromkeys(row for row, _ in runs))
    for ax, (metric, label, log_y) in zip(axes.ravel(), metrics):
        shown = set()
        for (row, _seed), df in runs.items():
            part = df[["step", metric]].dropna() if metric in df else pd.DataFrame()
            if part.empty:
                continue
            ax.plot(part["step"], part[metric], color=f"C{rows.index(row) % 10}", linewidth=0.9, alpha=0.8,
                    label=row if row not in shown else "_")  # fmt: skip
            shown.add(row)
        if not shown:
            # val/bleu is absent where the preset decodes no validation subset during training (val_bleu_sentences 0)
            _no_data(ax, f"{metric} not in these runs' logs")
        else:
            if log_y:
                ax.set_yscale("log")
            ax.legend(fontsize=6, ncol=2)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, path)
