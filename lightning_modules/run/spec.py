"""What one run is, resolved once: `resolve(row, preset, ...)` gives a frozen `RunSpec`, which the driver (the
command line, a sweep) computes and hands to the run, and which the run's config.json records.

A spec holds the row at the preset's scale (`knobs`, ablations/presets.py's rule), the `--set` values given on
top (`overrides`), the resulting model config (`model`), the schedule, the paper's numbers for the row, and the
ways the run leaves the paper (`deviations`, structured: each has a kind and its text). Torch is not imported.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING

from aiayn.ablations.knobs import KNOBS, MODEL_KEYS, PAPER_BASE, SCHEDULE_KEYS, format_overrides
from aiayn.ablations.presets import Preset, get_preset, scale
from aiayn.ablations.table import get_row, load_rows
from aiayn.common.errors import UserError
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.transformer.config import PE_KINDS, TransformerConfig

if TYPE_CHECKING:  # the options of `aiayn train`, which are above this module
    from aiayn.lightning_modules.run.options import ConfigFile, TrainOptions

log = logging.getLogger(__name__)

MIN_MODEL_MAX_LEN = 512  # positions the model covers at least (dev and test sentences are longer than training's)


@dataclass(frozen=True)
class Schedule:
    """The paper's learning-rate schedule (§5.3) with its warmup, times `lr_factor`."""

    warmup: int
    lr_factor: float


@dataclass(frozen=True)
class Paper:
    """The paper's dev numbers for the row (Table 3); None where it has none."""

    ppl: float | None
    bleu: float | None
    params_m: float | None


