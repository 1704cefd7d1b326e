"""Every mistake a user can make, found before anything is written or submitted: the time limit, the tasks per node
against the Trainer's settings, a shared filesystem for several nodes, the partition.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from aiayn.common.errors import UserError
from aiayn.common.files import check_writable_dir
from aiayn.lightning_modules.run import loggers
from aiayn.sweeps.backends.slurm.options import SPAWNING, SlurmOptions

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


# Filesystems that several machines mount as one (a run directory there is seen by every node).
SHARED_FS = {
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "cifs",
    "smb3",
    "glusterfs",
    "fuse.glusterfs",
    "fuse.cephfs",
    "fuse.sshfs",
    "wekafs",
    "panfs",
    "orangefs",
    "pvfs2",
    "9p",
    "virtiofs",
    "fuse.juicefs",
}


def time_limit_seconds(text: str | None) -> int:
    """SLURM's --time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds."""
    if not text:
        raise UserError("--time is missing: a SLURM job needs its time limit; pass --time HH:MM:SS (or D-HH:MM:SS)")
    m = _TIME.match(text)
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


def check_one_line(opts: SlurmOptions) -> None:
    """Every value that goes into an sbatch script's lines is one line: a newline in --partition, --sbatch or --out
    would start a line of its own there (an #SBATCH directive or a shell command the job runs). Values inside shell
    words are quoted where the script is written (script.py); #SBATCH lines are read by sbatch, not a shell."""
    res, t = opts.resources, opts.train
    values = {
        "--partition": res.partition,
        "--account": res.account,
        "--time": res.time,
        "--mem": res.mem,
        "--out": t.out,
        "--data-dir": t.data_dir,
        "--data": t.data,
        **{f"--sbatch {i + 1}": d for i, d in enumerate(res.sbatch)},
        **{f"--setup {i + 1}": line for i, line in enumerate(res.setup)},
        **{f"--table {i + 1}": f for i, f in enumerate(t.table)},
    }
    for flag, value in values.items():
        if value is not None and any(c in str(value) for c in "\n\r\0"):
            raise UserError(
                f"{flag} holds a line break, which would start a line of its own in the sbatch script; "
                f"pass it on one line"
            )
    # an #SBATCH line is split on white space by sbatch, not a shell: a space would make a second option of the rest
    words = {
        "--partition": res.partition,
        "--account": res.account,
        "--time": res.time,
        "--mem": res.mem,
        "--out": t.out,
    }
    for flag, value in words.items():
        if value is not None and any(c.isspace() for c in str(value)):
            fix = "a path without spaces (or a link to it without any)" if flag == "--out" else "it without spaces"
            raise UserError(
                f"{flag} {str(value)!r} holds a space, which would split its #SBATCH line into two options; pass {fix}"
            )


def check(opts: SlurmOptions) -> int:
    """Validate SLURM's options (the sweep's rows are checked when the sweep is made: backend.from_options); return
    tasks per node. Raises UserError before anything is written."""
    check_one_line(opts)
    check_writable_dir(opts.train.out, "--out")
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
