"""The run directory: the one module that knows its layout, its files and what they say.

A run's directory depends only on (preset, corpus, row, seed), so rerunning the same command resumes
it instead of starting over::

    OUT/PRESET/CORPUS/ROW/seedS/
        config.json            the resolved config, written before training; a run of another config is refused
        tokenizer.model        the run's SentencePiece model (its sha256 in config.json and in every checkpoint)
        checkpoints/           last.ckpt, stepNNNNNNN.ckpt (the newest periodic ones), requeue.ckpt (SLURM's warning)
        logs/version_N/        Lightning's CSV log of attempt N (training and validation curves)
        dev.hyp, dev.ref       the final dev translations and their references, line by line
        metrics.json           the result, written last (see `RunDir.write_metrics` for its fields)
        wandb-run.json         the run directory's W&B run id and its attempts (`RunDir.wandb_attempt`)
        wandb/                 W&B's own files (with --wandb)
        .lock                  held by the one process that trains the run
    OUT/PRESET/CORPUS/ROW/seedS.log   the training process's output when a sweep ran it

`aiayn hpo` trials live in `OUT/hpo/PRESET/ROW/trialNNNN/` with the same inside. Every file is
written atomically (aiayn.common.files); temporary files a kill leaves behind are removed when the run
restarts. Nothing here imports torch at import time: sweeps and reports read run directories too.
"""

from __future__ import annotations

import json
import logging
import platform
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from aiayn.ablations.table import MODEL_KEYS, SCHEDULE_KNOBS
from aiayn.common.errors import UserError
from aiayn.common.files import (
    UnsafeFile,
    atomic_open,
    atomic_write_json,
    atomic_write_text,
    load_torch_file,
    remove_stale_temps,
    sha256_bytes,
    sha256_file,
)
from aiayn.common.locks import try_lock
from aiayn.common.secrets import redact_obj

log = logging.getLogger(__name__)

