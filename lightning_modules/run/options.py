"""The options of the commands that work on one run (`aiayn train`, `aiayn bench`), as dataclasses.

The command line is generated from them (aiayn.common.options), so each default lives here only.
Importing this module is cheap (no torch, no Lightning): the CLI builds every parser from it.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, fields
from pathlib import Path

from aiayn.ablations.knobs import format_overrides, parse_overrides, set_help
from aiayn.ablations.presets import PRESETS
from aiayn.common.errors import UserError
from aiayn.common.options import LIMITS, config_values, did_you_mean, option, read_mapping, type_name, value_matches
from aiayn.lightning_modules.data.corpora import CORPORA


@dataclass
class TrainOptions:
    """What `aiayn train` takes: which run, where its data and results live, and the Trainer's settings."""

    # --help's sections, in this order (every option is in one: tests/test_options.py)
    OPTION_GROUPS: typing.ClassVar = (
        ("the run", ("row", "table", "preset", "overrides", "seed", "out")),
        (
            "data",
            (
                "data",
                "data_dir",
                "hf_splits",
                "source_eos",
                "src_lang",
                "tgt_lang",
                "cache_dir",
                "vocab_size",
                "train_pairs",
                "tokenizer",
                "num_workers",
            ),
        ),
        (
            "training",
            (
                "max_steps",
                "max_tokens",
                "accelerator",
                "devices",
                "num_nodes",
                "strategy",
                "precision",
                "matmul_precision",
                "residual_dtype",
                "trainer",
            ),
        ),
        ("validation", ("val_bleu_sentences", "val_every", "stability_validations", "eval_subset")),
        (
            "checkpoints",
            ("ckpt_every", "ckpt_every_minutes", "keep_last", "keep_for_averaging", "weights_only_checkpoints"),
        ),
        ("compile", ("compile", "static_shapes", "pad_to")),
        ("logging", ("logger", "wandb", "wandb_checkpoints", "log_model", "progress")),
    )

    row: str = option("base")
    """the Table 3 row (see `aiayn rows`)"""
    table: tuple[str, ...] = option((), metavar="FILE")
    """a table file of your own rows, in the layout of ablations/extended.csv, its cells in the paper's units (the
    preset scales them as it scales the paper's rows) (repeatable)"""
    preset: str = option("tiny", help=f"the scale: {', '.join(PRESETS)} (`aiayn rows --preset NAME` shows one)")
    data: str | None = option(
        None,
        help=f"corpus: {' | '.join(CORPORA)} | hf:NAME[:CONFIG], a Hugging Face dataset on the Hub "
        "(hf:wmt/wmt16:de-en) or saved on this machine (hf:/path, hf:./path) (default: the preset's)",
    )
    data_dir: str | None = option(None)
    """the corpus's files (multi30k, wmt14: instead of a download; files: required)"""
    hf_splits: str | None = option(None, metavar="train=…,dev=…,test=…")
    """with --data hf:…: which of the dataset's splits are train, dev and test (default: train; validation, dev or
    valid; test)"""
    source_eos: str | None = option(None, choices=("yes", "no"))
    """end every source sentence with </s>, as tensor2tensor, fairseq and Marian do (the paper's models; and what
    MarianTokenizer's default call encodes): yes, or no (sources without it, as older aiayn's runs, the committed
    evidence table among them) (default: yes; a resumed run keeps its own)"""
    src_lang: str = option("en")
    """source language of the corpus (files' suffix, or a dataset's translation field)"""
    tgt_lang: str = option("de")
    """target language of the corpus (files' suffix, or a dataset's translation field)"""
    seed: int = option(0, at_least=0, at_most=LIMITS["seed"])
    """the run's seed (the run directory is seedN), 0 or more"""
    out: str = option("runs")
    """run directories go under OUT/PRESET/CORPUS/ROW/seedN"""
    cache_dir: str | None = option(None)
    """tokenizer/corpus cache (default: $AIAYN_CACHE, else $XDG_CACHE_HOME/aiayn, else ~/.cache/aiayn)"""
    accelerator: str = option("auto")
    """Lightning accelerator: auto, cpu, gpu, cuda, ..."""
    devices: int = option(1, positive=True)
    """devices per node (DDP ranks)"""
    num_nodes: int = option(1, positive=True)
    """nodes (world size = devices x nodes)"""
    strategy: str = option("auto")
    """Lightning strategy, e.g. ddp"""
    precision: str = option("auto")
    """Lightning precision: auto (bf16-mixed on a GPU that supports it, else 32-true with TF32 matmuls on a GPU),
    32-true, bf16-mixed, ...; 16-mixed is refused (the fused loss computes its gradients in the forward)"""
    max_steps: int | None = option(None, positive=True)
    """optimizer steps (default: the preset's for the row)"""
    max_tokens: int | None = option(None, positive=True, at_most=LIMITS["tokens"])
    """real target tokens per device batch; accumulation makes up the preset's tokens per step"""
    vocab_size: int | None = option(None, positive=True)
    """joint BPE vocabulary (default: the preset's)"""
    train_pairs: int | None = option(None, positive=True, metavar="K")
    """train on the first K training pairs only, a data-limited regime (default: the preset's)"""
    tokenizer: str | None = option(None, metavar="FILE")
    """a SentencePiece model to use instead of training one (e.g. another run's tokenizer.model)"""
    val_bleu_sentences: int | None = option(None, metavar="K")
    """the first K dev sentences beam-decoded for val/bleu at each validation (default: the preset's; 0: no BLEU until
    the final evaluation); val/ppl is always the whole dev set's"""
    ckpt_every: int | None = option(None, positive=True)
    """optimizer steps between kept checkpoints (default: the preset's)"""
    ckpt_every_minutes: float | None = option(None)
    """instead, wall-clock minutes between kept checkpoints"""
    keep_last: int | None = option(None, positive=True, metavar="N")
    """periodic checkpoints (stepNNNNNNN.ckpt) kept, the newest; checkpoints/last.ckpt is kept besides (default: the
    preset's: 20, enough to average the last 20 as the paper's big model; 5 for tiny)"""
    keep_for_averaging: int | None = option(None, positive=True, metavar="M")
    """instead of --keep-last alone: the newest M periodic checkpoints kept, of which the newest --keep-last stay whole
    and the older ones are rewritten as weights only, all that averaging reads (default: as many as --keep-last, all
    whole); e.g. --keep-last 2 --keep-for-averaging 20 for the paper's big model"""
    weights_only_checkpoints: bool = option(False)
    """periodic checkpoints without the optimizer state (a third of the size, all that averaging and translating read);
    last.ckpt keeps the whole state, so a resume is unchanged"""
    val_every: int | None = option(None, positive=True)
    """optimizer steps between validations (default: the preset's)"""
    stability_validations: bool = option(True)
    """also validate at the steps nearest 75% and 87.5% of the budget (three around each where the preset reads a
    window) where --val-every's schedule misses them: the report's stability rule reads them"""
    eval_subset: int | None = option(None, positive=True)
    """final evaluation on the first K dev sentences (default: all, as the paper)"""
    num_workers: int | None = option(None, at_most=LIMITS["workers"])
    """data loader worker processes (default: 4 on a GPU, 0 on a CPU)"""
    pad_to: int | None = option(None, positive=True, metavar="K")
    """pad each batch's lengths up to a multiple of K (8 or 16 on a GPU), so batch shapes repeat (compiled kernels and
    attention plans are made once per shape), at the cost of padding (default: 1, none)"""
    static_shapes: bool = option(False)
    """batches of a few fixed shapes: each sentence's longer side rounded up to a multiple of --pad-to (its bucket), a
    fixed number of sentences per bucket (filling the step's budget with real tokens, as the dynamic batches do), both
    sides padded to it; what --compile model with fixed shapes, or a CUDA graph, needs; the padding costs extra
    positions, not tokens"""
    matmul_precision: str | None = option(None, choices=("highest", "high", "medium"))
    """fp32 matmuls on a GPU (torch.set_float32_matmul_precision): highest (exact fp32, what a CPU computes: with
    --precision 32-true, a GPU rerun of a table registered on CPUs is the same experiment), high (TF32 tensor cores; the
    default on a GPU), medium; a CPU run is unchanged"""
    residual_dtype: str = option("auto", choices=("auto", "fp32", "bf16"))
    """the residual stream's dtype under bf16-mixed: auto (bf16 where the run trains in bf16-mixed, a GPU's default;
    fp32 otherwise), fp32 (as autocast leaves it: LayerNorm returns fp32) or bf16 (half its elementwise bytes on a GPU;
    its dev PPL within 3% of fp32's, BENCHMARKS.md); where autocast runs only: the final evaluation, translation and
    export run the fp32 model"""
    compile: str = option("auto", choices=("auto", "none", "layers", "model"))
    """torch.compile: auto (the model whole on a CUDA device, where it pays; eager on a CPU; a compile that fails, its
    forward's or its backward's, trains eager, said in one line); none; layers (each encoder and decoder layer: dropout,
    residual add and LayerNorm fused around its matmuls); model (the encoder and decoder whole; with --pad-to's buckets
    each shape compiles once). Numbers equal eager's within float rounding; with dropout, masks come from inductor's
    RNG"""
    logger: str | None = option(None, metavar="NAMES")
    """where the training curves go, a comma-separated subset of csv, tensorboard, mlflow, wandb, each under the run
    directory (default: csv,tensorboard, or csv where tensorboard is not installed)"""
    wandb: bool = option(False)
    """also log to Weights & Biases (the same as adding wandb to --logger); online with WANDB_API_KEY or `wandb login`,
    else offline, unless WANDB_MODE says otherwise"""
    wandb_checkpoints: bool = option(False)
    """with W&B: also log the final checkpoint as a W&B model artifact"""
    log_model: bool = option(False)
    """log the final checkpoint (it carries its tokenizer and config) as an artifact to every tracker that keeps files:
    MLflow (model/: the checkpoint, its config.json and tokenizer, and a README on loading it) and W&B (a model
    artifact)"""
    progress: bool = option(True)
    """Lightning's progress bar"""
    trainer: dict = option(
        default_factory=dict,
        metavar="KEY=VALUE",
        parse=lambda items: parse_trainer(items),
        render=lambda d: format_trainer(d),
    )
    """a Lightning Trainer argument aiayn does not set itself, passed through (repeatable; VALUE read as YAML), e.g.
    --trainer log_every_n_steps=50 --trainer gradient_clip_val=1.0; default log_every_n_steps=10"""
    overrides: dict = option(
        default_factory=dict,
        flag="--set",
        metavar="KEY=VALUE",
        parse=parse_overrides,
        render=format_overrides,
        help=set_help(),
    )

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    @classmethod
    def config_layer(cls, path: str, prog: str = "aiayn train", skip=()) -> tuple[dict, ConfigFile | None]:
        """One `--config FILE` (aiayn.common.commands): a YAML file of these options, or a run's own config.json,
        whose spec, tokenizer and path come too (the second value; None for a YAML file)."""
        config = read_config_file(path)
        return config.values, (config if config.spec is not None else None)


