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

from aiayn.sweeps.backends.slurm.backend import SlurmBackend, slurm
from aiayn.sweeps.backends.slurm.checks import (
    SHARED_FS,
    check,
    check_partition,
    check_shared,
    filesystem_of,
    first_missing,
    tasks_per_node,
    time_limit_seconds,
)
from aiayn.sweeps.backends.slurm.options import SPAWNING, TRAIN, SlurmOptions, SlurmResources
from aiayn.sweeps.backends.slurm.pairs import claims, classify, job_of, live_jobs, marker, pairs
from aiayn.sweeps.backends.slurm.script import (
    disk_line,
    job_name,
    render,
    render_report,
    report_script_path,
    resolved_dir,
    script_path,
    train_command,
    write_script,
)
from aiayn.sweeps.backends.slurm.submit import outcome, sbatch, submit, wait_for

__all__ = [
    "SlurmBackend",
    "slurm",
    "SPAWNING",
    "TRAIN",
    "SlurmResources",
    "SlurmOptions",
    "pairs",
    "live_jobs",
    "claims",
    "marker",
    "job_of",
    "classify",
    "SHARED_FS",
    "time_limit_seconds",
    "tasks_per_node",
    "filesystem_of",
    "check_shared",
    "check",
    "check_partition",
    "first_missing",
    "job_name",
    "train_command",
    "render",
    "resolved_dir",
    "disk_line",
    "script_path",
    "report_script_path",
    "render_report",
    "write_script",
    "sbatch",
    "wait_for",
    "outcome",
    "submit",
]
