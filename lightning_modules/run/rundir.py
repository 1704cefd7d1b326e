"""The output directory and the run directories in it: the one module that knows their layout, their files and
what those say (config.json as `RunConfig`, metrics.json as `RunMetrics`: read and written only through them).

A run's directory depends only on (preset, corpus, row, seed), so rerunning the same command resumes it::

    OUT/                                   `OutDir`: everything a command writes under --out
        PRESET/CORPUS/ROW/seedS/           `RunDir`: one run of Table 3
            config.json            the resolved config (`RunConfig`), written before training; another is refused
            tokenizer.model        the run's SentencePiece model (its sha256 in config.json and in every checkpoint)
            checkpoints/           last.ckpt, stepNNNNNNN.ckpt (the newest periodic ones), requeue.ckpt (SLURM)
            logs/version_N/        the loggers' files of attempt N (CSV: training and validation curves; TensorBoard)
            dev.hyp, dev.ref       the final dev translations and their references, line by line
            metrics.json           the result (`RunMetrics`), written last
            wandb-run.json, wandb/ the run directory's W&B run id and attempts, W&B's own files (with W&B)
            .lock                  held by the one process that trains the run
        PRESET/CORPUS/ROW/seedS.log, .spec.json   a sweep's, beside a run it trains (sweeps/folders.py)
        mlflow.db, mlartifacts/    the MLflow runs of every run, one per attempt (--logger mlflow; MLFLOW_TRACKING_URI)
        hpo/, slurm/, sweeps/, reports/, .locks/, optuna.db, hpo.db: the sweeps' own (sweeps/folders.py)

Every file is written atomically (aiayn.common.files); temporary files a kill leaves behind are removed when the
run restarts. Nothing here imports torch at import time: sweeps and reports read run directories too.
"""

from __future__ import annotations

import json
import logging
import platform
import re
import secrets
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import IO

from aiayn.ablations.knobs import MODEL_KEYS
from aiayn.ablations.predictions import registration_sha256
from aiayn.common import provenance
from aiayn.common.errors import UserError
from aiayn.common.files import (
    UnsafeFile,
    atomic_open,
    atomic_write_json,
    atomic_write_text,
    load_torch_file,
    read_json,
    remove_stale_temps,
    sha256_bytes,
    sha256_file,
)
from aiayn.common.locks import is_held, try_lock
from aiayn.common.names import under
from aiayn.common.schema import SCHEMA  # of config.json and metrics.json; a newer one is refused
from aiayn.common.secrets import redact_obj
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.data.plan import DataIdentity
from aiayn.lightning_modules.run.spec import RunSpec

log = logging.getLogger(__name__)

REQUEUE_CHECKPOINT = "requeue.ckpt"
STATUSES = ("completed", "failed", "diverged", "pruned")

_STEP_CKPT = re.compile(r"step(\d+)\.ckpt$")


RECORD_MAX_BYTES = 1 << 20  # a config.json or metrics.json is a few KB: larger, or no regular file, is no record


def _from_dict(cls, d: dict, what: str):
    """`cls` from a JSON object: unknown keys ignored (a later aiayn may add some), missing required ones named."""
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    if int(d.get("schema", SCHEMA)) > SCHEMA:
        raise ValueError(f"{what} of schema {d['schema']} (this aiayn reads {SCHEMA}): written by a newer aiayn")
    names = {f.name for f in fields(cls)}
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    return cls(**{k: v for k, v in d.items() if k in names})


_NUMBER = (int, float)
_KIND_WORDS = {
    _NUMBER: "a number",
    str: "text",
    dict: "an object",
    list: "a list",
    bool: "true or false",
    int: "an integer",
}