# Trainer arguments aiayn sets from its own options (or must set itself), and the option to use instead
TRAINER_OWNED = {
    "accelerator": "--accelerator",
    "devices": "--devices",
    "num_nodes": "--num-nodes",
    "strategy": "--strategy",
    "precision": "--precision",
    "max_steps": "--max-steps",
    "accumulate_grad_batches": "--max-tokens (the preset's tokens per step are made up by accumulation)",
    "val_check_interval": "--val-every",
    "check_val_every_n_epoch": "--val-every",
    "callbacks": "a callback in aiayn's code",
    "plugins": "aiayn's code",
    "logger": "--logger",
    "default_root_dir": "--out",
    "enable_progress_bar": "--progress/--no-progress",
    "use_distributed_sampler": "nothing (aiayn's token-bucket sampler shards by rank itself)",
    "deterministic": "nothing (aiayn sets it on CPU, where resume is bitwise)",
}
TRAINER_DEFAULTS = {"log_every_n_steps": 10}
MAX_TRAINER_VALUE = 200  # characters in one --trainer value


def parse_trainer(items) -> dict:
    """`--trainer KEY=VALUE` (repeatable): KEY a Lightning Trainer argument aiayn does not set, VALUE read as YAML."""
    import inspect

    import yaml

    out = {}
    for item in items or ():
        key, eq, text = str(item).partition("=")
        if not eq or not key:
            raise UserError(f"--trainer {item}: expected KEY=VALUE; e.g. --trainer log_every_n_steps=50")
        if key in TRAINER_OWNED:
            raise UserError(f"--trainer {key}: aiayn sets the Trainer's {key}; use {TRAINER_OWNED[key]}")
        from lightning.pytorch import Trainer  # lazily: only a command line with --trainer pays for it

        names = inspect.signature(Trainer.__init__).parameters
        if key not in names:
            near = did_you_mean(key, [n for n in names if n not in TRAINER_OWNED and n != "self"])
            raise UserError(
                f"--trainer {key}: not an argument of lightning.pytorch.Trainer"
                + (f" (did you mean {near}?)" if near else "")
                + "; see its documentation (e.g. log_every_n_steps, gradient_clip_val, limit_val_batches)"
            )
        if len(text) > MAX_TRAINER_VALUE:  # a Trainer argument is a number, a name or a short list
            raise UserError(
                f"--trainer {key}: a value of {len(text)} characters; a Trainer argument takes at most "
                f"{MAX_TRAINER_VALUE}, e.g. --trainer {key}=1.0"
            )
        try:
            if any(isinstance(t, yaml.AliasToken | yaml.AnchorToken) for t in yaml.scan(text)):  # an alias bomb
                raise UserError(f"--trainer {key}: YAML anchors and aliases (&, *) are not read; write the value out")
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise UserError(f"--trainer {key}: the value is not YAML; quote it, e.g. --trainer {key}=1.0") from None
        if isinstance(value, float) and not math.isfinite(value):  # NaN or inf: Lightning would take it and fail later
            raise UserError(f"--trainer {key}={text}: not a finite number; e.g. --trainer {key}=1.0")
        hint = typing.get_type_hints(Trainer.__init__).get(key)
        if hint is not None and value_matches(value, hint) is False:  # before any run directory exists
            raise UserError(
                f"--trainer {item}: lightning.pytorch.Trainer's {key} must be {type_name(hint)}, not "
                f"{value!r}; e.g. --trainer {key}={_example(hint)}"
            )
        out[key] = value
    return out


