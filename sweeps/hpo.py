"""`aiayn hpo`: Optuna TPE over the learning-rate factor, warmup and dropout (or the knobs of `--space FILE`) of one
row, with median pruning on `val/ppl` at every validation (`--val-every`, default the preset's), reported by global
step (`StepPruning`: optuna-integration's PyTorchLightningPruningCallback reports by epoch, so a run that validates
every N steps within one epoch would report one value, and a short run none).

Label smoothing is not in the default space: the objective is dev perplexity, which smoothing raises by construction
(a smoothed model's floor is 1/(1 − ε + ε/V), not 1), so a search over ε against perplexity would learn that
arithmetic, not the paper's claim (that smoothing helps BLEU). Search it with `--space` on purpose, knowing that.

Trials train in this process, one after another, on one device (`--accelerator`, default auto: the GPU when there is
one; every other `aiayn train` option too: data, precision, max tokens): Optuna must never live inside DDP ranks
(every rank would ask for its own trial), so more than one device is refused. With `--backend subprocess` each trial
trains in a fresh `aiayn hpo` process, `--jobs` at once: this process asks the trial and fixes its parameters in the
study (under the books' lock), the child finds it by number (`AIAYN_HPO_TRIAL`), trains it with the same pruning
callback reporting to the study's storage (its URL in the child's environment, `AIAYN_HPO_STORAGE`: never on a
command line or in a file), and leaves its outcome in the trial's user attributes; this process tells it. A back end
reads as able to run trials from its `Capabilities`. The objective is the final dev perplexity (minimized, the same
direction as the pruned metric); the best parameters are printed and saved.

`--trials N` is the search's size: a rerun runs only the trials still missing, so an interrupted
search resumes. Trials are asked and told one by one under the same books as `aiayn table3`'s (sweeps/books.py:
a trial is popped and claimed under one lock), so a trial left RUNNING by a killed search is stale at once: it
is failed and its parameters are enqueued again, with its run directory, and the retry resumes that trial's
training from its last checkpoint. A trial's metrics.json says kind "hpo": it never enters a Table 3 report.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
)
from optuna.trial import TrialState

from aiayn.ablations.knobs import KNOBS, OVERRIDABLE, parse_value
from aiayn.ablations.presets import get_preset
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json, atomic_write_text, check_writable_dir, read_json
from aiayn.common.options import LIMITS, option, read_mapping
from aiayn.lightning_modules.run import loggers
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.spec import RunSpec, spec_of
from aiayn.sweeps import books
from aiayn.sweeps.backends import BackendNames
from aiayn.sweeps.folders import SweepOut
from aiayn.sweeps.storage import check_readable, open_storage

log = logging.getLogger(__name__)


HPO_SKIP = ("train.progress",)  # trials print one line each as they end; a trial is one run


@dataclass
class HpoOptions:
    """`aiayn hpo`: how many trials, where Optuna keeps the study, and how each trial trains (`train`:
    every `aiayn train` option; the searched knobs are set per trial on top of its `--set`)."""

    trials: int = option(10)
    """trials in the search; a rerun runs the missing ones (an interrupted one resumes)"""
    space: str | None = option(None, metavar="FILE")
    """a YAML file of the search space, one entry per knob (any `--set` key): `{low: L, high: H}` with optional `log:
    true` and `step: S`, or `{choices: [...]}` (default: lr_factor, warmup, P_drop around the paper's values; label
    smoothing only by this file: its dev perplexity moves by smoothing's arithmetic, so tuning on val/ppl would choose
    it by its floor)"""
    storage: str | None = option(None)
    """Optuna storage URL (default: sqlite:///OUT/hpo.db)"""
    backend: str = option("local", choices=BackendNames())
    """where trials train: local (one after another in this process) or subprocess (each in a fresh `aiayn hpo` process,
    --jobs at once, its pruning reports going to the study's storage); a back end that cannot run trials (slurm) is
    refused with its reason"""
    jobs: int = option(1, positive=True, at_most=LIMITS["jobs"])
    """trials at once (--backend subprocess)"""
    train: TrainOptions = field(default_factory=lambda: TrainOptions(progress=False))


def default_space(preset) -> dict[str, BaseDistribution]:
    """The search space, centred on the paper's values (and the preset's warmup); not label smoothing (the module
    docstring says why)."""
    return {
        "lr_factor": FloatDistribution(0.25, 4.0, log=True),
        "warmup": IntDistribution(max(1, preset.warmup // 4), preset.warmup * 4, log=True),
        "P_drop": FloatDistribution(0.0, 0.4),
    }


OBJECTIVE = "dev_ppl"  # the metric name optuna-dashboard shows for "Objective 0"; trials_dataframe()'s `value_dev_ppl`


def objective_sentences(t) -> str:
    """What a trial's objective is measured on: the final evaluation's dev set, which --eval-subset cuts, while the
    values pruning compares (val/ppl at each validation) are the whole dev set's."""
    if t.eval_subset is None:
        return "final dev perplexity on the whole dev set, as pruning reads it at every validation"
    return (
        f"final dev perplexity on the first {t.eval_subset} dev sentences (--eval-subset); pruning read the whole "
        "dev set's at every validation: compare trials by their objectives, not with their pruning curves"
    )


class StepPruning:
    """A Lightning callback: after every validation (not the sanity check), report `monitor` to the trial at the
    global step and raise optuna.TrialPruned when the pruner says so. Built lazily (`StepPruning.make`) so that
    importing this module does not import Lightning."""

    @staticmethod
    def make(trial: optuna.Trial, monitor: str = "val/ppl"):
        import lightning.pytorch as pl

        class _StepPruning(pl.Callback):
            def on_validation_end(self, trainer, pl_module) -> None:
                if trainer.sanity_checking or monitor not in trainer.callback_metrics:
                    return
                step = trainer.global_step
                value = float(trainer.callback_metrics[monitor])
                trial.report(value, step=step)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at step {step}: {monitor} {value:.4g}")

        return _StepPruning()


def read_space(path: str) -> dict[str, BaseDistribution]:
    """`--space FILE`: each knob (a `--set` key) as {low, high[, log][, step]} or {choices: [...]}, typed as the
    knob is (integers for N, h, warmup, ...); every mistake is one line naming the knob."""
    doc = read_mapping(path, "a YAML file like `P_drop: {low: 0.0, high: 0.3}` (see `aiayn hpo --help`)")
    space = {}
    for key, spec in doc.items():
        if key not in OVERRIDABLE:
            raise UserError(f"--space {path}: {key!r} is not a knob; use --set keys ({', '.join(OVERRIDABLE)})")
        bad = f"--space {path}: {key} must be {{low: L, high: H}} (optionally log: true, step: S) or {{choices: [...]}}"
        if not isinstance(spec, dict):
            raise UserError(bad)
        try:
            if "choices" in spec and set(spec) == {"choices"}:
                space[key] = CategoricalDistribution([parse_value(key, str(c)) for c in spec["choices"]])
            elif {"low", "high"} <= set(spec) <= {"low", "high", "log", "step"}:
                if KNOBS[key].type not in (int, float):  # pe, norm_first: named values, no range between them
                    raise UserError(
                        f"--space {path}: {key} takes named values, not a range; give them as {{choices: [...]}} "
                        f"(see `aiayn hpo --help`)"
                    )
                kind = IntDistribution if KNOBS[key].type is int else FloatDistribution
                cast = int if kind is IntDistribution else float
                step = spec.get("step")
                for bound in ("low", "high"):  # each end a value the knob may take (N >= 1, finite numbers)
                    parse_value(key, str(cast(spec[bound])))
                space[key] = kind(
                    cast(spec["low"]),
                    cast(spec["high"]),
                    log=bool(spec.get("log", False)),
                    step=cast(step) if step is not None else (1 if kind is IntDistribution else None),
                )
            else:
                raise UserError(bad)
        except (TypeError, ValueError) as e:
            raise UserError(f"{bad} ({e})") from None
    if not space:
        raise UserError(f"--space {path} names no knob; add one, e.g. `P_drop: {{low: 0.0, high: 0.3}}`")
    return space


def space_of(opts: HpoOptions, preset) -> dict[str, BaseDistribution]:
    return read_space(opts.space) if opts.space else default_space(preset)


def suggest(trial: optuna.Trial, space: dict[str, BaseDistribution]) -> dict:
    """One value per knob of `space`, through Optuna's public suggest API."""
    out = {}
    for name, d in space.items():
        if isinstance(d, CategoricalDistribution):
            out[name] = trial.suggest_categorical(name, d.choices)
        elif isinstance(d, IntDistribution):
            out[name] = trial.suggest_int(name, d.low, d.high, log=d.log, step=d.step)
        else:
            out[name] = trial.suggest_float(name, d.low, d.high, log=d.log, step=d.step)
    return out


def _key(trial) -> str:
    return f"trial{trial.number:04d}"


def objective(opts: HpoOptions, trial: optuna.Trial, spec: RunSpec) -> float:
    """One trial: `spec` (the row as the search resolved it, once) with the trial's parameters on top."""
    from aiayn.lightning_modules.run.train import Hooks, train

    t = opts.train
    preset = get_preset(t.preset)
    params = suggest(trial, space_of(opts, preset))
    # a retried trial (its search was killed) goes on in the run directory it started
    trial_dir = SweepOut(t.out).hpo_trial(preset.name, t.row, trial.number)
    run_dir = trial.user_attrs.get("resume_dir") or str(trial_dir.path)
    trial.set_user_attr("run_dir", run_dir)
    hooks = Hooks(
        callbacks=(StepPruning.make(trial, "val/ppl"),),
        val_per_epoch=False,
        run_dir=run_dir,
        kind="hpo",
        status_of=lambda e: "pruned" if isinstance(e, optuna.TrialPruned) else None,
    )
    metrics = train(
        replace(t, overrides={**t.overrides, **params}, progress=False), spec.with_overrides(params), hooks=hooks
    )
    if metrics.status == "diverged":  # a result, not a crash: the search goes on without it
        trial.set_user_attr("diverged_at_step", metrics.diverged_at_step)
        raise optuna.TrialPruned(f"diverged: {metrics.error}")
    trial.set_user_attr("dev_bleu", metrics.dev_bleu)
    log.info("trial %d: dev PPL %.3f, BLEU %.2f with %s", trial.number, metrics.dev_ppl, metrics.dev_bleu, params)
    return metrics.dev_ppl


def _requeue(study: optuna.Study):
    def again(t: optuna.trial.FrozenTrial) -> None:
        resume = t.user_attrs.get("run_dir")
        study.enqueue_trial(t.params, user_attrs={"resume_dir": resume} if resume else None)
        log.warning(
            "trial %d was left running by a search that died: failed, its parameters enqueued again%s",
            t.number,
            f" (resuming {resume})" if resume else "",
        )

    return again


TRIAL_ENV, STORAGE_ENV, SPEC_ENV = "AIAYN_HPO_TRIAL", "AIAYN_HPO_STORAGE", "AIAYN_HPO_SPEC"


def study_of(t: TrainOptions) -> str:
    """The search's Optuna study (and its books' name): one per preset and row."""
    return f"hpo-{t.preset}-{t.row}"


def storage_url(opts: HpoOptions) -> str:
    return opts.storage or SweepOut(opts.train.out).study_url("hpo")


def _trial_id(storage: optuna.storages.BaseStorage, study: str, number: int) -> int:
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study), number)


def trials_backend(opts: HpoOptions) -> str:
    """How `opts.backend` runs trials ("here" or "processes", its `Capabilities.trials`), or a UserError saying why
    it cannot."""
    from aiayn.sweeps.backends import load

    found = load()
    cls = found.get(opts.backend)
    if cls is None:
        raise UserError(f"unknown back end {opts.backend!r}; choose one of {', '.join(sorted(found))}")
    how = cls.capabilities.trials
    if how is None:
        able = ", ".join(sorted(n for n, c in found.items() if c.capabilities.trials))
        why = cls.capabilities.no_trials or "it declares no way to"
        raise UserError(
            f"--backend {opts.backend} cannot run hpo trials ({why}); pass --backend {able.replace(', ', ' or ')}"
        )
    if how == "here" and opts.jobs > 1:
        raise UserError(
            f"--backend {opts.backend} trains trials one after another in this process; drop --jobs "
            f"{opts.jobs}, or pass --backend subprocess to train {opts.jobs} at once"
        )
    return how


def run_hpo(opts: HpoOptions) -> dict:
    t = opts.train
    if os.environ.get(TRIAL_ENV):  # a trial's own process, started by a search with --backend subprocess
        return train_one_trial(opts, int(os.environ[TRIAL_ENV]))
    if opts.trials < 1:
        raise UserError(f"--trials must be at least 1, got {opts.trials}")
    how = trials_backend(opts)
    if t.world_size > 1:
        raise UserError(
            f"aiayn hpo trains each trial in its own process on one device, not {t.world_size}; drop "
            f"--devices/--num-nodes (Optuna cannot run inside DDP ranks)"
        )
    if t.eval_subset is not None:  # the objective and the pruned values are then numbers of other sentences
        log.warning("%s", objective_sentences(t))
    spec = spec_of(t)  # the row, resolved once for every trial; unknown row or preset: before any study exists
    space = {k: distribution_to_json(d) for k, d in space_of(opts, get_preset(t.preset)).items()}
    loggers.of(t)  # and an unknown logger or a missing package
    check_writable_dir(t.out, "--out")
    out = SweepOut(t.out)
    check_readable(storage_url(opts))
    storage = open_storage(storage_url(opts), create_dir=out.root)
    study = optuna.create_study(
        study_name=study_of(t),
        storage=storage,
        direction="minimize",
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
        load_if_exists=True,
    )
    searched = study.user_attrs.get("space")
    if searched is not None and searched != space and study.get_trials(deepcopy=False):
        raise UserError(
            f"study {study.study_name} under {out.root} searched another space ({searched}); pass the "
            f"same --space to go on with it, or another --out for a new search"
        )
    study.set_user_attr("space", space)
    with warnings.catch_warnings():  # experimental in Optuna 4 (since 3.2), and the dashboard reads it
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([OBJECTIVE])
    # seeded by the trials so far: a resumed search continues the sampler's sequence, not its start again
    study.sampler = optuna.samplers.TPESampler(seed=t.seed + len(study.get_trials(deepcopy=False)))
    claims, pop_lock = books.LockClaims(out, study_of(t)), out.lock(f"{study.study_name}.pop")
    books.fail_stale_trials(study, pop_lock, claims, _key, on_stale=_requeue(study))
    done = sum(x.state in (TrialState.COMPLETE, TrialState.PRUNED) for x in study.get_trials(deepcopy=False))
    if done < opts.trials:
        log.info("hpo %s: %d of %d trials done, running %d", study.study_name, done, opts.trials, opts.trials - done)
    failed_here = 0
    if how == "here":
        for _ in range(opts.trials - done):
            _run_trial(study, opts, spec, claims, pop_lock, lambda trial: objective(opts, trial, spec))
    else:
        failed_here = in_processes(opts, spec, study.study_name, opts.trials - done, claims, pop_lock, t.seed + done)
    complete = [trial for trial in study.trials if trial.state == optuna.trial.TrialState.COMPLETE]
    counts = {
        "trials": len(study.trials),
        "completed": len(complete),
        "pruned": sum(x.state.name == "PRUNED" for x in study.trials),
        "failed": sum(x.state.name == "FAIL" for x in study.trials),
        "failed_here": failed_here,
    }
    if not complete:  # an outcome of the search, not a usage error: the caller exits 1
        log.error(
            "no hpo trial of %s at %s completed (%d pruned, %d failed); add --trials or widen --space",
            t.row,
            t.preset,
            counts["pruned"],
            counts["failed"],
        )
        return {"row": t.row, "preset": t.preset, "study": study.study_name, "best_trial": None, **counts}
    best = study.best_trial
    train_again = best_run(t, best.params, out.hpo_best(t.preset, t.row).with_name("best.yaml"))
    result = {
        "row": t.row,
        "preset": t.preset,
        "study": study.study_name,
        "best_trial": best.number,
        "best_dev_ppl": best.value,
        "objective": objective_sentences(t),
        "best_params": best.params,
        "dev_bleu": best.user_attrs.get("dev_bleu"),
        **train_again,
        **counts,
    }
    atomic_write_json(out.hpo_best(t.preset, t.row), result)
    log.info(
        "the best trial (%d) trains again with `%s`, or `%s`", best.number, train_again["train"], train_again["set"]
    )
    return result


def best_run(t, params: dict, config: Path) -> dict:
    """How to train the best trial again: `config`, written here, the search's training options with the trial's
    knobs on top (the file `aiayn train --config` reads, secrets masked as --print-config masks them), and the same
    run as a command line of `--set`s."""
    import shlex

    import yaml

    from aiayn.common.options import to_argv, to_config
    from aiayn.common.secrets import redact

    again = replace(t, overrides={**t.overrides, **params}, progress=True)  # a trial's bars are off; a run's on
    atomic_write_text(config, redact(yaml.safe_dump(to_config(again), sort_keys=False)))
    line = redact(shlex.join(["aiayn", "train", *to_argv(again, always=("row", "preset"))]))
    return {"train_config": str(config), "train": f"aiayn train --config {shlex.quote(str(config))}", "set": line}


def hpo_exit_status(result: dict) -> int:
    """1 when every trial was pruned or failed, or a trial of this search's own processes failed (results of the
    search, not usage errors, which are 2); else 0 (a trial's own process: 0 once its outcome is in the study,
    pruned or not)."""
    return 0 if "trial" in result else int(result["best_trial"] is None or result["failed_here"] > 0)


class TrialFailed(Exception):
    """A trial's own process ended without an outcome: the trial is FAIL and the search goes on."""


def _run_trial(study: optuna.Study, opts: HpoOptions, spec: RunSpec, claims, pop_lock, train_trial) -> bool:
    """Ask one trial (a queued retry first) and claim it under the pop lock, train it (`train_trial(trial)`: its
    objective value, optuna.TrialPruned, or TrialFailed), tell its outcome; False when it failed."""
    with books.pop_and_claim(study, pop_lock, claims, _key, study.ask) as (trial, _, held):
        try:
            value = train_trial(trial)
        except optuna.TrialPruned as e:
            trial.set_user_attr("pruned", str(e))
            study.tell(trial, state=TrialState.PRUNED)
            log.info("trial %d: %s, with %s", trial.number, str(e) or "pruned", trial.params)
        except TrialFailed as e:
            trial.set_user_attr("failed", str(e))
            study.tell(trial, state=TrialState.FAIL)
            log.error("%s", e)
            return False
        except BaseException:
            study.tell(trial, state=TrialState.FAIL)
            raise
        else:
            study.tell(trial, value)
        finally:
            if held is not None:
                held.close()
    return True


# --- trials in processes of their own (--backend subprocess) -----------------------------------------------------


def in_processes(opts: HpoOptions, spec: RunSpec, name: str, todo: int, claims, pop_lock, seed: int) -> int:
    """`todo` trials, `opts.jobs` at once, each trained by a fresh `aiayn hpo` process (`trial_process`); each worker
    asks and tells through a study object of its own (Optuna caches per storage object, as separate searches would)
    with a sampler seeded apart. Returns how many of them failed."""
    from concurrent.futures import ThreadPoolExecutor

    url = storage_url(opts)
    left, failed, lock = [todo], [0], threading.Lock()

    def worker(slot: int) -> None:
        study = optuna.load_study(
            study_name=name, storage=open_storage(url), sampler=optuna.samplers.TPESampler(seed=seed + slot)
        )
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            if not _run_trial(study, opts, spec, claims, pop_lock, lambda t: trial_process(opts, spec, t, url)):
                with lock:
                    failed[0] += 1

    with ThreadPoolExecutor(opts.jobs) as pool:
        for future in [pool.submit(worker, slot) for slot in range(opts.jobs)]:
            future.result()
    return failed[0]


def trial_process(opts: HpoOptions, spec: RunSpec, trial: optuna.Trial, url: str) -> float:
    """Train `trial` in a fresh `aiayn hpo` process: its parameters fixed in the study here (the child's suggest
    reads them back), the child given the search's options as a file, the trial's number, the row as this search
    resolved it and the storage's URL in its environment; its outcome read back from the trial's user attributes."""
    import subprocess
    import sys

    from aiayn.common.options import to_config
    from aiayn.lightning_modules.run.options import resolved_run
    from aiayn.sweeps.backends.processes import PORTS, child_environment
    from aiayn.sweeps.backends.queue import _threads, attempt_header

    t = opts.train
    suggest(trial, space_of(opts, get_preset(t.preset)))
    folder = SweepOut(t.out).backend("subprocess") / "hpo" / trial.study.study_name
    stem = folder / f"trial{trial.number:04d}"
    child = replace(opts, storage=None, backend="local", jobs=1)
    atomic_write_json(stem.with_suffix(".options.json"), to_config(child, skip=HPO_SKIP))
    atomic_write_json(stem.with_suffix(".spec.json"), resolved_run(spec.to_dict(), "aiayn hpo --backend subprocess"))
    env = child_environment(PORTS.take(), None, _threads(opts.jobs))
    env.update({TRIAL_ENV: str(trial.number), STORAGE_ENV: url, SPEC_ENV: str(stem.with_suffix(".spec.json"))})
    with open(stem.with_suffix(".log"), "a") as out:
        out.write(attempt_header())
        out.flush()
        cmd = [sys.executable, "-m", "aiayn", "hpo", "--config", str(stem.with_suffix(".options.json"))]
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    storage = open_storage(url)  # a fresh one: what the child wrote, not a cached copy
    outcome = storage.get_trial(_trial_id(storage, trial.study.study_name, trial.number)).user_attrs.get("outcome")
    if code != 0 or not isinstance(outcome, dict):
        raise TrialFailed(
            f"trial {trial.number} failed: its process ended with exit code {code} and no outcome; its log: "
            f"{stem.with_suffix('.log')}"
        )
    if "pruned" in outcome:
        raise optuna.TrialPruned(outcome["pruned"])
    return float(outcome["value"])


def train_one_trial(opts: HpoOptions, number: int) -> dict:
    """A trial's own process: find trial `number` of the search's study in the storage its environment names,
    train it as `objective` does (pruning reports go to the storage) on the row as the search resolved it (its file,
    also named by the environment: no row resolved a second time), and leave the outcome in its user attributes for
    the search to tell."""
    name = study_of(opts.train)
    storage = open_storage(os.environ[STORAGE_ENV])
    trial = optuna.trial.Trial(optuna.load_study(study_name=name, storage=storage), _trial_id(storage, name, number))
    spec = RunSpec.from_dict(read_json(Path(os.environ[SPEC_ENV]))["spec"])
    try:
        outcome = {"value": objective(opts, trial, spec)}
    except optuna.TrialPruned as e:
        outcome = {"pruned": str(e)}
    trial.set_user_attr("outcome", outcome)
    return {"row": opts.train.row, "preset": opts.train.preset, "study": name, "trial": number, **outcome}