@dataclass(frozen=True)
class RunMetrics:
    """metrics.json: what a run ended with. Written once, last, by the run's rank 0; read by sweeps and reports."""

    row: str
    seed: int
    preset: str
    status: str  # one of STATUSES
    group: str = ""
    data: str = ""  # the corpus
    kind: str = "table3"  # "table3", or "hpo" for a trial of `aiayn hpo` (never part of a Table 3 report)
    planned_steps: int | None = None  # the steps this run was started for (--max-steps, else its budget)
    steps: int | None = None  # the steps it trained
    # the row's budget at its preset (its spec's train_steps): a run that trained fewer is capped (--max-steps), a
    # look, not the preset's table; reports, status and trackers say so, and a sweep with the full budget extends it
    budget_steps: int | None = None
    params: int | None = None
    train_time_s: float | None = None  # training steps (no validations), over every attempt
    eval_time_s: float | None = None  # the final evaluation (beam search over the dev set)
    wall_time_s: float | None = None  # this attempt from start to metrics.json: setup, fit, evaluation
    tokens_per_s: float | None = None
    grad_w_path: str | None = None  # how the projection's gradient was accumulated (transformer/loss.py)
    precision: str | None = None  # what the run trained under: Lightning's precision and fp32 matmuls' (devices.py)
    dev_bleu: float | None = None
    dev_bleu_signature: str | None = None
    dev_tok_bleu: float | None = None
    dev_tok_bleu_label: str | None = None
    dev_ppl: float | None = None
    dev_sentences: int | None = None
    src_tokens_per_step: float | None = None
    tgt_tokens_per_step: float | None = None
    paper_ppl: float | None = None
    paper_bleu: float | None = None
    paper_params_m: float | None = None
    config: dict = field(default_factory=dict)  # the model's knobs as trained (MODEL_KEYS)
    deviations: list = field(default_factory=list)  # each as its text
    effective_tokens_per_step: int | None = None
    error: str | None = None
    diverged_at_step: int | None = None
    host: str = ""
    torch: str = ""
    finished_at: str = ""
    # provenance (aiayn/common/provenance.py): the commit of the aiayn checkout the run ran from (None: not a
    # checkout), whether its tracked files differed from it, and the sha256 of its preset's pre-registered
    # predictions at the time (ablations/predictions.py, registration_sha256; None: the preset registers none)
    commit: str | None = None
    dirty: bool | None = None
    predictions_sha256: str | None = None
    schema: int = SCHEMA

    def summary_line(self) -> str:
        """What `aiayn train` prints when the run ends."""
        if self.status == "diverged":
            return f"{self.row} seed {self.seed}: diverged ({self.error}); metrics.json status diverged"
        capped = f" (capped: {self.steps} of its {self.budget_steps})" if self.capped else ""
        return (
            f"{self.row} seed {self.seed}: dev BLEU {self.dev_bleu:.2f} (sacreBLEU), dev PPL {self.dev_ppl:.2f}, "
            f"{self.params / 1e6:.2f}M params, {self.steps} steps{capped} in {self.train_time_s:.0f} s "
            f"({self.tokens_per_s:.0f} tokens/s)"
        )

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is none of {', '.join(STATUSES)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, str)):
            raise ValueError(f"seed {self.seed!r} is not an integer")
        try:
            object.__setattr__(self, "seed", int(self.seed))
        except (TypeError, ValueError):
            raise ValueError(f"seed {self.seed!r} is not an integer") from None
        for f in fields(self):  # a hand-edited or foreign file: each field its type, or the file is not read
            value, kind = getattr(self, f.name), _FIELD_TYPES.get(f.name)
            if (
                value is not None
                and kind is not None
                and (isinstance(value, bool) and kind is not bool or not isinstance(value, kind))
            ):
                raise ValueError(f"{f.name} {value!r} is not {_KIND_WORDS[kind]}")

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @property
    def capped(self) -> bool:
        """Trained (or planned) fewer steps than its row's budget at its preset: `--max-steps` cut it short."""
        done = self.steps if self.steps is not None else self.planned_steps
        return done is not None and self.budget_steps is not None and done < self.budget_steps

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> RunMetrics:
        return _from_dict(cls, d, "metrics.json")


