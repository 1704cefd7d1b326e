"""`aiayn slurm table3` / `aiayn slurm train`: Table 3 (or one run) as a SLURM job array.

Mechanism: a generated sbatch script, submitted with `sbatch`, one array task per pending
(row, seed); each task runs `srun aiayn train ...` with one task per device, so Lightning's
SLURMEnvironment finds its ranks in SLURM_PROCID / SLURM_LOCALID / SLURM_NODEID. Why sbatch and not
submitit: the script is plain text that `--dry-run` can show and a user can read, edit and
resubmit by hand; the job runs the same `aiayn train` command as a laptop (no pickled Python
function, no extra dependency); and submitit's requeue hook (`checkpoint()`) runs on one process,
where a DDP checkpoint needs every rank (it deadlocks on the save's barrier).

Requeue: exactly one handler is in charge, aiayn's RequeueOnSignal (lightning_modules/run/callbacks.py),
with Lightning's own switched off (`SLURMEnvironment(auto_requeue=False)`): Lightning 2.6 saves
inside the signal handler, which hangs DDP when the ranks are at different points of a step
(reproduced here). The script asks for `--signal=USR1@LEAD` (without `B:`, so every srun task gets
it) and `--requeue`. On the signal, all ranks save `checkpoints/requeue.ckpt` together after the
current optimizer step and rank 0 runs `scontrol requeue`; the restarted task runs the same
`aiayn train` command, which resumes from the newer of the run's `last.ckpt` and `requeue.ckpt`.
The run directory depends only on (preset, corpus, row, seed), never on the job id.

Books, on the shared filesystem under --out: a pair is done when its run directory's metrics.json
says `completed`; it is queued or running when `OUT/slurm/pairs/<pair>.json` names a job that
`squeue` still lists; anything else (never run, failed, killed) is submitted again. Optuna is not
used here: a study would need a live driver to tell it when each job ends, and the run directories
already hold the answer. `aiayn report` reads the same metrics.json files.

Multi-node: `--nodes M` gives Trainer `num_nodes=M`; the run directory must then be on a
filesystem that every node sees (NFS, Lustre, GPFS, ...), checked from /proc/mounts.
Two array tasks on one node get distinct DDP ports: Lightning derives MASTER_PORT from the job id,
which differs between array tasks.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiayn.ablations.presets import get_preset
from aiayn.ablations.selection import Selection
from aiayn.ablations.table import get_row
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_text
from aiayn.common.options import option, to_argv
from aiayn.common.secrets import redact
from aiayn.lightning_modules.data.corpora import canonical_corpus
from aiayn.lightning_modules.run import disk, loggers
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.rundir import OutDir, RunDir
from aiayn.lightning_modules.run.spec import RunSpec, resolve
from aiayn.sweeps import books
from aiayn.sweeps.backends import write_resolved
from aiayn.sweeps.books import report_dir

log = logging.getLogger(__name__)

# Filesystems that several machines mount as one (a run directory there is seen by every node).
SHARED_FS = {
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "cifs", "smb3", "glusterfs", "fuse.glusterfs",
    "fuse.cephfs", "fuse.sshfs", "wekafs", "panfs", "orangefs", "pvfs2", "9p", "virtiofs", "fuse.juicefs",
}  # fmt: skip
# Strategies that start their own processes: under srun, SLURM starts one process per device instead.
SPAWNING = ("ddp_spawn", "ddp_fork", "ddp_notebook")
# srun runs this; `aiayn` is on PATH wherever the package is installed (jobs inherit the submitter's env).
TRAIN = "aiayn train"
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


@dataclass
class SlurmResources:
    """What to ask SLURM for, per array task (one run)."""

    partition: str | None = option(None, "the partition (see `sinfo -s` for the cluster's)")
    account: str | None = option(None, "the account to charge")
    time: str | None = option(None, "time limit per attempt, HH:MM:SS or D-HH:MM:SS (SLURM's formats)")
    nodes: int = option(1, "nodes per run (the Trainer's num_nodes)", positive=True)
    gpus_per_node: int | None = option(None, "GPUs per node = srun tasks per node", positive=True)
    tasks_per_node: int | None = option(None, "srun tasks per node, with --accelerator cpu", positive=True)
    cpus_per_task: int | None = option(None, "CPU cores per srun task (OMP_NUM_THREADS follows)", positive=True)
    mem: str | None = option(None, "memory per node, e.g. 64G (default: the partition's)")
    signal_lead: int = option(90, "seconds between the warning signal (USR1) and the time limit", positive=True)
    max_parallel: int | None = option(None, "array tasks running at once (default: no throttle)", positive=True)
    setup: tuple[str, ...] = option((), "a shell line before srun, e.g. 'source venv/bin/activate' (repeatable)")
    sbatch: tuple[str, ...] = option((), "another #SBATCH option, e.g. --qos=high (repeatable)")
    assume_shared: bool = option(False, "--out is on a shared filesystem though /proc/mounts says not")


def _slurm_train_template() -> TrainOptions:
    # devices, num_nodes, strategy None: they follow the SLURM resources (checked to agree where given)
    return TrainOptions(accelerator="gpu", devices=None, num_nodes=None, strategy=None, progress=False)


@dataclass
class SlurmOptions:
    """`aiayn slurm table3|train`: what to run (table3: `select`'s rows x seeds; train: `train`'s row
    and seed), how each run trains (`train`), what to ask SLURM for (`resources`), and whether to wait."""

    kind: str = option("table3", cli=False)  # table3 | train
    select: Selection = field(default_factory=Selection)
    train: TrainOptions = field(default_factory=_slurm_train_template)
    resources: SlurmResources = field(default_factory=SlurmResources)
    report: str | None = option(
        None, "report directory (default: OUT/reports; '' for none): written by a job that runs when the array has "
        "ended (sbatch --dependency=afterany), or here after --wait",
    )  # fmt: skip
    dry_run: bool = option(False, "write and print the script, submit nothing")
    wait: bool = option(False, "block until the jobs end; exit 1 if any run did not complete")
    poll_s: float = option(5.0, cli=False)


# ---- checks: every mistake a user can make is found here, before anything is written or submitted


def time_limit_seconds(text: str | None) -> int:
    """SLURM's --time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds."""
    m = _TIME.match(text or "")
    if not m:
        raise UserError(f"--time {text!r} is not a SLURM time limit; pass --time HH:MM:SS (or D-HH:MM:SS)")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is None:  # MM | MM:SS | HH:MM:SS
        h, mnt, s = (0, a, b or 0) if c is None else (a, b, c)
    else:  # D-HH | D-HH:MM | D-HH:MM:SS
        h, mnt, s = a, b or 0, c or 0
    return (days or 0) * 86400 + h * 3600 + mnt * 60 + s