REQUEUE_CHECKPOINT = "requeue.ckpt"
STATUSES = ("completed", "failed", "diverged", "pruned")
# without these a metrics.json cannot be placed in a table
REQUIRED_METRICS = ("row", "seed", "preset", "status")
# the parts of config.json that must match for a rerun to resume a run directory
IDENTITY = ("model", "data", "schedule")
_STEP_CKPT = re.compile(r"step(\d+)\.ckpt$")


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def of(cls, out: str | Path, preset: str, corpus: str, row: str, seed: int) -> RunDir:
        return cls(Path(out) / preset / corpus / row / f"seed{seed}")

    @classmethod
    def hpo_trial(cls, out: str | Path, preset: str, row: str, number: int) -> RunDir:
        return cls(Path(out) / "hpo" / preset / row / f"trial{number:04d}")

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
    def sweep_log(self) -> Path:
        return self.path.parent / f"{self.path.name}.log"

    # ---- config.json

    def read_config(self) -> dict | None:
        if not self.config_file.exists():
            return None
        try:
            return json.loads(self.config_file.read_text())
        except (OSError, ValueError) as e:
            raise UserError(
                f"cannot read {self.config_file} ({e}); delete the run directory {self.path} to start over"
            ) from e

    def check_config(self, config: dict) -> None:
        """A run directory holds one config: refuse to resume a run of another one."""
        saved = self.read_config()
        if saved is None:
            return
        for key in IDENTITY:
            old, new = _identity(saved, key) or {}, _identity(config, key)
            if old != new:
                diff = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
                raise UserError(
                    f"run directory {self.path} holds a run of another config ({key} differs: {diff}); "
                    f"use another --out or delete that directory"
                )

    def write_config(self, config: dict) -> None:
        atomic_write_json(self.config_file, redact_obj(config))

    # ---- tokenizer.model

    def write_tokenizer(self, model: Path) -> str:
        """Copy the SentencePiece model the run trains with into the run directory (once); return its
        sha256. A run directory keeps one tokenizer: another one is refused."""
        data = Path(model).read_bytes()
        sha = sha256_bytes(data)
        if self.tokenizer_file.is_file():
            held = sha256_file(self.tokenizer_file)
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
        attempt = {"attempt": n, "mode": mode, "id": f"{base}-a{n}" if split else base,
                   "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
        earlier = [a["id"] for a in record["attempts"]]
        record["attempts"].append(attempt)
        atomic_write_json(self.wandb_record, record)
        name = f"{row}-s{seed}" + (f" attempt {n}" if split else "")
        return {"id": attempt["id"], "name": name, "attempt": n, "base_id": base, "earlier": earlier}

    def read_wandb_record(self) -> dict | None:
        try:
            return json.loads(self.wandb_record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    # ---- metrics.json

    def read_metrics(self) -> dict | None:
        """metrics.json, or None when there is none (or it is unreadable)."""
        try:
            return json.loads(self.metrics_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def status(self) -> str:
        """'completed', 'failed', 'diverged', 'pruned', or 'missing' (no metrics.json yet)."""
        metrics = self.read_metrics()
        return metrics.get("status", "missing") if isinstance(metrics, dict) else "missing"

    def write_metrics(self, config: dict, status: str, **fields) -> dict:
        """The result of a run, from its config and what training measured (`fields`: dev_bleu,
        dev_ppl, steps, ... on completion; error on failure). Secrets are masked."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        r, t = config["row"], config["train"]
        metrics = {
            "row": r["row"], "group": r["group"], "seed": t["seed"], "preset": r["preset"],
            "data": config["data"]["corpus"], "status": status, **fields, "planned_steps": t["steps"],
            "paper_ppl": r["paper_ppl"], "paper_bleu": r["paper_bleu"], "paper_params_m": r["paper_params_m"],
            "config": {k: r[k] for k in MODEL_KEYS}, "deviations": r["deviations"],
            "effective_tokens_per_step": t["effective_tokens_per_step"],
            "host": platform.node(), "torch": _torch_version(),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }  # fmt: skip
        metrics = redact_obj(metrics)
        atomic_write_json(self.metrics_file, metrics)
        return metrics

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

    def periodic_checkpoints(self) -> list[Path]:
        """The kept periodic checkpoints (stepNNNNNNN.ckpt), oldest first."""
        found = [p for p in self.checkpoints.glob("step*.ckpt") if _STEP_CKPT.search(p.name)]
        return sorted(found, key=lambda p: int(_STEP_CKPT.search(p.name)[1]))

    def resume_checkpoint(self) -> Path | None:
        """The checkpoint a rerun resumes from: the newer of `last.ckpt` (periodic) and `requeue.ckpt`
        (saved on SLURM's warning signal). Newer = higher global step; an unreadable file (killed
        mid-save) is passed over."""
        best, best_step = None, -1
        for path in (self.checkpoints / "last.ckpt", self.checkpoints / REQUEUE_CHECKPOINT):
            if not path.is_file():
                continue
            try:  # mmap: reads the step without loading the tensors; weights_only: no code runs (load_torch_file)
                step = load_torch_file(path, map_location="cpu", mmap=True)["global_step"]
            except UnsafeFile as e:  # not a kill's leftover: someone put it there
                raise UserError(f"cannot resume from checkpoint {e}") from None
            except Exception as e:
                log.warning("not resuming from %s: unreadable (%s: %s)", path, type(e).__name__, e)
                continue
            if step >= best_step:  # on a tie the later candidate (the requeue checkpoint) wins
                best, best_step = path, step
        return best


def _new_wandb_id(row: str, seed: int) -> str:
    """ROW-sSEED-<12 random hex>: readable in W&B's URLs, unique across users of one project."""
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', row)}-s{seed}-{secrets.token_hex(6)}"


def _identity(config: dict, key: str) -> dict | None:
    if key == "schedule":
        return {k: config.get("train", {}).get(k) for k in SCHEDULE_KNOBS}
    return config.get(key)


def _torch_version() -> str:
    import torch

    return torch.__version__