# the type each field of metrics.json must have where it is given (None: any, or checked in __post_init__)
_FIELD_TYPES = {
    **dict.fromkeys(
        (
            "row",
            "preset",
            "group",
            "data",
            "kind",
            "dev_bleu_signature",
            "dev_tok_bleu_label",
            "error",
            "host",
            "torch",
            "finished_at",
            "commit",
            "predictions_sha256",
        ),
        str,
    ),
    **dict.fromkeys(
        (
            "planned_steps",
            "steps",
            "budget_steps",
            "params",
            "dev_sentences",
            "effective_tokens_per_step",
            "diverged_at_step",
            "schema",
        ),
        int,
    ),
    **dict.fromkeys(
        (
            "train_time_s",
            "eval_time_s",
            "wall_time_s",
            "tokens_per_s",
            "dev_bleu",
            "dev_tok_bleu",
            "dev_ppl",
            "src_tokens_per_step",
            "tgt_tokens_per_step",
            "paper_ppl",
            "paper_bleu",
            "paper_params_m",
        ),
        _NUMBER,
    ),
    "config": dict,
    "deviations": list,
    "dirty": bool,
}


@dataclass(frozen=True)
class TrainPlan:
    seed: int
    steps: int  # optimizer steps
    accumulate: int  # batches per optimizer step, per device
    world_size: int
    effective_tokens_per_step: int  # the budget: real target tokens (EOS included) per optimizer step
    precision: str


@dataclass(frozen=True)
class RunConfig:
    """config.json: the run as resolved before training. `aiayn train --config RUN/config.json` trains it again."""

    spec: RunSpec  # the row at its scale, --set, the model config, schedule, deviations (a dict only in the file)
    data: DataIdentity
    train: TrainPlan
    tokenizer_file: str = "tokenizer.model"
    tokenizer_sha256: str | None = None  # the file's bytes (None until the tokenizer exists)
    # how it segments (its pieces, scores and kinds: tokenizer.segmentation_sha256): equal for two models that
    # segment alike, whose files differ in the training options they record
    tokenizer_segmentation: str | None = None
    options: dict = field(default_factory=dict)  # the TrainOptions that made it (lightning_modules/run/options.py)
    schema: int = SCHEMA

    @property
    def model(self) -> dict:
        return self.spec.model.to_dict()

    @property
    def schedule(self) -> dict:
        return asdict(self.spec.schedule)

    @property
    def tables(self) -> tuple[str, ...]:
        """The user's --table files the run was resolved with (its options'; () for the paper's rows only)."""
        tables = self.options.get("table") or ()
        return tuple(str(t) for t in tables) if isinstance(tables, list | tuple) else ()

    def identity(self) -> dict:
        """What must match for a rerun to resume a run directory."""
        return {"model": self.model, "data": self.data.to_dict(), "schedule": self.schedule}

    def experiment_sha256(self) -> str:
        """A fingerprint of the experiment the run is, wherever it ran: its model, data (not the folder it was read
        from), schedule, budget, tokens a step and precision; the seed aside. Two runs of one row and seed with the
        same fingerprint trained the same experiment; a report records it for each run, so that a command quoted
        beside the report can be resolved again and compared (tests/test_reference_reports.py)."""
        data = {k: v for k, v in self.data.to_dict().items() if k != "data_dir"}
        t = self.train
        what = {
            "model": self.model,
            "data": data,
            "schedule": self.schedule,
            "train": [t.steps, t.effective_tokens_per_step, t.precision],
        }
        return sha256_bytes(json.dumps(what, sort_keys=True).encode("utf-8"))

    def to_dict(self) -> dict:
        return {
            "schema": self.schema,
            "spec": self.spec.to_dict(),
            "data": self.data.to_dict(),
            "train": asdict(self.train),
            "tokenizer": {
                "file": self.tokenizer_file,
                "sha256": self.tokenizer_sha256,
                "segmentation_sha256": self.tokenizer_segmentation,
            },
            "options": self.options,
        }

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> RunConfig:
        """The run config a checkpoint written by `aiayn train` carries (its config.json, once, typed), read
        weights-only; a missing, unreadable, unsafe or foreign checkpoint is a UserError naming it."""
        return run_config(load_raw(path), path)

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        if not isinstance(d, dict) or not {"spec", "data", "train"} <= set(d):
            raise ValueError("not an aiayn config.json (no spec, data and train)")
        if int(d.get("schema", SCHEMA)) > SCHEMA:
            raise ValueError(f"config.json of schema {d['schema']} (this aiayn reads {SCHEMA}): a newer aiayn's")
        tok = d.get("tokenizer") or {}
        try:
            spec = RunSpec.from_dict(d["spec"])
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"its spec is not one aiayn wrote ({type(e).__name__}: {e})") from None
        except UserError as e:  # a recorded value this aiayn's model config refuses
            raise ValueError(str(e)) from None
        return cls(
            spec=spec,
            data=DataIdentity.from_dict(d["data"]),
            train=_from_dict(TrainPlan, d["train"], "train"),
            tokenizer_file=tok.get("file", "tokenizer.model"),
            tokenizer_sha256=tok.get("sha256"),
            tokenizer_segmentation=tok.get("segmentation_sha256"),
            options=d.get("options") or {},
        )