def tasks_per_node(opts: SlurmOptions) -> int:
    """srun tasks per node = Trainer devices per node; checks that the SLURM and Trainer settings agree."""
    res, t = opts.resources, opts.train
    if t.accelerator not in ("gpu", "cuda", "cpu"):
        raise UserError(
            f"--accelerator {t.accelerator} cannot be matched to SLURM resources; pass --accelerator gpu or cpu"
        )
    if t.accelerator == "cpu":
        if res.gpus_per_node:
            raise UserError(
                f"--gpus-per-node {res.gpus_per_node} asks for GPUs but --accelerator cpu trains on CPUs; "
                "drop --gpus-per-node and pass --tasks-per-node T"
            )
        per_node, what = res.tasks_per_node or 1, "--tasks-per-node"
    else:
        if not res.gpus_per_node:
            raise UserError(
                "--gpus-per-node is missing; pass --gpus-per-node G (one srun task per GPU), "
                "or --accelerator cpu --tasks-per-node T for a CPU cluster"
            )
        if res.tasks_per_node not in (None, res.gpus_per_node):
            raise UserError(
                f"--tasks-per-node {res.tasks_per_node} differs from --gpus-per-node {res.gpus_per_node}; "
                "Lightning runs one srun task per GPU: drop --tasks-per-node"
            )
        per_node, what = res.gpus_per_node, "--gpus-per-node"
    if t.devices is not None and t.devices != per_node:
        raise UserError(
            f"--devices {t.devices} differs from {what} {per_node}; the Trainer needs one device per srun task: "
            f"drop --devices (it follows {what})"
        )
    if t.num_nodes is not None and t.num_nodes != res.nodes:
        raise UserError(
            f"--num-nodes {t.num_nodes} differs from --nodes {res.nodes}; drop --num-nodes (it follows --nodes)"
        )
    if t.strategy in SPAWNING and per_node * res.nodes > 1:
        raise UserError(
            f"--strategy {t.strategy} starts its own processes, but under srun SLURM starts one per device; "
            "pass --strategy ddp"
        )
    return per_node


