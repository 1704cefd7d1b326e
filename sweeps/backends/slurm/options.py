"""What `aiayn slurm` takes: the resources to ask SLURM for and the command's options."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from aiayn.ablations.selection import Selection
from aiayn.common.options import option
from aiayn.lightning_modules.run.options import TrainOptions

# Strategies that start their own processes: under srun, SLURM starts one process per device instead.
SPAWNING = ("ddp_spawn", "ddp_fork", "ddp_notebook")

# srun runs this; `aiayn` is on PATH wherever the package is installed (jobs inherit the submitter's env).
TRAIN = "aiayn train"


@dataclass
class SlurmResources:
    """What to ask SLURM for, per array task (one run)."""

    partition: str | None = option(None)
    """the partition (see `sinfo -s` for the cluster's)"""
    account: str | None = option(None)
    """the account to charge"""
    time: str | None = option(None)
    """time limit per attempt, HH:MM:SS or D-HH:MM:SS (SLURM's formats)"""
    nodes: int = option(1, positive=True)
    """nodes per run (the Trainer's num_nodes)"""
    gpus_per_node: int | None = option(None, positive=True)
    """GPUs per node = srun tasks per node"""
    tasks_per_node: int | None = option(None, positive=True)
    """srun tasks per node, with --accelerator cpu"""
    cpus_per_task: int | None = option(None, positive=True)
    """CPU cores per srun task (OMP_NUM_THREADS follows)"""
    mem: str | None = option(None)
    """memory per node, e.g. 64G (default: the partition's)"""
    signal_lead: int = option(90, positive=True)
    """seconds between the warning signal (USR1) and the time limit"""
    max_parallel: int | None = option(None, positive=True)
    """array tasks running at once (default: no throttle)"""
    setup: tuple[str, ...] = option(())
    """a shell line before srun, e.g. 'source venv/bin/activate' (repeatable)"""
    sbatch: tuple[str, ...] = option(())
    """another #SBATCH option, e.g. --qos=high (repeatable)"""
    assume_shared: bool = option(False)
    """--out is on a shared filesystem though /proc/mounts says not"""


# The options of `aiayn table3` that the SLURM back end cannot honour, each (option, flag, what it does instead):
# its command does not take them, and answers each in one line, exit 2
REFUSED = (
    ("jobs", "--jobs", "SLURM runs each pair as its own array task; throttle them with --max-parallel N"),
    ("gpus_per_job", "--gpus-per-job", "SLURM gives each array task its GPUs; ask for them with --gpus-per-node G"),
    (
        "storage",
        "--storage",
        "SLURM's books are its job array and the run directories under --out, not an Optuna storage",
    ),
)
# The sweep's run options that follow the SLURM resources unless given (checked to agree where given); the
# accelerator `auto`, as everywhere, is resolved against the resources (`with_accelerator`)
FOLLOW_RESOURCES = {"devices": None, "num_nodes": None, "strategy": None}


@dataclass
class SlurmSweepOptions:
    """The SLURM back end's own options, beside the sweep's (`aiayn table3 --backend slurm`): what to ask SLURM for,
    and whether to wait for the array."""

    resources: SlurmResources = field(default_factory=SlurmResources)
    wait: bool = option(False)
    """block until the jobs end; exit 1 if any run did not complete"""
    poll_s: float = option(5.0, cli=False)
    # the sweep's options whose meaning SLURM changes (the same names: these replace the sweep's)
    report: str | None = option(None)
    """report directory (default: OUT/reports; '' for none): written by a job that runs when the array has ended (sbatch
    --dependency=afterany), or here after --wait"""
    dry_run: bool = option(False)
    """write and print the script, submit nothing"""


# What `aiayn slurm train` (one run) does not take: the sweep's selection and report, its back end
ONE_RUN = (
    "select.rows",
    "select.extended",
    "select.seeds",
    "select.base_seeds",
    "select.first_seed",
    "report",
    "train.progress",
)


@dataclass
class SlurmOptions:
    """`aiayn slurm table3|train`: what to run (table3: `select`'s rows x seeds; train: `train`'s row
    and seed), how each run trains (`train`), what to ask SLURM for (`resources`), and whether to wait."""

    kind: str = option("table3", cli=False)  # table3 | train
    select: Selection = field(default_factory=Selection)
    train: TrainOptions = field(default_factory=lambda: TrainOptions(progress=False, **FOLLOW_RESOURCES))
    resources: SlurmResources = field(default_factory=SlurmResources)
    report: str | None = option(None)
    """report directory (default: OUT/reports; '' for none): written by a job that runs when the array has ended (sbatch
    --dependency=afterany), or here after --wait"""
    dry_run: bool = option(False)
    """write and print the script, submit nothing"""
    wait: bool = option(False)
    """block until the jobs end; exit 1 if any run did not complete"""
    fail_on_diverged: bool = option(False)
    """with --wait: exit 1 when a run diverged, as when one failed (default: a diverged run is a result, reported as
    such)"""
    poll_s: float = option(5.0, cli=False)


def slurm_options(sweep) -> SlurmOptions:
    """The SLURM options of `aiayn table3 --backend slurm` (the sweep's options with SlurmSweepOptions'): what the
    array's script, books and checks read."""
    return SlurmOptions(
        kind="table3",
        select=sweep.select,
        train=sweep.train,
        resources=sweep.resources,
        report=sweep.report,
        dry_run=sweep.dry_run,
        wait=sweep.wait,
        fail_on_diverged=sweep.fail_on_diverged,
        poll_s=sweep.poll_s,
    )


def with_accelerator(opts: SlurmOptions) -> SlurmOptions:
    """`--accelerator auto` made what SLURM is asked for: cpu where the resources ask for CPU tasks alone
    (--tasks-per-node without --gpus-per-node), gpu otherwise (the submitting machine cannot see the nodes')."""
    if opts.train.accelerator != "auto":
        return opts
    res = opts.resources
    cpu = res.tasks_per_node is not None and not res.gpus_per_node
    return replace(opts, train=replace(opts.train, accelerator="cpu" if cpu else "gpu"))
