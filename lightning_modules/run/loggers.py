"""Experiment tracking of the user's choice: `--logger csv,tensorboard,mlflow,wandb` (any of them, comma-separated).

Every logger writes under the run directory and keeps one version (or run) per attempt, so that a resumed run
never loses the curves of its earlier attempts:

- csv: `logs/version_N/metrics.csv`, the curves `aiayn report` plots. N is the attempt's own (one more than the
  highest there): Lightning's CSVLogger deletes an existing metrics.csv when it starts.
- tensorboard: `logs/version_N/events.out.tfevents.*`, beside the CSV of the same attempt;
  `tensorboard --logdir runs/` shows every run and attempt live.
- mlflow: one MLflow run per attempt, tagged with its row, seed, preset and corpus, in one store for everything
  under --out, `OUT/mlflow.db` (an SQLite store: MLflow 3 refuses its old file store unless MLFLOW_ALLOW_FILE_STORE
  is set, and SQLite is its documented local default; artifacts in `OUT/mlartifacts`), or wherever
  MLFLOW_TRACKING_URI points (a server); one experiment per sweep, `aiayn-PRESET-CORPUS` (`experiment_name`, the
  W&B project's name too), so that MLflow's UI compares a sweep's rows and seeds side by side, unless
  MLFLOW_EXPERIMENT_NAME says otherwise.
- wandb: lightning_modules/run/wandb_run.py (W&B's own conventions: one W&B run per run directory online).

Every tracker holds the final table (`log_final`): the final evaluation's dev BLEU, tokenized BLEU and perplexity
(`dev/bleu`, `dev/tok_bleu`, `dev/ppl`) as metrics at the last step, beside the run's hyper-parameters: in
TensorBoard's HParams (rows compare in its table), in MLflow (and, with `--log-model`, the final checkpoint as an
artifact), in W&B's summary (wandb_run.finish).

The default is csv, and tensorboard when it is installed: both are plain files, work offline and need no account,
server or setup; tensorboard is an extra (`aiayn[tensorboard]`), so without it the default stays csv alone rather
than failing. Asking for a logger whose package is missing is one line naming the extra to install.

TensorBoard and CSV are created on every rank (Lightning writes from rank 0 only); MLflow and W&B only on global
rank 0, where they would otherwise open a run (and, for MLflow, create its database) per rank.
Nothing here imports torch or Lightning at import time: the command line and the sweeps check `--logger` early.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from aiayn.common.errors import UserError
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.spec import experiment_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoggerKind:
    name: str
    modules: tuple[str, ...]  # any one of them importable is enough
    extra: str | None  # the aiayn extra that installs it (None: a dependency of aiayn)
    package: str  # what pip installs


KINDS = {
    k.name: k
    for k in (
        LoggerKind("csv", (), None, ""),
        # Lightning writes TensorBoard files with torch.utils.tensorboard (the tensorboard package) or tensorboardX
        LoggerKind("tensorboard", ("tensorboard", "tensorboardX"), "tensorboard", "tensorboard"),
        LoggerKind("mlflow", ("mlflow",), "mlflow", "mlflow"),
        LoggerKind("wandb", ("wandb",), None, "wandb"),
    )
}


def _importable(kind: LoggerKind) -> bool:
    for module in kind.modules:
        try:
            importlib.import_module(module)
            return True
        except ImportError:
            continue
    return not kind.modules


def default_loggers() -> tuple[str, ...]:
    """csv, and tensorboard when it is installed (the module docstring says why)."""
    return ("csv", "tensorboard") if _importable(KINDS["tensorboard"]) else ("csv",)


def chosen(logger: str | None, wandb: bool = False) -> tuple[str, ...]:
    """The loggers a run writes with: `--logger NAMES` (None: the default), plus wandb with `--wandb` (kept as a
    short form: sweeps, SLURM scripts and users' commands say `--wandb`). A name that is not a logger, or one whose
    package is missing, is a UserError naming the fix."""
    names = default_loggers() if logger is None else tuple(n.strip().lower() for n in logger.split(","))
    if any(not n for n in names):
        raise UserError(f"--logger {logger!r} names no logger; pass a comma-separated subset of {', '.join(KINDS)}")
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise UserError(f"--logger: unknown logger {unknown[0]!r}; pass a comma-separated subset of {', '.join(KINDS)}")
    names = tuple(dict.fromkeys([*names, *(["wandb"] if wandb else [])]))
    if "wandb" in names:  # a WANDB_MODE W&B does not know: said before a run directory exists
        from aiayn.common.wandb_mode import check_mode

        check_mode()
    for name in names:
        kind = KINDS[name]
        if not _importable(kind):
            how = f"pip install 'aiayn[{kind.extra}]'" if kind.extra else f"pip install {kind.package}"
            raise UserError(
                f"--logger {name} needs the {kind.package} package, which is not installed; {how} "
                f"(or drop {name} from --logger)"
            )
    return names


def of(opts) -> tuple[str, ...]:
    """The loggers a run's TrainOptions choose."""
    return chosen(opts.logger, opts.wandb)


def mlflow_uri(out_root) -> tuple[str, str | None]:
    """(tracking URI, artifact location): MLFLOW_TRACKING_URI when set (its server or database decides where
    artifacts go), else the SQLite store `mlflow.db` at the root of --out, with artifacts beside it: one store for
    every run and sweep there."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri, None
    root = Path(out_root).resolve()
    return f"sqlite:///{root / 'mlflow.db'}", (root / "mlartifacts").as_uri()


def mlflow_experiment(preset: str, corpus: CorpusRef) -> str:
    """The experiment of a sweep, unless MLFLOW_EXPERIMENT_NAME."""
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or experiment_name(preset, corpus)


# metrics.json's final dev numbers, under the slash names every tracker gets them as
FINAL = {"dev_bleu": "dev/bleu", "dev_tok_bleu": "dev/tok_bleu", "dev_ppl": "dev/ppl"}


def budget_values(metrics) -> dict:
    """What the trackers hold of a run's budget beside its final numbers: the steps it trained, its row's budget at
    its preset, and 1.0 where it stopped short of it (`--max-steps`: a look, not the preset's table), so that a
    tracker's table of runs shows which numbers are capped."""
    if metrics.budget_steps is None:
        return {}
    return {
        "budget/steps": float(metrics.steps or 0),
        "budget/budget_steps": float(metrics.budget_steps),
        "budget/capped": float(metrics.capped),
    }


MODEL_README = """\
# aiayn model: {row} seed {seed} at preset {preset}, {steps} steps{capped}

An MLflow Model (pyfunc, MLflow 3's logged model `{name}` of this run): `mlflow.pyfunc.load_model(URI).predict(["A
man."])` (or a DataFrame with a `text` column) returns the translations, beam search as the paper decodes
(`params={{"beam": 1}}` for greedy). It carries the aiayn code it runs (`code/aiayn`); its environment needs
{requirements}.

`artifacts/` holds the run's final checkpoint `last.ckpt` (it carries its config and its SentencePiece tokenizer,
and loads without running code: weights only), and the same `config.json` and `tokenizer.model` beside it to read:

    aiayn translate --ckpt last.ckpt < sentences.en > sentences.de        # or, in Python:
    python -c "from aiayn import Translator; print(Translator.from_checkpoint('last.ckpt').translate(['A man.']))"
    aiayn export --ckpt last.ckpt --format hf --out hf-model               # MarianMTModel + its tokenizer

dev BLEU {bleu} (sacreBLEU `{signature}`), dev perplexity {ppl}.
"""
# the pyfunc model's code (MLflow's models from code): a file the logged model carries, not an import of this layer
MODEL_CODE = Path(__file__).resolve().parents[1] / "use" / "mlflow_model.py"
MODEL_NAME = "model"
# what the model's code imports (translation: lightning_modules/use/translate.py), for the environment MLflow builds
MODEL_REQUIREMENTS = ["torch", "sentencepiece", "sacrebleu", "numpy", "pandas", "mlflow>=3"]


def bundle_aiayn(where: Path) -> Path:
    """The aiayn code a logged model runs, as one package folder `where/aiayn` (MLflow's `code_paths`): the command
    line's plumbing, ablations/ and lightning_modules/ (where the translator lives), Python files and their data
    only. aiayn installs from folders of a checkout (pyproject's package-dir), so the installed modules are copied,
    wherever they are, into the layout `import aiayn` finds."""
    import shutil

    import aiayn
    from aiayn import ablations, lightning_modules

    keep = shutil.ignore_patterns("__pycache__", "*.pyc")
    top = where / "aiayn"
    shutil.copytree(Path(aiayn.__file__).parent, top, ignore=keep, dirs_exist_ok=True)
    for package in (ablations, lightning_modules):
        target = top / package.__name__.rsplit(".", 1)[1]
        shutil.copytree(Path(package.__file__).parent, target, ignore=keep, dirs_exist_ok=True)
    return top


def log_model_files(logger, checkpoint, metrics) -> None:
    """With --log-model, an MLflow 3 logged model of the run (`MODEL_NAME`, found by `mlflow.search_logged_models`
    and in the UI's Models tab): a pyfunc model (`MODEL_CODE`) of the final checkpoint, carrying the aiayn code it
    runs (`bundle_aiayn`) and its requirements, its signature from the code's type hints and an input example (a
    list of strings; `beam` a parameter, the paper's 4 by default), with the run's config.json, tokenizer and a
    README saying how to load, translate and export it. Written without MLflow's progress bars or warnings on
    aiayn's output (its own log lines at WARNING and above still reach it)."""
    import io
    import shutil
    import tempfile
    import warnings
    from unittest import mock

    import mlflow

    from aiayn.lightning_modules.transformer.config import PAPER_DECODING

    checkpoint = Path(checkpoint)
    run = checkpoint.parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = tmp / "files"
        files.mkdir()
        for name in ("config.json", "tokenizer.model", "metrics.json"):
            if (run / name).is_file():
                shutil.copy2(run / name, files / name)
        capped = f" (capped: {metrics.steps} of its {metrics.budget_steps})" if metrics.capped else ""
        (files / "README.md").write_text(
            MODEL_README.format(
                row=metrics.row,
                seed=metrics.seed,
                preset=metrics.preset,
                steps=metrics.steps,
                capped=capped,
                name=MODEL_NAME,
                requirements=", ".join(f"`{r}`" for r in MODEL_REQUIREMENTS),
                bleu=metrics.dev_bleu,
                signature=metrics.dev_bleu_signature,
                ppl=metrics.dev_ppl,
            ),
            encoding="utf-8",
        )
        artifacts = {"checkpoint": str(checkpoint), **{p.stem: str(p) for p in sorted(files.iterdir())}}
        shutil.copy2(MODEL_CODE, tmp / MODEL_CODE.name)  # MLmodel records the code's path: a temporary one, not ours
        quiet = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
        with (
            mock.patch.dict(os.environ, quiet),  # restored on the way out
            _tracking(logger.experiment.tracking_uri),
            _level("mlflow", logging.WARNING),
            warnings.catch_warnings(),
            contextlib.redirect_stderr(io.StringIO()),
            mlflow.start_run(run_id=logger.run_id),
        ):
            warnings.simplefilter("ignore")
            mlflow.pyfunc.log_model(
                name=MODEL_NAME,
                python_model=str(tmp / MODEL_CODE.name),
                artifacts=artifacts,
                code_paths=[str(bundle_aiayn(tmp / "code"))],
                pip_requirements=MODEL_REQUIREMENTS,
                input_example=(["A man."], {"beam": PAPER_DECODING.beam}),
            )


@contextlib.contextmanager
def _tracking(uri: str):
    """MLflow's fluent API (start_run, log_model) on the store of the run's logger, and the global store as it was
    after."""
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)


@contextlib.contextmanager
def _level(name: str, level: int):
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def log_final(trainer, metrics, params: dict, checkpoint=None) -> None:
    """The run's final dev numbers into the trackers that hold a table (the module docstring), after training ended:
    TensorBoard's HParams session (the run's flat config with its final metrics) and its scalars at the last step;
    MLflow's metrics at the last step and, with `checkpoint`, the artifact `model/` (`log_model_files`). A
    tracker that fails here is logged and skipped: the run's result is already in metrics.json."""
    values = {name: float(getattr(metrics, key)) for key, name in FINAL.items() if getattr(metrics, key) is not None}
    if not values:
        return
    values.update(budget_values(metrics))
    step = int(metrics.steps or 0)
    for logger in trainer.loggers:
        kind = type(logger).__name__
        try:
            if kind == "TensorBoardLogger":
                # the HParams plugin's session (config and final metrics) and the final scalars, once, at the last
                # step: without `step` Lightning logs them at step 0 too, a flat line from the start of every curve
                logger.log_hyperparams(params, values, step=step)
                logger.finalize("success")
            elif kind == "MLFlowLogger":
                logger.log_metrics(values, step)
                logger.experiment.set_tag(logger.run_id, "capped", str(metrics.capped).lower())
                if checkpoint is not None:
                    log_model_files(logger, checkpoint, metrics)
        except Exception as e:  # a tracker's failure must not turn a finished run into a failed one
            log.warning("%s: could not log the final dev numbers: %s: %s", kind, type(e).__name__, e)


def build(names: tuple[str, ...], run, config, *, rank_zero: bool, out_root=None) -> list:
    """Lightning loggers for this attempt of `run` (a RunDir) with `config` (its RunConfig, secrets masked); MLflow's
    store at `out_root` (the --out the run lies under; default: the run directory)."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    if "csv" not in names:
        log.warning("--logger without csv: `aiayn report` plots no training curves for this run")
    version = run.next_log_version()
    if rank_zero:  # the attempt's number, whichever loggers write there (MLflow names its run by it)
        (run.logs / f"version_{version}").mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        if name == "csv":  # each line on disk when logged, for a reader while it trains (wide_pilot.py watch)
            out.append(CSVLogger(run.path, name=run.logs.name, version=version, flush_logs_every_n_steps=1))
        elif name == "tensorboard":  # no hp_metric placeholder: our metrics are named train/…, val/…
            out.append(TensorBoardLogger(run.path, name=run.logs.name, version=version, default_hp_metric=False))
        elif name == "mlflow" and rank_zero:
            out.append(_mlflow(run, config, version, out_root if out_root is not None else run.path))
        elif name == "wandb" and rank_zero:
            from aiayn.lightning_modules.run import wandb_run

            logger = wandb_run.wandb_logger(run, config)
            out += [logger] if logger is not None else []
    return out


def _mlflow(run, config, version: int, out_root):
    from lightning.pytorch.loggers import MLFlowLogger

    spec, seed = config.spec, config.train.seed
    uri, artifacts = mlflow_uri(out_root)
    name = f"{spec.row}-s{seed}" + (f" attempt {version + 1}" if version else "")
    tags = {
        "row": spec.row,
        "group": spec.group,
        "seed": str(seed),
        "preset": spec.preset.name,
        "corpus": config.data.corpus.name,
        "attempt": str(version + 1),
        "run_dir": str(run.path.resolve()),
    }
    experiment = mlflow_experiment(spec.preset.name, config.data.corpus)
    log.info("MLflow: run %r of experiment %s at %s", name, experiment, uri)
    # tracking_uri given here: MLFlowLogger's own default reads MLFLOW_TRACKING_URI when Lightning is imported
    return MLFlowLogger(
        experiment_name=experiment, run_name=name, tracking_uri=uri, tags=tags, artifact_location=artifacts
    )