@dataclass(frozen=True)
class OutDir:
    """Everything a command writes under --out (the module docstring's layout); one place decides every path."""

    root: Path

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    # the sweeps' folders (sweeps/folders.py) and each back end's own (OUT/NAME): never a preset's, never a run's
    RESERVED = ("hpo", "reports", "sweeps", ".locks", "local", "subprocess", "slurm")

    def run(self, preset: str, corpus: CorpusRef, row: str, seed: int) -> RunDir:
        """OUT/PRESET/CORPUS/ROW/seedS, CORPUS as one path component (hf:wmt/wmt14:de-en: hf-wmt--wmt14-de-en); a
        name that is not one safe component is a UserError (aiayn.common.names), so no run lands outside OUT."""
        return RunDir(
            under(self.root, preset, corpus.dirname, row, _seed_dir(seed), kinds=("preset", "corpus", "row", "seed"))
        )

    def run_of(self, spec: RunSpec, seed: int) -> RunDir:
        """The run directory of a resolved run and a seed."""
        return self.run(spec.preset.name, spec.corpus, spec.row, seed)

    def run_dirs(self) -> list[RunDir]:
        """Every Table 3 run directory under the root, begun or done (OUT/PRESET/CORPUS/ROW/seedS)."""
        found = self.root.glob("*/*/*/seed*")
        return sorted(RunDir(p) for p in found if p.is_dir() and p.relative_to(self.root).parts[0] not in self.RESERVED)


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __lt__(self, other: RunDir) -> bool:
        return self.path < other.path

    # ---- layout

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoints / "last.ckpt"

    @property
    def tokenizer_file(self) -> Path:
        return self.path / "tokenizer.model"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def dev_hyp(self) -> Path:
        return self.path / "dev.hyp"

    @property
    def dev_ref(self) -> Path:
        return self.path / "dev.ref"

    @property
    def failure_file(self) -> Path:
        """Beside the run directory, not in it: a pair that failed before training (its directory may hold another
        config, or none) still has a record, which `aiayn status` and the report read as they read metrics.json."""
        return self.path.parent / f"{self.path.name}.failed.json"

    def write_failure(self, status: str, error: str | None) -> None:
        atomic_write_json(
            self.failure_file,
            redact_obj({"status": status, "error": error, "at": time.time(), "host": platform.node()}),
        )

    def read_failure(self) -> dict | None:
        """{"status", "error", "at"} of the pair's last failure before a metrics.json; None when there is none."""
        try:
            doc = read_json(self.failure_file, RECORD_MAX_BYTES)
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("status") not in STATUSES:
            return None
        return {
            "status": doc["status"],
            "error": None if doc.get("error") is None else str(doc["error"]),
            "at": doc.get("at"),
        }

    def clear_failure(self) -> None:
        self.failure_file.unlink(missing_ok=True)

    def is_training(self) -> bool:
        """A live process holds the run's lock (it trains the run now); read-only, as `aiayn status` must be."""
        return is_held(self.path / ".lock")

    # ---- config.json

    def read_config(self) -> RunConfig | None:
        """config.json, or None when there is none; an unreadable one is a UserError."""
        if not self.config_file.exists():
            return None
        try:
            return RunConfig.from_dict(read_json(self.config_file, RECORD_MAX_BYTES))
        except (OSError, ValueError, TypeError) as e:
            raise UserError(
                f"cannot read {self.config_file} ({e}); delete the run directory {self.path} to start over"
            ) from e

    def check_config(self, config: RunConfig) -> None:
        """A run directory holds one config: refuse to resume a run of another one."""
        saved = self.read_config()
        if saved is None:
            return
        old, new = saved.identity(), config.identity()
        for key in new:
            if old[key] != new[key]:
                diff = {k: (old[key].get(k), v) for k, v in new[key].items() if old[key].get(k) != v}
                raise UserError(
                    f"run directory {self.path} holds a run of another config ({key} differs: {diff}); "
                    f"use another --out or delete that directory"
                )

    def check_resume_plan(self, config: RunConfig) -> None:
        """A run resumes only with the batches it started with: the same world size, accumulation and tokens per
        device batch. Its data position is counted in batches of its own rank's share of the epoch (rank r takes
        every world-th batch), so another split would resume at another place in the data and silently train some
        batches twice and others never; refused in one line instead, before anything is written."""
        saved = self.read_config()
        if saved is None or self.resume_checkpoint() is None:
            return
        old, new = saved.train, config.train
        fields_ = ("world_size", "accumulate", "effective_tokens_per_step")
        differ = [f"{f} {getattr(old, f)} -> {getattr(new, f)}" for f in fields_ if getattr(old, f) != getattr(new, f)]
        # static shapes batch by length bucket (the bucket width is --pad-to): other batches, another data position
        was, now = _batching(saved.options), _batching(config.options)
        if was != now:
            raise UserError(
                f"run directory {self.path} was trained with {_batching_text(was)}; resuming it with "
                f"{_batching_text(now)} would make other batches and misplace its position in the data: resume with "
                f"the flags it ran with, or start it again in another --out"
            )
        if differ:
            raise UserError(
                f"run directory {self.path} was trained with world size {old.world_size} x {old.accumulate} "
                f"accumulated batch(es) of {old.effective_tokens_per_step // max(old.world_size * old.accumulate, 1)} "
                f"tokens; resuming it with {', '.join(differ)} would misplace its position in the data: resume with "
                f"--devices/--num-nodes/--max-tokens as it ran, or start it again in another --out"
            )

    def write_config(self, config: RunConfig) -> None:
        atomic_write_json(self.config_file, redact_obj(config.to_dict()))

    # ---- tokenizer.model

    def write_tokenizer(self, model: Path) -> str:
        """Copy the SentencePiece model the run trains with into the run directory (once); return its
        sha256. A run directory keeps one tokenizer: another one is refused."""
        data = Path(model).read_bytes()
        sha = sha256_bytes(data)
        if self.tokenizer_file.is_file():
            from aiayn.lightning_modules.data.tokenizer import segmentation_sha256  # torch: only where training

            held = sha256_file(self.tokenizer_file)
            if held != sha and segmentation_sha256(self.tokenizer_file) == segmentation_sha256(model):
                return held  # the same segmentation, trained again (its file records other training options)
            if held != sha:
                raise UserError(
                    f"run directory {self.path} was trained with another tokenizer (sha256 {held[:12]}, not "
                    f"{sha[:12]} of {model}); use another --out or drop --tokenizer"
                )
            return sha
        with atomic_open(self.tokenizer_file, "wb") as f:
            f.write(data)
        return sha

    # ---- W&B: one W&B run per run directory

    @property
    def wandb_record(self) -> Path:
        return self.path / "wandb-run.json"

    def wandb_attempt(self, mode: str, row: str, seed: int, given_id: str | None = None) -> dict:
        """This attempt's W&B run: {"id", "name", "attempt", "base_id", "earlier"} (earlier: the ids of
        the attempts before). The run directory's W&B id is made once, on its first attempt, and kept
        in wandb-run.json, so that every attempt (a rerun, a SLURM requeue, the directory copied to
        another machine) logs to the same W&B run when online (resume="allow"). Kept rather than
        computed from the path: two users' `runs/tiny/synthetic/base/seed0` in one W&B project must not
        share a run, and a moved directory should keep its own. Offline, W&B cannot resume (a second
        offline run with the same id does not merge on `wandb sync`), so an offline attempt after the
        first gets its own id and name, `ID-aN` / `ROW-sSEED attempt N`. `given_id` (W&B's WANDB_RUN_ID,
        set e.g. by `wandb agent`) is used as it is."""
        record = self.read_wandb_record() or {"id": _new_wandb_id(row, seed), "attempts": []}
        n = len(record["attempts"]) + 1
        base = given_id or record["id"]
        split = mode == "offline" and n > 1 and not given_id
        attempt = {
            "attempt": n,
            "mode": mode,
            "id": f"{base}-a{n}" if split else base,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        earlier = [a["id"] for a in record["attempts"]]
        record["attempts"].append(attempt)
        atomic_write_json(self.wandb_record, record)
        name = f"{row}-s{seed}" + (f" attempt {n}" if split else "")
        return {"id": attempt["id"], "name": name, "attempt": n, "base_id": base, "earlier": earlier}

    def read_wandb_record(self) -> dict | None:
        try:
            return read_json(self.wandb_record, RECORD_MAX_BYTES)
        except (OSError, ValueError):
            return None

    # ---- metrics.json

    def read_metrics(self) -> RunMetrics | None:
        """metrics.json, or None when there is none (or it is unreadable: `metrics_problem` says why)."""
        try:
            return RunMetrics.from_dict(read_json(self.metrics_file, RECORD_MAX_BYTES))
        except (OSError, ValueError, TypeError):
            return None

    def metrics_problem(self) -> str | None:
        """Why a metrics.json that exists cannot be read (one line); None when it reads, or there is none."""
        if not self.metrics_file.exists():
            return None
        try:
            RunMetrics.from_dict(read_json(self.metrics_file, RECORD_MAX_BYTES))
        except ValueError as e:  # json.JSONDecodeError is one too, and so is a file that is no regular one
            return f"unreadable metrics.json ({str(e).splitlines()[0][:200]})"
        except TypeError as e:
            return f"unreadable metrics.json ({e})"
        return None

    def status(self) -> str:
        """'completed', 'failed', 'diverged', 'pruned', or 'missing' (no readable metrics.json yet)."""
        metrics = self.read_metrics()
        return metrics.status if metrics is not None else "missing"

    def write_metrics(self, config: RunConfig, status: str, kind: str = "table3", **measured) -> RunMetrics:
        """The result of a run, from its config and what training measured (`measured`: dev_bleu, dev_ppl, steps,
        ... on completion; error on failure). Secrets are masked."""
        spec, t = config.spec, config.train
        code = provenance.source()
        metrics = RunMetrics(
            row=spec.row,
            group=spec.group,
            seed=t.seed,
            preset=spec.preset.name,
            data=config.data.corpus.name,
            status=status,
            kind=kind,
            planned_steps=t.steps,
            budget_steps=spec.train_steps,
            paper_ppl=spec.paper.ppl,
            paper_bleu=spec.paper.bleu,
            paper_params_m=spec.paper.params_m,
            config={k: getattr(spec.model, k) for k in MODEL_KEYS},
            deviations=[d.text for d in spec.deviations],
            effective_tokens_per_step=t.effective_tokens_per_step,
            host=platform.node(),
            torch=_torch_version(),
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            commit=code.commit,
            dirty=code.dirty,
            predictions_sha256=registration_sha256(spec.preset.name),
            **measured,
        )
        atomic_write_json(self.metrics_file, redact_obj(metrics.to_dict()))
        return RunMetrics.from_dict(redact_obj(metrics.to_dict()))

    def write_dev(self, hypotheses: list[str], references: list[str]) -> None:
        """Final dev translations and their references, side by side (the report's paired bootstrap)."""
        atomic_write_text(self.dev_hyp, "\n".join(hypotheses) + "\n")
        atomic_write_text(self.dev_ref, "\n".join(references) + "\n")

    # ---- one process per run, and restarts

    def hold_lock(self) -> IO:
        """The run's lock, held until the returned file is closed (or the process dies); a UserError
        if another process trains this run. Creates the directory."""
        held = try_lock(self.path / ".lock")
        if held is None:
            raise UserError(
                f"run directory {self.path} is being trained by another process; wait for it to finish or stop it"
            )
        return held

    def remove_stale_temps(self) -> list[Path]:
        return remove_stale_temps(self.path)

    def next_log_version(self) -> int:
        """N of this attempt's logs/version_N: one more than the highest there, 0 for the first attempt. Each
        attempt logs into its own version, so a resumed run keeps the curves of the attempts before it."""
        found = [int(m[1]) for p in self.logs.glob("version_*") if (m := re.fullmatch(r"version_(\d+)", p.name))]
        return max(found, default=-1) + 1

    def periodic_checkpoints(self) -> list[Path]:
        """The kept periodic checkpoints (stepNNNNNNN.ckpt), oldest first."""
        found = [p for p in self.checkpoints.glob("step*.ckpt") if _STEP_CKPT.search(p.name)]
        return sorted(found, key=lambda p: int(_STEP_CKPT.search(p.name)[1]))

    def checkpointed_step(self) -> int | None:
        """The step of the newest periodic checkpoint, from its name (nothing is loaded); None when there is none."""
        found = self.periodic_checkpoints()
        return int(_STEP_CKPT.search(found[-1].name)[1]) if found else None

    def _check_own(self, path: Path, state) -> None:
        """A checkpoint this run would resume from must be its own: one of another row or seed (copied or moved
        there) would be refused by Lightning's state-dict load as a traceback, or, with the same shapes, continue
        another run silently."""
        files = state.get(RUN_FILES) if isinstance(state, dict) else None
        theirs = files.get("config") if isinstance(files, dict) else None
        if not isinstance(theirs, dict) or not self.config_file.exists():
            return
        mine = _run_of(self.read_config().to_dict())
        other = _run_of(theirs)
        if other != mine:
            raise UserError(
                f"checkpoint {path} is another run's (row {other[0]}, seed {other[1]}, preset {other[3]}), not this "
                f"one's (row {mine[0]}, seed {mine[1]}, preset {mine[3]}); move it out of {path.parent} and run again"
            )

    def resume_checkpoint(self) -> Path | None:
        """The checkpoint a rerun resumes from: the one at the highest global step among `last.ckpt` (periodic),
        `requeue.ckpt` (saved on SLURM's warning signal) and the periodic stepNNNNNNN.ckpt files that hold the whole
        state (a kill inside the write of last.ckpt leaves the periodic file of the same step, written just before
        it: the run goes on from there, not from step 0). On a tie the requeue checkpoint wins, then last.ckpt. An
        unreadable file (killed mid-save) is passed over; a weights-only one cannot resume a run."""
        best, best_step = None, -1
        candidates = [
            *self.periodic_checkpoints(),
            self.checkpoints / "last.ckpt",
            self.checkpoints / REQUEUE_CHECKPOINT,
        ]
        for path in candidates:
            if not path.is_file():
                continue
            try:  # mmap: reads the step without loading the tensors; weights_only: no code runs (load_torch_file)
                state = load_torch_file(path, map_location="cpu", mmap=True)
                step = state["global_step"]
            except UnsafeFile as e:  # not a kill's leftover: someone put it there
                raise UserError(f"cannot resume from checkpoint {e}") from None
            except Exception as e:
                log.warning("not resuming from %s: unreadable (%s: %s)", path, type(e).__name__, e)
                continue
            self._check_own(path, state)
            if _STEP_CKPT.search(path.name) and "optimizer_states" not in state:
                continue  # weights only (--weights-only-checkpoints, kept for averaging): no optimizer
            if step >= best_step:  # on a tie the later candidate wins: requeue, then last, then periodic
                best, best_step = path, step
        return best


def _run_of(config: dict) -> tuple:
    """(row, seed, model, preset) of a run config as a dict (config.json's layout); None where a part is missing.
    The preset too: two presets may share a model and differ in budget, schedule or data (quick and evidence)."""
    spec, train = config.get("spec") or {}, config.get("train") or {}
    preset = spec.get("preset")
    return (
        spec.get("row"),
        train.get("seed"),
        spec.get("model"),
        preset.get("name") if isinstance(preset, dict) else preset,
    )


def _seed_dir(seed: int) -> str:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"seed {seed!r} is not a seed; seeds are integers from 0")
    return f"seed{seed}"