def filesystem_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) holding `path` (its nearest existing ancestor), from /proc/mounts."""
    probe = path.resolve()
    while not probe.exists():
        probe = probe.parent
    best = ("/", "unknown")
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        inside = probe == Path(mount) or Path(mount) in probe.parents
        if inside and len(mount) >= len(best[0]):
            best = (mount, parts[2])
    return best


def check_shared(opts: SlurmOptions) -> None:
    if opts.resources.nodes <= 1 or opts.resources.assume_shared:
        return
    mount, fstype = filesystem_of(Path(opts.train.out))
    if fstype not in SHARED_FS and not fstype.startswith("fuse."):
        raise UserError(
            f"--out {opts.train.out} is on a local filesystem ({fstype} at {mount}) but --nodes {opts.resources.nodes} "
            "needs a run directory every node sees; pass --out on a shared filesystem (NFS, Lustre, GPFS, ...) "
            "or --assume-shared if it is one"
        )


def check(opts: SlurmOptions) -> int:
    """Validate everything; return tasks per node. Raises UserError before anything is written."""
    pairs(opts)  # an unknown preset, row or group, or --seeds 0
    loggers.of(opts.train)  # an unknown logger, or one whose package is missing here (jobs inherit this environment)
    res = opts.resources
    if not res.partition:
        raise UserError("--partition is missing; pass --partition NAME (see `sinfo -s` for the cluster's partitions)")
    limit = time_limit_seconds(res.time)
    if res.signal_lead >= limit:
        raise UserError(
            f"--time {res.time} leaves no room for the warning signal {res.signal_lead} s before the limit; "
            "pass a longer --time or a smaller --signal-lead"
        )
    per_node = tasks_per_node(opts)
    check_shared(opts)
    if not opts.dry_run and shutil.which("sbatch") is None:
        raise UserError("sbatch is not on PATH (no SLURM client here); run on a SLURM login node, or pass --dry-run")
    return per_node


# ---- books: which (row, seed) pairs are done, queued or running, and which to submit


def pairs(opts: SlurmOptions) -> list[tuple[str, int]]:
    preset = get_preset(opts.train.preset)
    if opts.kind == "train":
        return [(get_row(opts.train.row, opts.train.table).row, opts.train.seed)]  # unknown: names the rows there are
    return opts.select.pairs(preset, opts.train.table)


def corpus_of(opts: SlurmOptions) -> str:
    return canonical_corpus(opts.train.data) if opts.train.data else get_preset(opts.train.preset).corpus


def out_of(opts: SlurmOptions) -> OutDir:
    return OutDir(Path(opts.train.out).resolve())


def run_of(opts: SlurmOptions, row: str, seed: int) -> RunDir:
    return out_of(opts).run(get_preset(opts.train.preset).name, corpus_of(opts), row, seed)


def live_jobs() -> set[str]:
    """This user's job ids SLURM still holds (pending, running, requeued), array tasks one by one (`123_4`)."""
    if shutil.which("squeue") is None:
        return set()
    proc = subprocess.run(["squeue", "--me", "-h", "-r", "-o", "%i"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"squeue failed ({proc.stderr.strip()[:200]}); check that the SLURM controller is up")
    return set(proc.stdout.split())


def claims(opts: SlurmOptions, live=live_jobs) -> books.SlurmClaims:
    """Which array task holds which pair (OUT/slurm/pairs/), alive while SLURM holds the task."""
    return books.SlurmClaims(out_of(opts), "pair", live)


def key_of(opts: SlurmOptions, row: str, seed: int) -> str:
    return books.pair_key(get_preset(opts.train.preset).name, corpus_of(opts), row, seed)


def marker(opts: SlurmOptions, row: str, seed: int) -> Path:
    return claims(opts).marker(key_of(opts, row, seed))


def job_of(opts: SlurmOptions, row: str, seed: int) -> str | None:
    return claims(opts).job(key_of(opts, row, seed))


def classify(opts: SlurmOptions, todo: list[tuple[str, int]], live: set[str]) -> dict[str, list]:
    """Split pairs into completed, in SLURM (queued or running) and pending (to submit), by the books every
    back end keeps (sweeps/books.py)."""
    held = books.SlurmClaims(out_of(opts), "pair", lambda: live)
    found = books.states(out_of(opts), get_preset(opts.train.preset).name, corpus_of(opts), todo, held)
    out = {"completed": [], "in_slurm": [], "pending": []}
    for s in found:
        out["completed" if s.state == "completed" else "in_slurm" if s.state == "running" else "pending"].append(s.pair)
    return out


# ---- the script


def job_name(opts: SlurmOptions) -> str:
    if opts.kind == "train":
        return f"aiayn-{opts.train.preset}-{opts.train.row}-s{opts.train.seed}"
    return f"aiayn-table3-{opts.train.preset}"


def train_command(opts: SlurmOptions, per_node: int) -> list[str]:
    """`aiayn train` with Trainer settings that match the allocation ($ROW and $SEED from the array), as
    the command followed by one "--flag value" string per option. The options are `opts.train`'s,
    written by `to_argv` (the one place that turns options into a command line)."""
    world = per_node * opts.resources.nodes
    t = opts.train
    fixed = replace(
        t, row=TrainOptions.row, seed=TrainOptions.seed, out=str(Path(t.out).resolve()),
        data_dir=str(Path(t.data_dir).resolve()) if t.data_dir else None, devices=per_node,
        data=canonical_corpus(t.data) if t.data else None,  # hf:./local made absolute: the task runs elsewhere
        table=tuple(str(Path(f).resolve()) for f in t.table),
        num_nodes=opts.resources.nodes, strategy=t.strategy or ("ddp" if world > 1 else "auto"), progress=False,
    )  # fmt: skip
    argv = to_argv(fixed, always=("preset", "out", "accelerator", "devices", "num_nodes", "strategy"))
    options = [f'--config "{resolved_dir(opts)}/$ROW.json"', '--row "$ROW"', '--seed "$SEED"']
    for word in argv:  # "--flag value" pairs, or a lone "--flag"
        if word.startswith("--"):
            options.append(word)
        else:
            options[-1] += " " + shlex.quote(word)
    return [TRAIN, *options]


def render(opts: SlurmOptions, todo: list[tuple[str, int]], per_node: int) -> str:
    """The sbatch script: one array task per (row, seed) in `todo`."""
    out = Path(opts.train.out).resolve()
    res = opts.resources
    name = job_name(opts)
    array = f"0-{len(todo) - 1}" + (f"%{res.max_parallel}" if res.max_parallel else "")
    directives = [
        f"--job-name={name}",
        f"--partition={res.partition}",
        *([f"--account={res.account}"] if res.account else []),
        f"--time={res.time}",
        f"--nodes={res.nodes}",
        f"--ntasks-per-node={per_node}",
        *([f"--gpus-per-node={res.gpus_per_node}"] if opts.train.accelerator != "cpu" else []),
        *([f"--cpus-per-task={res.cpus_per_task}"] if res.cpus_per_task else []),
        *([f"--mem={res.mem}"] if res.mem else []),
        f"--array={array}",
        f"--output={out}/slurm/logs/{name}-%A_%a.out",
        "--open-mode=append",  # a requeued task appends to its log
        f"--signal=USR1@{res.signal_lead}",  # to every task (no B:): all ranks save, rank 0 requeues
        "--requeue",
        *(d if d.startswith("--") else f"--{d}" for d in res.sbatch),
    ]
    pair_words = " ".join(f"{row}:{seed}" for row, seed in todo)
    cpus = f" --cpus-per-task={res.cpus_per_task}" if res.cpus_per_task else ""
    lines = [
        "#!/bin/bash",
        f"# Generated by `aiayn slurm {opts.kind}`; one array task per (row, seed), {per_node * res.nodes} "
        "DDP ranks each.",
        "# USR1 before the time limit: aiayn checkpoints after the current step and requeues the task;",
        "# the requeued task reruns the same `aiayn train`, which resumes from that checkpoint.",
        *(f"#SBATCH {d}" for d in directives),
        "set -euo pipefail",
        *res.setup,
        f"PAIRS=({pair_words})",
        'PAIR="${PAIRS[$SLURM_ARRAY_TASK_ID]}"',
        'ROW="${PAIR%%:*}"',
        'SEED="${PAIR##*:}"',
        'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
        'echo "aiayn: row $ROW seed $SEED, attempt $((${SLURM_RESTART_COUNT:-0} + 1)),'
        ' job ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} on ${SLURM_JOB_NODELIST}"',
        # srun does not take --cpus-per-task from sbatch in Slurm 22.05-23.02: say it again
        f"srun --kill-on-bad-exit=1{cpus} " + " \\\n    ".join(_wrap(train_command(opts, per_node))),
    ]
    return "\n".join(lines) + "\n"


def _wrap(words: list[str], width: int = 100) -> list[str]:
    """Join words into lines of at most `width` characters (a long command stays readable)."""
    lines, current = [], ""
    for w in words:
        if current and len(current) + 1 + len(w) > width:
            lines.append(current)
            current = w
        else:
            current = f"{current} {w}".strip()
    return [*lines, current]


def specs_of(opts: SlurmOptions, todo: list[tuple[str, int]]) -> dict[str, RunSpec]:
    """Each row of `todo`, resolved once, at submission: the array's tasks train these (`resolved_dir`)."""
    t = opts.train
    return {row: resolve(row, t.preset, tables=t.table, overrides=t.overrides, corpus=t.data, vocab_size=t.vocab_size)
            for row in dict.fromkeys(row for row, _ in todo)}  # fmt: skip


def resolved_dir(opts: SlurmOptions) -> Path:
    """OUT/slurm/JOB-NAME.specs/: ROW.json for each row the array trains, as `aiayn slurm` resolved it."""
    return Path(opts.train.out).resolve() / "slurm" / f"{job_name(opts)}.specs"


def disk_line(opts: SlurmOptions, todo: list[tuple[str, int]], specs: dict[str, RunSpec]) -> str:
    """What the checkpoints of the array's runs will take: each run keeps its periodic checkpoints, last.ckpt and,
    once preempted, requeue.ckpt (lightning_modules/run/disk.py)."""
    each = {row: disk.estimate(opts.train, specs[row], slurm=True) for row in dict.fromkeys(row for row, _ in todo)}
    total = sum(each[row].total for row, _ in todo)
    big = max(each, key=lambda row: each[row].total)
    return (f"disk: checkpoints of the {len(todo)} runs: about {disk.human(total)} in all (the largest, {big}: "
            f"{each[big].describe()})")  # fmt: skip


def script_path(opts: SlurmOptions) -> Path:
    return OutDir(opts.train.out).slurm / f"{job_name(opts)}.sbatch"


def report_script_path(opts: SlurmOptions) -> Path:
    return OutDir(opts.train.out).slurm / f"{job_name(opts)}-report.sbatch"


def render_report(opts: SlurmOptions, report: Path) -> str:
    """The sbatch script of the report job: one CPU, submitted with --dependency=afterany:ARRAY so it runs when every
    task of the array has ended, however (a failed run is reported as failed), and nothing waits on the login node."""
    out, res, name = Path(opts.train.out).resolve(), opts.resources, f"{job_name(opts)}-report"
    directives = [
        f"--job-name={name}", f"--partition={res.partition}", *([f"--account={res.account}"] if res.account else []),
        "--time=00:30:00", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", f"--output={out}/slurm/logs/{name}-%j.out",
        *(d if d.startswith("--") else f"--{d}" for d in res.sbatch if not d.lstrip("-").startswith("array")),
    ]  # fmt: skip
    command = ["aiayn", "report", "--runs", str(out), "--out", str(report.resolve()), "--preset",
               get_preset(opts.train.preset).name]  # fmt: skip
    lines = [
        "#!/bin/bash",
        "# Generated by `aiayn slurm table3`: the sweep's report, submitted with --dependency=afterany:<the array job>",
        *(f"#SBATCH {d}" for d in directives),
        "set -euo pipefail",
        *res.setup,
        " ".join(shlex.quote(w) for w in command),
    ]
    return "\n".join(lines) + "\n"


# ---- submit and wait


def check_partition(name: str) -> None:
    """A partition the controller does not know is the user's mistake (sinfo lists the real ones)."""
    if shutil.which("sinfo") is None:
        return  # sbatch will say it
    proc = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"sinfo failed ({' '.join(proc.stderr.split())[:200]}); check that the SLURM controller is up")
    known = proc.stdout.split()
    if name not in known:
        raise UserError(f"partition {name!r} does not exist on this cluster; pass --partition {' or '.join(known)}")