@dataclass(frozen=True)
class Deviation:
    """One way a run leaves the paper's recipe: `kind` is "norm_first", "pe" or "override"; `text` says it."""

    kind: str
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class RunSpec:
    row: str
    group: str
    preset: Preset
    corpus: CorpusRef  # parsed once, with its --hf-splits (config.json records its name)
    knobs: dict  # the row at the preset's scale (model knobs and train_steps), before --set
    overrides: dict = field(default_factory=dict)  # the --set values, as given
    model: TransformerConfig = None  # knobs + overrides + vocabulary: what the model is built from
    train_steps: int = 0
    schedule: Schedule = None
    paper: Paper = None
    deviations: tuple[Deviation, ...] = ()
    note: str = ""

    def cost(self) -> float:
        """A run's relative cost, for ordering a sweep's queue: its steps × its parameters (a proxy for FLOPs)."""
        return float(self.train_steps * self.model.params())

    def with_overrides(self, extra: dict) -> RunSpec:
        """The same row with more `--set` values (later ones win)."""
        return _build(
            self.row,
            self.group,
            self.note,
            self.preset,
            self.corpus,
            self.knobs,
            {**self.overrides, **extra},
            self.paper,
            self.model.vocab_size,
        )

    def to_dict(self) -> dict:
        return {
            "row": self.row,
            "group": self.group,
            "note": self.note,
            "preset": asdict(self.preset),
            "corpus": self.corpus.name,
            "knobs": dict(self.knobs),
            "overrides": dict(self.overrides),
            "model": self.model.to_dict(),
            "train_steps": self.train_steps,
            "schedule": asdict(self.schedule),
            "paper": asdict(self.paper),
            "deviations": [asdict(d) for d in self.deviations],
            **({"splits": self.corpus.splits} if self.corpus.splits else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        """A spec as config.json recorded it: the run is rebuilt as it was resolved then, whatever the table or
        the preset say now."""
        names = {f.name for f in fields(Preset)}
        preset = Preset(**{k: v for k, v in d["preset"].items() if k in names})
        preset = replace(preset, aliases=tuple(tuple(a) for a in preset.aliases), cells=tuple(preset.cells))
        knobs = {**PAPER_BASE, **d["knobs"]}  # a knob added since the file was written: the paper's value
        corpus = CorpusRef.recorded(d["corpus"], d.get("splits"))  # a corpus since removed: the run still reads
        spec = _build(
            d["row"],
            d["group"],
            d.get("note", ""),
            preset,
            corpus,
            knobs,
            d["overrides"],
            Paper(**d["paper"]),
            d["model"]["vocab_size"],
        )
        # the file's model is derived from its knobs and overrides; one edited by hand (or by another aiayn) that no
        # longer follows from them is refused rather than silently replaced by what they give
        built = spec.model.to_dict()
        differ = sorted(k for k, v in d["model"].items() if k in built and built[k] != v)
        if differ:
            k = differ[0]
            raise ValueError(
                f"its model's {k} is {d['model'][k]!r} where its knobs and overrides give {built[k]!r}; "
                "change a model value through overrides (--set), not the model section"
            )
        return spec


def run_corpus(data: str | None, preset: Preset, splits: str | None = None) -> CorpusRef:
    """The corpus a run trains on, parsed once for every layer: `--data`'s (hf:./local made an absolute path, the
    spelling each run records), or the preset's; `splits`: --hf-splits."""
    return CorpusRef.parse(data or preset.corpus, splits)


def resolve(
    row: str,
    preset: str | Preset,
    *,
    tables: tuple[str, ...] = (),
    overrides: dict | None = None,
    corpus: CorpusRef | None = None,
    vocab_size: int | None = None,
) -> RunSpec:
    """The run of `row` at `preset` (`tables`: the user's own table files, where the row may be; `overrides`:
    `--set` values; `corpus` and `vocab_size` when not the preset's). Impossible values are one-line UserErrors."""
    preset = preset if isinstance(preset, Preset) else get_preset(preset)
    r = get_row(row, tables)
    paper = Paper(r.paper_ppl, r.paper_bleu, r.paper_params_m)
    corpus = corpus or run_corpus(None, preset)
    knobs = scale(r, preset)
    if tables and r.row not in load_rows():
        _say_scaled(r, knobs, preset)
    return _build(
        r.row, r.group, r.note, preset, corpus, knobs, dict(overrides or {}), paper, vocab_size or preset.vocab_size
    )


def _say_scaled(row, knobs: dict, preset: Preset) -> None:
    """A row of the user's own table is written in the paper's units, and its preset scales it as it scales the
    paper's rows (d_ff 256 at the tiny preset is 64): said once per row and preset, where it changes a cell."""
    changed = [f"{k} {row.knobs[k]} -> {v}" for k, v in knobs.items() if k in row.knobs and row.knobs[k] != v]
    key = (row.row, preset.name, tuple(changed))
    if changed and key not in _SAID:
        _SAID.add(key)
        log.info(
            "row %s (your table) is in the paper's units; preset %s scales it as the paper's rows: %s",
            row.row,
            preset.name,
            ", ".join(changed),
        )


_SAID: set = set()


def _build(row, group, note, preset: Preset, corpus, knobs: dict, overrides: dict, paper, vocab_size) -> RunSpec:
    if not isinstance(corpus, CorpusRef):  # a caller's mistake, not the user's: a corpus is parsed once, before here
        raise TypeError(f"corpus {corpus!r} is not a CorpusRef: parse it once (run_corpus, CorpusRef.parse)")
    unknown = sorted(set(overrides) - set(MODEL_KEYS) - set(SCHEDULE_KEYS))
    if unknown:
        raise UserError(f"--set {unknown[0]}: unknown key; use one of {', '.join((*MODEL_KEYS, *SCHEDULE_KEYS))}")
    model = {k: knobs[k] for k in MODEL_KEYS}
    if {"d_model", "h"} & set(overrides):  # d_k, d_v are d_model/h again, as in the paper, unless set too
        model["d_k"] = model["d_v"] = None
    model.update({k: v for k, v in overrides.items() if k in MODEL_KEYS})
    schedule = Schedule(**{k: overrides.get(k, getattr(preset, k)) for k in SCHEDULE_KEYS})
    for key in SCHEDULE_KEYS:
        if getattr(schedule, key) <= 0:
            raise UserError(f"--set {key}={getattr(schedule, key)}: {key} must be positive; change the --set value")
    try:
        positions = preset.positions or max(preset.max_len, MIN_MODEL_MAX_LEN)
        cfg = TransformerConfig(**model, vocab_size=vocab_size, max_len=positions)
    except ValueError as e:
        if overrides:
            raise UserError(f"{e} (--set {' '.join(format_overrides(overrides))}); change the --set value") from None
        raise UserError(f"{e} (row {row} at preset {preset.name}); fix the row's line in its table") from None
    return RunSpec(
        row=row,
        group=group,
        preset=preset,
        corpus=corpus,
        knobs=dict(knobs),
        overrides=dict(overrides),
        model=cfg,
        train_steps=knobs["train_steps"],
        schedule=schedule,
        paper=paper,
        note=note,
        deviations=_deviations(cfg, overrides),
    )


def _deviations(cfg: TransformerConfig, overrides: dict) -> tuple[Deviation, ...]:
    """Where a run leaves the paper's recipe beyond Table 3's own variations."""
    out = []
    for name in MODEL_KEYS:  # a knob beyond the paper's table, away from the paper's value
        text = KNOBS[name].deviates(getattr(cfg, name))
        if text is not None:
            out.append(Deviation(name, text))
    if not PE_KINDS[cfg.pe].paper:
        paper_pes = " or ".join(k for k, v in PE_KINDS.items() if v.paper)
        out.append(Deviation("pe", f"positional encoding {cfg.pe} (paper: {paper_pes})"))
    if overrides:
        out.append(Deviation("override", "overridden: " + " ".join(format_overrides(overrides))))
    return tuple(out)


def spec_of(opts: TrainOptions) -> RunSpec:
    """The run `opts` (an `aiayn train`'s options) name, resolved: the one call of a driver (`aiayn train`, a sweep,
    a search); `aiayn train --config` of a run's config.json passes that run's own spec instead, so the run is
    reproduced even when its table or preset changed since."""
    preset = get_preset(opts.preset)
    return resolve(
        opts.row,
        preset,
        tables=opts.table,
        overrides=opts.overrides,
        corpus=run_corpus(opts.data, preset, opts.hf_splits),
        vocab_size=opts.vocab_size,
    )


def spec_for(opts: TrainOptions, recorded: ConfigFile | None = None) -> RunSpec:
    """The run `aiayn train` trains, resolved once: from the table (`spec_of`), or, with --config of a run's
    config.json (`recorded`) naming this row and preset, that run's own recorded spec (so the run is reproduced even
    when its table changed since or is not at hand), with the command line's --set on top. A file a sweep's driver
    resolved for this process (`recorded.resolved`) is trained as it is."""
    spec = recorded.spec if recorded is not None else None
    if not spec or spec.get("row") != opts.row or (spec.get("preset") or {}).get("name") != opts.preset:
        return spec_of(opts)
    try:
        run = RunSpec.from_dict(spec)
    except ValueError as e:
        raise UserError(f"--config: the run it records is not one aiayn wrote ({e})") from None
    if opts.hf_splits != run.corpus.splits:  # --hf-splits given now: the recorded dataset, read by those splits
        run = replace(run, corpus=run.corpus.with_splits(opts.hf_splits))
    if recorded.resolved:
        return run
    run = run.with_overrides(opts.overrides)
    try:
        now = resolve(opts.row, opts.preset, tables=opts.table).knobs
    except UserError:
        now = None  # the table is not at hand: the config's row is all there is
    if now is not None and now != run.knobs:
        changed = {k: (run.knobs.get(k), v) for k, v in now.items() if run.knobs.get(k) != v}
        log.warning(
            "row %s of the config file differs from its table now (config, table: %s); training the config file's",
            opts.row,
            changed,
        )
    return run


def changed_since(recorded: RunSpec, tables: tuple[str, ...] = ()) -> list[str]:
    """What the table (and the preset's rule) now resolve differently for a run's row than when it ran: its model
    knobs and its steps, each as "d_model 128 -> 256" ([] when the same, or when the row is no longer in its table).
    `tables`: the user's --table files the run was given (its config.json's options), read as they are now. A
    completed pair keeps its result when its row is edited; this is how status and the report say so."""
    try:
        now = resolve(
            recorded.row,
            recorded.preset.name,
            tables=tuple(tables),
            overrides=recorded.overrides,
            corpus=recorded.corpus,
            vocab_size=recorded.model.vocab_size,
        )
    except UserError:
        return []
    before, after = recorded.model.to_dict(), now.model.to_dict()
    out = [f"{k} {before.get(k)} -> {after[k]}" for k in after if before.get(k) != after[k]]
    if recorded.train_steps != now.train_steps:
        out.append(f"steps {recorded.train_steps} -> {now.train_steps}")
    return out


def sweep_key(preset: str, corpus: CorpusRef) -> str:
    """The one name of a sweep (every row and seed of one preset on one corpus), a file name (hf:wmt/wmt14 has a
    slash; CorpusRef.dirname says how it is spelled): every other name of a sweep is built from it (the tracker's
    experiment, the Optuna study, the sweep's record and its pairs' keys in the books, a report's file names)."""
    return f"{preset}-{corpus.dirname}"


def experiment_name(preset: str, corpus: CorpusRef) -> str:
    """One name for a sweep in every tracker: the MLflow experiment and the W&B project
    (lightning_modules/run/loggers.py, wandb_run.py)."""
    return f"aiayn-{sweep_key(preset, corpus)}"
