"""Presets: Table 3 at a chosen scale, by one rule applied to every row.

Rule: d_model and d_ff × `width`; heads h × `heads` (rounded, at least 1) and the attention's total widths
h·d_k and h·d_v × `width` (so h·d_k = d_model stays true where the paper has it, rows A and base, and row B's
d_k keeps its ratio to base's); depth N × `depth` (rounded, at least 1); P_drop, eps_ls and pe unchanged; every
row trains `train_steps` × (row's paper steps / base's paper steps), so `big` trains 3× as long, as in the
paper. Each row thus keeps its relation to base.

Why heads scale too: at width 1/4 with h unchanged, d_k = 64/4 = 16 for base and 4 for rows A4 and B1, a head
width the paper never ran (its smallest is 16); with h × 1/2 as well, base has 4 heads of 32 and the smallest
d_k is 8 (A4, B1), and every row of group A still has a distinct head count. Where a rule maps two paper rows
to one config (depth 1/3 makes C1's N=2 and C2's N=4 both 1), the preset says so (`aliases`): that config is
trained once, under the first row's name, and the other row is not scored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aiayn.ablations.knobs import KNOBS
from aiayn.ablations.table import Row, load_rows
from aiayn.common.errors import UserError


@dataclass(frozen=True)
class Preset:
    name: str
    corpus: str
    vocab_size: int  # joint SentencePiece BPE vocabulary
    width: float  # factor on d_model, d_ff, h·d_k, h·d_v
    depth: float  # factor on N
    train_steps: int  # optimizer steps for base; other rows scale with the paper's steps
    # real target tokens (EOS included, padding not) per optimizer step, all devices together: the paper's
    # "approximately 25000 source tokens and 25000 target tokens"; the source side comes as the corpus gives it
    tokens_per_step: int
    max_tokens: int  # real target tokens in one batch on one device; accumulation makes up the rest
    warmup: int  # the schedule's warmup_steps (paper: 4000)
    lr_factor: float  # multiplies the paper's schedule (1.0 = the paper)
    val_bleu_sentences: int  # the first K dev sentences beam-decoded for val/bleu at each validation (0: none)
    val_every: int  # optimizer steps between validations
    ckpt_every: int  # optimizer steps between kept checkpoints
    description: str
    # instead of ckpt_every, wall-clock minutes between kept checkpoints (the paper: "written at 10-minute intervals")
    ckpt_every_minutes: float | None = None
    weights_only_checkpoints: bool = False  # periodic checkpoints without Adam's moments (a third of the size)
    sweep_jobs: int = 1  # `aiayn table3` runs this many training processes at once (CPU presets: 2)
    keep_ckpts: int = 20  # enough for the paper's "average the last 5 / last 20"
    max_len: int = 256  # training sentences longer than this (in tokens) are dropped
    # positions the model covers (its positional table: the learned one's size, row E1); None: max(max_len, 512), as
    # dev and test sentences run longer than training's
    positions: int | None = None
    heads: float = 1.0  # factor on h (rounded, >= 1); h·d_k and h·d_v scale with `width`
    train_pairs: int | None = None  # a data-limited regime: the first K training pairs (tokenizer: the whole corpus)
    aliases: tuple[tuple[str, str], ...] = ()  # (row, same config as row) pairs the rule maps together
    # `aiayn table3` without --rows/--seeds: "scored" (the pre-registered rows, ablations/predictions.csv, and base)
    # or None (every paper row); seeds per row and for base (more base seeds: the cheaper way to power the tests)
    rows: str | None = None
    seeds: int = 1
    base_seeds: int | None = None
    # how its report judges a run's convergence (reports/verdicts.py): "endpoints" (two validations near 75% of the
    # steps against the last two) or "line" (a line fitted to every validation of the last quarter); fixed before
    # the runs it judges, as the scored set is
    convergence: str = "endpoints"
    # how its report reads each seed's number at the stability rule's points (reports/verdicts.py READINGS):
    # "nearest" (the one validation nearest the point; 100%: the final evaluation) or "median3" (the median of the
    # three nearest: no point rests on one validation); fixed before the runs it judges, as the scored set is
    stability: str = "nearest"
    # other presets run and scored with this one, as one table of tests (`aiayn table3 --preset evidence` also runs
    # its data-limited cell `tiny-2k`): their pre-registered tests join this preset's Holm family and score
    cells: tuple[str, ...] = ()
    # every row trains train_steps x (its paper steps / base's), so `big` 3x as long, as in the paper (True); or every
    # row, big too, the same train_steps (False: a preset that compares big at base's budget says so in its rule)
    steps_as_paper: bool = True

    def _big_steps(self) -> str:
        return "x3 for big, as in the paper" if self.steps_as_paper else "every row, big too: the paper trained big 3x"

    def rule(self) -> str:
        data = f"the first {self.train_pairs} training pairs of {self.corpus}" if self.train_pairs else self.corpus
        same = "".join(f"; {a} is {b} at this scale" for a, b in self.aliases)
        same += f"; {self.positions} positions" if self.positions else ""
        return (
            f"d_model, d_ff, h·d_k, h·d_v x {self.width:g}; h x {self.heads:g}; N x {self.depth:.3g} (rounded, >= 1); "
            f"P_drop, eps_ls, pe unchanged; {self.train_steps} steps ({self._big_steps()}), warmup "
            f"{self.warmup}; {self.tokens_per_step} real target tokens per step; learning rate x {self.lr_factor:g} "
            f"of the paper's schedule; vocabulary {self.vocab_size}; data: {data}{same}"
        )


_TINY = Preset(
    name="tiny",
    corpus="synthetic",
    vocab_size=1000,
    width=0.25,
    heads=0.5,
    depth=1 / 3,
    aliases=(("C2", "C1"),),
    train_steps=1200,
    tokens_per_step=1024,
    max_tokens=1024,
    warmup=100,
    lr_factor=0.5,
    val_bleu_sentences=0,
    val_every=100,
    ckpt_every=250,
    keep_ckpts=5,
    sweep_jobs=2,
    rows="scored",
    description="the main job: the built-in synthetic corpus (24,000 pairs) on a laptop CPU, quarter width, half "
    "the heads, a third of the depth, 1200 steps (about 4 epochs, past base's knee; the budget chosen by the "
    "convergence rule on two pilot seeds, see BENCHMARKS.md), warmup 100, half the "
    "paper's learning rate (at d_model 128 and warmup 100 the paper's d_model^-0.5 schedule peaks too high for "
    "the post-LN model to learn); the rows of its pre-registered verdict, one seed, two runs at a time",
)

_EVIDENCE = Preset(
    name="evidence",
    corpus="synthetic-20",
    vocab_size=1000,
    width=1 / 16,
    heads=0.5,
    depth=1 / 3,
    aliases=(("C2", "C1"),),
    train_steps=4500,
    tokens_per_step=1024,
    max_tokens=1024,
    warmup=200,
    lr_factor=0.5,
    val_bleu_sentences=0,
    val_every=100,
    ckpt_every=500,
    keep_ckpts=2,
    sweep_jobs=2,
    rows="scored",
    seeds=4,
    base_seeds=8,
    convergence="line",
    cells=(),
    stability="median3",
    steps_as_paper=False,
    description="Table 3 as evidence on 2 CPU cores, in a regime with headroom: a sixteenth of the paper's "
    "width (d_model 32, 4 heads of 8), a third of its depth, on the synthetic grammar's sentences of 5-20 "
    "words (attempt 4's regime R2, its learning rate: half the paper's); every row, big too, trains the same 4500 "
    "steps and is compared at the end, as in the paper, each test held at 75%, 87.5% and 100% of the budget, each "
    "seed read there as the median of its three nearest validations (seeds per row from an earlier run's curves, "
    "BENCHMARKS.md)",
)

# The main job (`aiayn table3`, the README's first line): the evidence regime at a fixed budget, one seed a row,
# the rows of its registration (base, C1, C4 worse, C5 better: a row "every change hurts" cannot pass).
_QUICK = replace(
    _EVIDENCE,
    name="quick",
    train_steps=3000,
    val_every=125,
    seeds=1,
    base_seeds=None,
    cells=(),
    stability="nearest",
    steps_as_paper=True,
    description="the main job: the evidence regime (d_model 32, 4 heads of 8, N 2, sentences of 5-20 words, half the "
    "paper's learning rate) at a fixed budget of 3000 steps, one seed a row, two runs at a time: base, C1 and C4 "
    "(predicted worse) and C5 (d_model 64, predicted better); the budget is the largest that the registered timing "
    "probe projects within 7 minutes on 2 cores (BENCHMARKS.md)",
)
MAIN_PRESET = _QUICK.name  # what `aiayn table3` runs without --preset

# The wide table, registered for one GPU: the paper's width on real language, where capacity no
# longer explains the table. Its budget is the pilot rule's (scripts/wide_pilot.py, committed before any wide run):
# train_steps is the most the rule may choose, and `scripts/gpu-wide.sh` runs the table at the chosen --max-steps.
_WIDE = Preset(
    name="wide",
    corpus="multi30k",
    vocab_size=8000,
    width=1.0,
    heads=1.0,
    depth=0.5,
    train_steps=1600,
    tokens_per_step=8192,
    max_tokens=8192,
    warmup=250,
    lr_factor=0.25,
    val_bleu_sentences=0,
    val_every=50,
    ckpt_every=400,
    keep_ckpts=2,
    max_len=128,
    positions=256,
    sweep_jobs=8,
    rows="scored",
    seeds=4,
    base_seeds=8,
    convergence="line",
    stability="median3",
    steps_as_paper=False,
    description="Table 3 at the paper's width on real language, for one GPU: Multi30k En-De (29,000 pairs, BPE 8000), "
    "d_model 512, d_ff 2048, the paper's heads and d_k (8 of 64; 16 heads of 32 in A3), half its depth (N 3), 8192 "
    "target tokens a step, warmup 250 at a quarter of the schedule's factor (the paper's peak learning rate, 7.0e-4), "
    "a positional table of 256 positions (learned: 0.5% of base's parameters); every row, big too, trains the budget "
    "the pilot rule chose (at most 1600 steps, about 30 epochs), each test held at 75%, 87.5% and 100% of it "
    "(BENCHMARKS.md, 'The wide table')",
)

_LAPTOP = Preset(
    name="laptop",
    corpus="multi30k",
    vocab_size=8000,
    width=0.25,
    heads=0.5,
    depth=1 / 3,
    aliases=(("C2", "C1"),),
    train_steps=7000,
    tokens_per_step=1024,
    max_tokens=1024,
    warmup=200,
    lr_factor=0.5,
    val_bleu_sentences=200,
    val_every=500,
    ckpt_every=250,
    sweep_jobs=2,
    rows="scored",
    seeds=3,
    description="Multi30k En-De on a laptop CPU: the tiny preset's model (d_model 128, 4 heads, N 2) at "
    "8000 BPE vocabulary, 7000 steps (about 20 epochs), warmup 200; one run (then `aiayn eval --average 5`) "
    "in under 30 minutes on 2 cores; "
    "`aiayn table3 --preset laptop`: the real-data check of the dropout and label-smoothing rows, 3 seeds "
    "(the registered real-language table is `real`)",
)

# Table 3 on real language on 2 CPU cores: the laptop model on Multi30k, every family the user named registered
# (ablations/predictions.csv), its seeds chosen from a noise pilot by a rule committed before it was read
# (BENCHMARKS.md, "Table 3 on real language").
_REAL = replace(
    _LAPTOP,
    name="real",
    train_steps=4000,
    # Multi30k's whole dev set (1014 sentences), the final evaluation's: a BLEU test reads the same instrument at
    # every point of the stability rule (stage 1 decoded the first 500 at its validations)
    val_bleu_sentences=1014,
    val_every=1000,
    ckpt_every=500,
    keep_ckpts=2,
    max_len=128,
    positions=128,
    seeds=4,
    base_seeds=8,
    convergence="line",
    steps_as_paper=False,
    description="Table 3 on real language on 2 CPU cores: Multi30k En-De (29,000 pairs, BPE 8000), the laptop model "
    "(d_model 128, 4 heads of 32, N 2, d_ff 512), 4000 steps of 1024 target tokens (about 9 epochs: 450 steps an "
    "epoch) for every row, warmup 200 at half the paper's schedule, a positional table of 128 positions (Multi30k's "
    "longest target is 52 BPE tokens; learned: 0.8% of base's parameters); each test held at 75%, 87.5% and 100% of "
    "the budget, BLEU on the whole dev set (1014 sentences) at every validation, as at the end; seeds per row from a "
    "noise pilot by a rule committed before it was read (BENCHMARKS.md)",
)

PRESETS = {
    p.name: p
    for p in (
        Preset(
            name="paper",
            corpus="wmt14",
            vocab_size=37000,
            width=1.0,
            depth=1.0,
            train_steps=100_000,
            tokens_per_step=25_000,
            max_tokens=25_000,
            warmup=4000,
            lr_factor=1.0,
            val_bleu_sentences=500,
            val_every=5000,
            ckpt_every=1000,
            ckpt_every_minutes=10.0,
            weights_only_checkpoints=True,
            description="the paper: WMT14 En-De, paper sizes, 25k+25k tokens per step, 100k steps (300k big); "
            "checkpoints every 10 minutes, as the paper averaged them, weights only (about 0.25 GB each, not a full "
            "0.76 GB state every 1000 steps: every 30 s on an H100)",
        ),
        Preset(
            name="small",
            corpus="multi30k",
            vocab_size=8000,
            width=0.5,
            depth=0.5,
            train_steps=2000,
            tokens_per_step=4096,
            max_tokens=4096,
            warmup=200,
            lr_factor=1.0,
            val_bleu_sentences=200,
            val_every=200,
            ckpt_every=100,
            description="Multi30k En-De on one GPU: half width, half depth, about 20 epochs of its 29,000 pairs "
            "(the paper trained about 18 over WMT14), warmup 10%",
        ),
        _TINY,
        _EVIDENCE,
        _QUICK,
        _WIDE,
        replace(
            _TINY,
            name="tiny-2k",
            train_pairs=2000,
            seeds=4,
            base_seeds=8,
            train_steps=1300,
            convergence="line",
            description="a data-limited regime, where dropout has overfitting to prevent: the tiny preset on the "
            "first 2,000 training pairs of the synthetic corpus (1300 steps: about 50 epochs; the budget chosen "
            "by the `line` convergence rule on two pilot seeds, see BENCHMARKS.md), 4 seeds each and 8 for base",
        ),
        _LAPTOP,
        _REAL,
    )
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def scale(row: Row, preset: Preset) -> dict:
    """The row's knobs at the preset's scale (the module docstring's rule), each by the factor its knob names
    (ablations/knobs.py)."""
    k, out = row.knobs, dict(row.knobs)
    h = max(1, round(k["h"] * preset.heads))
    paper_base_steps = load_rows()["base"].knobs["train_steps"]
    for name, knob in KNOBS.items():
        if name not in k or knob.scale is None:
            continue
        if knob.scale == "width":
            out[name] = max(1, round(k[name] * preset.width))
        elif knob.scale == "heads":
            out[name] = h
        elif knob.scale == "attention":  # the total width h·d scales as d_model does; each head gets its share
            out[name] = max(1, round(k["h"] * k[name] * preset.width / h))
        elif knob.scale == "depth":
            out[name] = max(1, round(k[name] * preset.depth))
        elif knob.scale == "steps":
            out[name] = round(preset.train_steps * (k[name] / paper_base_steps if preset.steps_as_paper else 1))
        else:
            raise ValueError(f"knob {name}: unknown scale {knob.scale!r}")
    return out
