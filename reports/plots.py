"""The report's PNG plots (matplotlib, Agg), each saved atomically."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from aiayn.common.files import atomic_open  # noqa: E402

GROUP_ORDER = ("base", "A", "B", "C", "D", "E", "big", "extended")


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


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes, color="gray")


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
        _no_data(ax, "completed runs")
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
    """Our Δ BLEU vs base against the paper's, with the diagonal (perfect agreement)."""
    fig, ax = plt.subplots(figsize=(5.6, 5.2))
    df = table.dropna(subset=["delta_bleu", "paper_delta_bleu"])
    groups = list(dict.fromkeys(table["group"]))
    for group, part in df.groupby("group", sort=False):
        ax.scatter(part["paper_delta_bleu"], part["delta_bleu"], color=_color(group, groups), label=group, zorder=3)
        for _, r in part.iterrows():
            xy = (r["paper_delta_bleu"], r["delta_bleu"])
            ax.annotate(r["row"], xy, textcoords="offset points", xytext=(4, 4), fontsize=8)
    if df.empty:
        _no_data(ax, "rows with both deltas")
        lim = 1.0
    else:
        lim = 1.1 * max(1e-3, df["paper_delta_bleu"].abs().max(), df["delta_bleu"].abs().max())
        ax.legend(fontsize=8, title="group", title_fontsize=8)
    ax.plot([-lim, lim], [-lim, lim], color="gray", linestyle="--", linewidth=1, label="_diagonal")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.axvline(0, color="black", linewidth=0.5)
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_xlabel("paper: Δ BLEU vs base")
    ax.set_ylabel("ours: Δ BLEU vs base")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return save_png(fig, path)


def val_curves(curves: dict[str, tuple[str, pd.DataFrame]], path: Path, title: str) -> Path:
    """val/bleu against step, one subplot per group, one line per row (`curves`: row -> (group, frame))."""
    groups = list(dict.fromkeys(g for g, df in curves.values() if not df.empty))
    groups.sort(key=lambda g: GROUP_ORDER.index(g) if g in GROUP_ORDER else len(GROUP_ORDER))
    n = max(1, len(groups))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    flat = axes.ravel()
    for ax, group in zip(flat, groups):
        for row, (g, df) in curves.items():
            if g == group and not df.empty:
                ax.plot(df["step"], df["val/bleu"], marker=".", label=row)
        ax.set_title(f"group {group}", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("val/bleu")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if not groups:
        _no_data(flat[0], "validation curves")
    for ax in flat[len(groups) :] if groups else flat[1:]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, path)