def _new_wandb_id(row: str, seed: int) -> str:
    """ROW-sSEED-<12 random hex>: readable in W&B's URLs, unique across users of one project."""
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', row)}-s{seed}-{secrets.token_hex(6)}"


def _torch_version() -> str:
    import torch

    return torch.__version__


def _batching(options: dict) -> tuple[bool, int]:
    """(static shapes, bucket width) of a run's recorded options: what decides its batches beyond the token budget
    (without --static-shapes, --pad-to only pads: the batches are the same)."""
    static = bool(options.get("static_shapes", False))
    return static, (int(options.get("pad_to") or 1) if static else 1)


def _batching_text(batching: tuple[bool, int]) -> str:
    static, width = batching
    return f"--static-shapes (buckets of {width})" if static else "token-bucket batches (no --static-shapes)"


# ---- checkpoints: the run config and the tokenizer they carry (callbacks.RunFilesInCheckpoint writes them)

RUN_FILES = "aiayn"  # the checkpoint's key of the run's files: its config.json and its tokenizer
RUN_FILES_FORMAT = 1  # the layout of checkpoint[RUN_FILES] (callbacks.RunFilesInCheckpoint writes it)


def load_raw(path: str | Path) -> dict:
    """A checkpoint as a dict, loaded with torch's weights_only=True (tensors and plain data only, so a checkpoint
    someone shared cannot run code here; what aiayn writes is only that: callbacks.capture_rng, RunFilesInCheckpoint);
    a missing, unreadable, unsafe or foreign file is a UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; pass the path of a .ckpt file (see RUN/checkpoints/)")
    try:
        ckpt = load_torch_file(path, map_location="cpu")
    except UnsafeFile as e:
        raise UserError(f"checkpoint {e}") from None
    except Exception as e:  # truncated or not a checkpoint at all
        raise UserError(
            f"checkpoint {path} is unreadable ({type(e).__name__}); it is truncated or not an aiayn checkpoint"
        ) from e
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get(RUN_FILES), dict) or "config" not in ckpt[RUN_FILES]:
        raise UserError(
            f"checkpoint {path} was not written by `aiayn train` (no run config under checkpoint"
            f"[{RUN_FILES!r}]); pass a checkpoint from a run directory's checkpoints/"
        )
    fmt = ckpt[RUN_FILES].get("format", RUN_FILES_FORMAT)  # none: written before the field was
    if fmt != RUN_FILES_FORMAT:
        raise UserError(
            f"checkpoint {path} is of format {fmt!r}, which this aiayn does not read (it reads "
            f"{RUN_FILES_FORMAT}); use the aiayn that wrote it"
        )
    return ckpt


def run_config(ckpt: dict, path: str | Path) -> RunConfig:
    """The run config a checkpoint carries (config.json as the run wrote it), typed; one this aiayn cannot read,
    or whose model section does not follow from its knobs, is a UserError naming the checkpoint."""
    try:
        return RunConfig.from_dict(run_files(ckpt).get("config"))
    except ValueError as e:
        raise UserError(
            f"checkpoint {path} holds a run config this aiayn cannot use ({e}); translate it with the "
            f"aiayn that trained it"
        ) from None


def run_files(ckpt: dict) -> dict:
    """The run files a checkpoint carries ({} for one not written by `aiayn train`)."""
    return ckpt.get(RUN_FILES) or {}


def embedded_tokenizer(ckpt: dict, path: str | Path) -> bytes | None:
    """The SentencePiece model a checkpoint carries, checked against the sha256 recorded with it."""
    files = run_files(ckpt)
    data = files.get("tokenizer_model")
    if data is None:
        return None
    if sha256_bytes(data) != files.get("tokenizer_sha256"):
        raise UserError(
            f"checkpoint {path}: its tokenizer does not match the sha256 recorded with it; the file is "
            f"damaged, use another checkpoint of the run"
        )
    import sentencepiece as spm

    try:  # bytes that match their own sha256 may still be no model (written so by hand, or by another program)
        spm.SentencePieceProcessor(model_proto=data)
    except (RuntimeError, TypeError, ValueError) as e:
        raise UserError(
            f"checkpoint {path}: the tokenizer it carries is not a SentencePiece model ({type(e).__name__}); "
            "the file is damaged, use another checkpoint of the run"
        ) from None
    return data
