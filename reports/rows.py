"""`aiayn rows`: the Table 3 rows resolved at a preset, before anything trains: their knobs, steps and parameter
counts beside the paper's numbers, as records (JSON) or a table for reading."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from aiayn.ablations.knobs import MODEL_KEYS
from aiayn.ablations.presets import Preset, get_preset
from aiayn.ablations.table import RowChoice
from aiayn.common.options import option
from aiayn.lightning_modules.run.spec import resolve


@dataclass
class RowsOptions:
    """`aiayn rows`: which rows, resolved at which preset, printed how."""

    select: RowChoice = field(default_factory=RowChoice)
    preset: str = option("paper")
    """the scale whose rule resolves the rows (`aiayn train --help` lists the presets)"""
    format: str = option("table", choices=("table", "json"))
    """a table for reading or JSON"""


def show_rows(opts: RowsOptions) -> str:
    """What `aiayn rows` prints: the selected rows' records as JSON, or the table to read."""
    preset = get_preset(opts.preset)
    records = rows_records(opts.select, preset)
    return json.dumps(records, indent=2) if opts.format == "json" else rows_text(records, preset)


def rows_records(choice: RowChoice, preset: Preset) -> list:
    """One record per chosen row, resolved at `preset`."""
    records = []
    for name in choice.names():
        s = resolve(name, preset, tables=choice.table)
        records.append(
            {
                "row": s.row,
                "group": s.group,
                **{k if k != "P_drop" else "p_drop": getattr(s.model, k) for k in MODEL_KEYS},
                "train_steps": s.train_steps,
                "params": s.model.params(),
                "paper_ppl": s.paper.ppl,
                "paper_bleu": s.paper.bleu,
                "paper_params_m": s.paper.params_m,
                "note": s.note,
                "preset": preset.name,
                "corpus": s.corpus.name,
                "vocab_size": s.model.vocab_size,
            }
        )
    return records


def rows_text(records: list, preset: Preset) -> str:
    """The records as a table to read: the preset and its rule, then a row a line (parameters in millions; the note
    column only where a row has one)."""
    import pandas as pd

    df = pd.DataFrame(records).drop(columns=["preset", "corpus", "vocab_size"])
    df["params"] = (df["params"] / 1e6).map("{:.1f}M".format)
    if not df["note"].any():
        df = df.drop(columns=["note"])
    return "\n".join(
        [f"preset {preset.name}: {preset.description}", f"rule: {preset.rule()}", df.to_string(index=False, na_rep="")]
    )