def _example(hint) -> str:
    names = type_name(hint)
    return "1.0" if "a number" in names else "10" if "an integer" in names else "true" if "true" in names else "VALUE"


def format_trainer(trainer: dict) -> list[str]:
    """The `--trainer` values that `parse_trainer` reads back as `trainer`."""
    import json

    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in trainer.items()]


# Options that say where and how a run is watched, not what it is: left out of config.json's "options".
# Tokens per beam-search batch: source tokens with padding for `aiayn translate`/`eval`; at least this many
# real target tokens (the DataModule's budget) for a run's final evaluation
DECODE_MAX_TOKENS = 4096

NOT_RECORDED = ("cache_dir", "progress", "num_workers")


def options_record(opts: TrainOptions) -> dict:
    """The options of a run as config.json records them (`aiayn train --config` reads them back)."""
    out = {}
    for f in fields(opts):
        if f.name not in NOT_RECORDED:
            value = getattr(opts, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


@dataclass(frozen=True)
class ConfigFile:
    """What `--config FILE` gives: option values by name, and, when FILE is a run's config.json, that run's
    recorded spec (RunSpec.to_dict()) and its tokenizer's sha256."""

    values: dict
    spec: dict | None = None
    tokenizer_sha256: str | None = None
    resolved: bool = False  # written by a sweep's driver (resolved_run): train its spec as it is
    source: str | None = None  # the file's path


# The key that marks a file as a run resolved by a sweep's driver for a process of its own (a subprocess, a SLURM array
# task): the child trains the spec in it, and looks the row up in no table
RESOLVED_KEY = "resolved_by"


def resolved_run(spec: dict, driver: str) -> dict:
    """The file a sweep's driver hands a run's own process (`aiayn train --config FILE`): the row as the driver
    resolved it (RunSpec.to_dict()), so no process resolves a row a second time (and a table edited meanwhile
    changes nothing that is already queued). The options travel on the command line."""
    return {RESOLVED_KEY: driver, "spec": spec, "options": {}}


# Options a release removed, as an older run's config.json records them: (the value every run recorded unless asked,
# what to use instead). Recorded at that value, the option is read as absent; at another, refused (docs/changelog.md).
REMOVED = {
    "pack_seeds": (None, "packs were removed: train each seed as its own run"),
    "dropout_rng": ("torch", "the counter stream left with packs: this run's dropout masks cannot be drawn again"),
    "batch_order_seed": (None, "it left with packs: each run draws its batch order from its own seed"),
}


def _without_removed(values: dict, path) -> dict:
    """`values` (a config file's options) less the removed options recorded at their old defaults; one line for one
    recorded otherwise."""
    for key, (default, instead) in REMOVED.items():
        if key in values and values[key] != default:
            raise UserError(f"config {path}: option {key} {values[key]!r} was removed ({instead}; docs/changelog.md)")
    return {k: v for k, v in values.items() if k not in REMOVED}


def read_config_file(path: str | Path) -> ConfigFile:
    """`aiayn train --config FILE`: FILE is JSON or YAML (a superset of JSON): a run's config.json (its
    "options" and "spec") or a mapping of `aiayn train` options by name (`max_steps: 2`, `set: {d_model: 256}`)."""
    doc = read_mapping(path, "a run's config.json or a YAML file of `aiayn train` options (e.g. `row: C3`)")
    is_run = isinstance(doc.get("spec"), dict) and "options" in doc
    if is_run:
        from aiayn.common.schema import SCHEMA

        schema = doc.get("schema", SCHEMA)
        if not isinstance(schema, int) or isinstance(schema, bool) or not 1 <= schema <= SCHEMA:
            raise UserError(
                f"config {path} is a run config.json of schema {schema!r}, which this aiayn does not read "
                f"(it reads schema {SCHEMA}); use the aiayn that wrote it, or pass a YAML file of `aiayn "
                "train` options"
            )
    given = (doc["options"] if is_run else doc) or {}
    given = _without_removed(given, path) if isinstance(given, dict) else given
    values = config_values(TrainOptions, given, f"config {path}", "aiayn train")
    if not is_run:
        return ConfigFile(values)
    return ConfigFile(values, doc["spec"], (doc.get("tokenizer") or {}).get("sha256"), RESOLVED_KEY in doc, str(path))


LOOK_SENTENCES = 50  # a look's final evaluation: an untrained model's beam search over 1000 sentences takes minutes
LOOK_EVAL = (
    f"its final evaluation on the first {LOOK_SENTENCES} dev sentences (--eval-subset N for another number; extended "
    "to its budget, a run is evaluated on the whole dev set)"
)


def eval_sentences(opts: TrainOptions, budget: int, kind: str) -> int | None:
    """The final evaluation's dev sentences (None: all): --eval-subset; else, for a look (--max-steps below the
    row's budget), the first LOOK_SENTENCES, as a look's lead says; an hpo trial's final dev PPL is its objective,
    so it is the whole dev set unless --eval-subset cuts it."""
    if opts.eval_subset is not None or kind == "hpo":
        return opts.eval_subset
    return LOOK_SENTENCES if opts.max_steps is not None and opts.max_steps < budget else None
