"""The report's tables for people: the display columns (`display`, `display_wide`, `key`) and the Markdown, HTML and
LaTeX pages around them. Built by reports/build.py; the notes' prose is reports/notes.py."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

import pandas as pd

from aiayn.ablations.knobs import KNOBS, MODEL_KEYS
from aiayn.ablations.predictions import (
    SCORED,
)
from aiayn.reports import stats


def _pm(mean, std, fmt: str) -> str:
    if pd.isna(mean):
        return ""
    return f"{mean:{fmt}}" if pd.isna(std) else f"{mean:{fmt}} ± {std:{fmt}}"


def _text(x) -> str:
    return "" if x is None or (not isinstance(x, str) and pd.isna(x)) else str(x)


def fmt_number(x, fmt: str) -> str:
    if x is None or pd.isna(x):
        return ""
    return f"{int(x) if fmt == 'd' else x:{fmt}}"  # an Int64 column with a blank maps its integers as floats


def fmt_p(x) -> str:
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
            "params ×10⁶": table["params_m"].map(lambda x: fmt_number(x, ".2f")),
            "paper PPL": table["paper_ppl"].map(lambda x: fmt_number(x, ".2f")),
            "paper BLEU": table["paper_bleu"].map(lambda x: fmt_number(x, ".1f")),
            "paper params ×10⁶": table["paper_params_m"].map(lambda x: fmt_number(x, "g")),
            _delta_header(table): _delta_ci(table),
            "paper Δ PPL %": table["paper_delta_ppl_pct"].map(lambda x: fmt_number(x, "+.1f")),
            "Δ BLEU": table["delta_bleu"].map(lambda x: fmt_number(x, "+.2f")),
            "paper Δ BLEU": table["paper_delta_bleu"].map(lambda x: fmt_number(x, "+.1f")),
            "scored on": table["metric"].map(lambda m: {"ppl": "PPL", "bleu": "BLEU"}.get(m, "")),
            "predicted": table["predicted"],
            "margin %": table["margin_pct"].map(lambda x: fmt_number(x, ".2f")),
            "p (Holm)": table["p_holm"].map(fmt_p),
            "verdict": table["verdict"],
            "last-quarter fall %": table["last_drop"].map(lambda x: fmt_number(100 * x if pd.notna(x) else x, ".1f")),
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
        value = (
            ("pre-LN" if mine else "post-LN")
            if k == "norm_first"
            else f"{mine:g}"
            if isinstance(mine, float)
            else str(mine)
        )
        out.append(value if k == "norm_first" else f"{k} {value}")
    return ", ".join(out)


def delta_ci(d, lo, hi) -> str:
    """A Δ PPL % with its 95% interval where there is one: "+3.9 [+1.1, +6.7]", "+3.9", or "" for none."""
    if pd.isna(d):
        return ""
    return f"{d:+.1f}" if pd.isna(lo) else f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def _delta_ci(table: pd.DataFrame) -> list[str]:
    return [
        delta_ci(d, lo, hi)
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
            "params ×10⁶": table["params_m"].map(lambda x: fmt_number(x, ".2f")),
            _delta_header(table): _delta_ci(table),
            "paper Δ PPL %": table["paper_delta_ppl_pct"].map(lambda x: fmt_number(x, "+.1f")),
            "Δ BLEU": table["delta_bleu"].map(lambda x: fmt_number(x, "+.2f")),
            "paper Δ BLEU": table["paper_delta_bleu"].map(lambda x: fmt_number(x, "+.1f")),
            "predicted": table["predicted"],
            "verdict": table["verdict"],
        }
    )


def _table_heading(page: Page) -> str:
    """The table's heading: stage 1's where later stages follow it (each decides its own tests on its own seeds)."""
    return "The table: stage 1 (each later stage's below, on its own seeds)" if page.stages else "The table"


def key(table: pd.DataFrame, alpha: float = stats.ALPHA) -> str:
    """What the table's verdicts and columns mean, printed under every table."""
    single = table["n"].fillna(0).astype(int).le(1) & table["predicted"].isin(SCORED)
    return (
        f"**Key.** Only the Δ columns compare with the paper's: our corpus and scale are not WMT14's, so absolute PPL "
        f"and BLEU do not (the paper's are in the CSV and the HTML's wide table). A test **passes** when it is "
        f"`{stats.SIGNIFICANT_AGREE}` (Holm-adjusted Welch p < {alpha:.3g} over seeds, in the predicted direction) "
        f"or `{stats.EQUIVALENT}` where equivalence is the prediction (TOST within the registered margin, with a row "
        f"of its own knob in the same table significantly different), at each of the validations nearest 75% and 87.5% "
        f"of the budget and at its end. `{stats.NOT_STABLE}`: passed at the end but not at an earlier point, a miss. "
        f"`{stats.AGREE}`: the predicted sign at every point, without significance"
        + (" (one seed a side: a sign, not a test)" if single.any() else "")
        + f". `{stats.DISAGREE}` / `{stats.SIGNIFICANT_DISAGREE}`: the opposite sign. `{stats.NOT_EQUIVALENT}`: an "
        f"equivalence whose {stats.tost_level(alpha)} interval (TOST's) lies wholly outside its margin. "
        f"`{stats.INCONCLUSIVE}`: neither shown (a sign that changes between the points among them). "
        "A difference predicted with an equivalence arm (a later "
        f"stage's) that comes out `{stats.EQUIVALENT}` is a decided miss: the predicted difference ruled out; one that "
        f"shows neither arm at the end is `{stats.INCONCLUSIVE}`, whatever its sign. "
        f"`{stats.CHECK_PASSED}`: label smoothing's arithmetic floor, an implementation check, not a finding. "
        f"`{stats.NOT_SCORED}` / `{stats.NOT_TESTABLE}`: as registered, each with its reason in the notes."
        + (
            f" `{stats.NOT_RUN}`: scored by the registration, but no run of it is among these runs (not in the score)."
            if (table["verdict"] == stats.NOT_RUN).any()
            else ""
        )
    )