def first_missing(path: Path) -> Path | None:
    """The outermost ancestor of `path` (or `path`) that does not exist yet: what a write would create."""
    missing = None
    for p in [path, *path.parents]:
        if p.exists():
            return missing
        missing = p
    return missing


def sbatch(script: Path, *options: str) -> str:
    """Submit (with sbatch `options` before the script); return the job id. sbatch's own complaint (a partition it
    does not know) is the user's."""
    proc = subprocess.run(["sbatch", "--parsable", *options, str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        problem = " ".join(proc.stderr.split())[:300] or f"exit {proc.returncode}"
        raise UserError(f"sbatch refused {script} ({problem}); fix the SLURM options (partition, account, time)")
    return proc.stdout.strip().split(";")[0]


def wait_for(jobs: set[str], poll_s: float) -> None:
    """Block until SLURM holds none of `jobs` (array tasks `123_4`); a requeued task stays held."""
    reported = None
    while True:
        left = jobs & live_jobs()
        if not left:
            return
        if len(left) != reported:
            log.info("waiting for %d SLURM task(s): %s", len(left), " ".join(sorted(left)))
            reported = len(left)
        time.sleep(poll_s)


def outcome(opts: SlurmOptions, row: str, seed: int) -> str:
    """'completed', or what went wrong and the task's log."""
    status = run_of(opts, row, seed).status()
    if status == "completed":
        return status
    log_file = out_of(opts).slurm / "logs" / f"{job_name(opts)}-{job_of(opts, row, seed)}.out"
    return f"{'no metrics.json' if status == 'missing' else status}; see {log_file}"


def write_script(path: Path, text: str) -> Path:
    """An sbatch script, atomically; readable by its owner alone when it holds a secret (a key in --setup, a password
    in --storage), which the job needs verbatim, so it is kept out of other users' reach instead of masked."""
    written = atomic_write_text(path, text)
    if redact(text) != text:
        os.chmod(written, 0o600)
    return written


def submit(
    opts: SlurmOptions, todo: list[tuple[str, int]] | None = None, specs: dict[str, RunSpec] | None = None
) -> dict:
    """Check, write the script, submit it (unless a dry run), optionally wait; return a summary
    (`results`: each pair's outcome, after --wait). `specs`: the rows as the sweep resolved them (else here, once)."""
    per_node = check(opts)
    todo = pairs(opts) if todo is None else todo
    held = classify(opts, todo, set() if opts.dry_run else live_jobs())
    summary = {"pairs": len(todo), **{k: len(v) for k, v in held.items()}, "job": None, "script": None}
    pending = held["pending"]
    if pending:
        if not opts.dry_run:
            check_partition(opts.resources.partition)
        text = render(opts, pending, per_node)
        specs = specs if specs is not None else specs_of(opts, pending)
        summary["disk"] = disk_line(opts, pending, specs)
        new_dir, new_specs = first_missing(script_path(opts).parent / "logs"), first_missing(resolved_dir(opts))
        for row, spec in specs.items():  # what each task trains: the rows as resolved here, once
            write_resolved(resolved_dir(opts) / f"{row}.json", spec, f"aiayn slurm {opts.kind}")
        path = write_script(script_path(opts), text)
        (path.parent / "logs").mkdir(exist_ok=True)  # sbatch does not create --output's directory
        summary.update(script=str(path), text=redact(text))  # what a dry run prints: never a secret
        if not opts.dry_run:
            try:
                job = sbatch(path)
            except UserError:  # nothing submitted: leave nothing written either
                if new_specs is not None and new_specs.exists():
                    shutil.rmtree(new_specs)
                shutil.rmtree(new_dir) if new_dir and new_dir.exists() else path.unlink()
                raise
            summary["job"] = job
            for i, (row, seed) in enumerate(pending):
                claims(opts).record(key_of(opts, row, seed), f"{job}_{i}", str(path))
            books.record_sweep(out_of(opts), get_preset(opts.train.preset).name, corpus_of(opts), todo, "slurm")
        report = report_dir(opts.report, opts.train.out) if opts.kind == "table3" and not opts.wait else None
        if report is not None:  # the report after the array, as a job of its own (--wait writes it here instead)
            report_script = write_script(report_script_path(opts), render_report(opts, report))
            summary["report_script"] = str(report_script)
            if not opts.dry_run:
                try:
                    summary["report_job"] = sbatch(report_script, f"--dependency=afterany:{job}")
                except UserError as e:  # the array is submitted and recorded: say how to get the report instead
                    log.warning("the report job was not submitted (%s); when the array ends, run `aiayn report "
                                "--runs %s --out %s`", e, opts.train.out, report)  # fmt: skip
    if opts.wait and not opts.dry_run:
        watched = {job_of(opts, r, s) for r, s in pending + held["in_slurm"]} - {None}
        wait_for(watched, opts.poll_s)
        summary["results"] = {f"{r} seed {s}": outcome(opts, r, s) for r, s in todo}
    return summary