@dataclass(frozen=True)
class Page:
    """One report as every renderer lays it out: what it found first, then the figures, the table with its key and
    any later stage's table, then how it was judged and the notes."""

    title: str
    notice: str
    table: pd.DataFrame
    notes: list
    lead: str = ""  # a look's warning (capped runs: no findings)
    findings: object = None  # reports.findings.Findings, or None (no verdict)
    stages: list = field(default_factory=list)  # (heading, its table) of each later stage with runs
    alpha: float = stats.ALPHA


LEFT = {"group", "row", "differs from base", "PE", "LN", "scored on", "predicted", "verdict", "boot."}


def _md_table(table: pd.DataFrame) -> str:
    df = display(table)
    align = ["left" if c in LEFT else "right" for c in df.columns]
    return df.to_markdown(index=False, disable_numparse=True, colalign=align)


def markdown(page: Page, plot_links) -> str:
    lines = [page.notice, "", f"# {page.title}", ""]
    if page.findings is not None:
        lines += ["**What the table shows**, family by family (the verdict each test was decided by):", ""]
        lines += [f"- {line}" for line in page.findings.families]
        lines += ["", page.findings.predictors, ""]
    elif page.lead:
        lines += [page.lead, ""]
    lines += ["## Figures", ""]
    lines += [f"![{alt}]({path})" for path, alt in plot_links]
    lines += ["", f"## {_table_heading(page)}", "", _md_table(page.table), "", key(page.table, page.alpha), ""]
    for heading, table in page.stages:
        lines += [f"### {heading}", "", _md_table(table), ""]
    lines += ["## Notes", ""]
    for text, items in page.notes:
        lines.append(f"- {text}")
        lines += [f"  - {item}" for item in items]
    return "\n".join(lines) + "\n"


def _html_text(text: str) -> str:
    text = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text, quote=False))
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


# the verdicts' colours in the HTML: passes green, a sign without a test pale green, misses red, the rest grey
VERDICT_COLOURS = {
    stats.SIGNIFICANT_AGREE: "#c8e6c9",
    stats.EQUIVALENT: "#c8e6c9",
    stats.AGREE: "#e8f5e9",
    stats.NOT_STABLE: "#ffe0b2",
    stats.DISAGREE: "#ffcdd2",
    stats.SIGNIFICANT_DISAGREE: "#ef9a9a",
    stats.NOT_EQUIVALENT: "#ef9a9a",
    stats.INCONCLUSIVE: "#eeeeee",
    stats.EQUIVALENT_UNASSAYED: "#eeeeee",
    stats.NOT_RUN: "#eeeeee",
    stats.CHECK_PASSED: "#e3f2fd",
    stats.CHECK_FAILED: "#ef9a9a",
}


def _styled(df: pd.DataFrame, name: str) -> str:
    """A table as HTML through pandas' Styler: verdict cells coloured, numbers right-aligned, no index. Its element
    ids carry `name`, unique on the page, not the random id Styler draws: the same runs give the same page."""
    styler = df.style.hide(axis="index").set_table_attributes('class="table3"').set_uuid(name)
    if "verdict" in df:
        styler = styler.map(
            lambda v: f"background-color: {VERDICT_COLOURS[v]}" if v in VERDICT_COLOURS else "", subset=["verdict"]
        )
    left = [c for c in df.columns if c in LEFT]
    if left:
        styler = styler.set_properties(subset=left, **{"text-align": "left"})
    return styler.to_html(escape="html")


def html_page(page: Page, plot_links) -> str:
    """The report as one page that a reader opens first: what it found on the first screen, then the figures, then
    the tables (each in a box of its own that scrolls sideways: nothing runs off the page), then the notes."""
    parts = []
    if page.findings is not None:
        items = "".join(f"<li>{_html_text(line)}</li>" for line in page.findings.families)
        parts.append(
            '<section class="findings"><p><strong>What the table shows</strong>, family by family (the verdict each '
            f"test was decided by):</p><ul>{items}</ul><p>{_html_text(page.findings.predictors)}</p></section>"
        )
    elif page.lead:
        parts.append(f'<p class="lead">{_html_text(page.lead)}</p>')
    figures = "\n".join(
        f'<figure><img src="{html.escape(path)}" alt="{html.escape(alt)}"><figcaption>{html.escape(alt)}</figcaption>'
        "</figure>"
        for path, alt in plot_links
    )
    parts.append(f'<section class="figures">{figures}</section>')
    heading = html.escape(_table_heading(page))
    parts.append(f'<h2>{heading}</h2>\n<div class="scroll">{_styled(display(page.table), "table")}</div>')
    parts.append(f'<p class="key">{_html_text(key(page.table, page.alpha))}</p>')
    for i, (heading, table) in enumerate(page.stages):
        parts.append(
            f'<h3>{html.escape(heading)}</h3>\n<div class="scroll">{_styled(display(table), f"stage{i}")}</div>'
        )
    parts.append(f'<h2>Every column</h2>\n<div class="scroll">{_styled(display_wide(page.table), "wide")}</div>')
    items = []
    for text, sub in page.notes:
        inner = "".join(f"<li>{_html_text(s)}</li>" for s in sub)
        items.append(f"<li>{_html_text(text)}" + (f"<ul>{inner}</ul>" if inner else "") + "</li>")
    parts.append("<h2>Notes</h2>\n<ul>\n" + "\n".join(items) + "\n</ul>")
    style = (
        "body{font-family:sans-serif;margin:1em 2em;max-width:1400px}h1{font-size:1.5em;margin:0.3em 0}"
        "section.findings{font-size:14px;line-height:1.35}section.findings ul{margin:0.3em 0;padding-left:1.3em}"
        "section.findings p{margin:0.3em 0}table.table3{border-collapse:collapse;font-size:13px}"
        ".table3 td,.table3 th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}"
        "div.scroll{overflow-x:auto;max-width:100%}p.key{font-size:13px;max-width:1100px}"
        "section.figures{display:flex;flex-wrap:wrap;gap:0.5em}figure{margin:0;flex:1 1 600px;max-width:100%}"
        "figure:first-child{flex-basis:100%}"
        "figure img{max-width:100%}figcaption{font-size:12px;color:#444}p.notice{font-size:11px;color:#666;margin:0}"
        "li{overflow-wrap:anywhere}"
    )
    return (
        f'<!-- {html.escape(page.notice)} -->\n<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(page.title)}</title><style>{style}</style></head>\n<body>\n"
        f'<p class="notice"><em>{_html_text(page.notice)}</em></p>\n<h1>{html.escape(page.title)}</h1>\n'
        + "\n".join(parts)
        + "\n</body></html>\n"
    )


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "|": r"\textbar{}",
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "≥": r"$\geq$",
    "ε": r"$\varepsilon$",
    "×": r"$\times$",
    "−": "--",
    "⁶": r"$^6$",
    "–": "--",
}


def tex_escape(text: str) -> str:
    return "".join(_TEX_SPECIAL.get(c, c) for c in str(text))


def _tex_text(text: str) -> str:
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)  # the key's bold lead: plain in LaTeX
    parts = re.split(r"`([^`]*)`", text)
    return "".join(tex_escape(p) if i % 2 == 0 else r"\texttt{" + tex_escape(p) + "}" for i, p in enumerate(parts))


# the knobs' own LaTeX headers (ablations/knobs.py), for the columns named by the knob
TEX_HEADERS = {k: KNOBS[k].tex for k in MODEL_KEYS if KNOBS[k].tex.startswith("$")}


def latex(page: Page) -> str:
    """A `table` float (needs booktabs) with what the table found and the notes under the tabular; \\midrule between
    groups."""
    table = page.table
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
    first = []
    if page.findings is not None:
        first = [r"\item " + _tex_text(line) for line in page.findings.families]
        first.append(r"\item " + _tex_text(page.findings.predictors))
    elif page.lead:
        first = [r"\item " + _tex_text(page.lead)]
    notes_tex = first + [r"\item " + _tex_text(key(table, page.alpha))]
    for text, sub in page.notes:
        notes_tex.append(r"\item " + _tex_text(text))
        if sub:
            notes_tex += [r"\begin{itemize}"] + [r"\item " + _tex_text(s) for s in sub] + [r"\end{itemize}"]
    return (
        "\n".join(
            [
                f"% {page.notice}",
                "% needs \\usepackage{booktabs}",
                r"\begin{table}[t]",
                r"\centering\scriptsize",
                r"\caption{" + tex_escape(page.title) + "}",
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
