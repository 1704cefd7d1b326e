#!/usr/bin/env bash
# Stop the cluster of scripts/slurm-local-up.sh: cancel every job, then stop slurmd, slurmctld and
# munged by the PIDs in their pid files. Idempotent: does nothing when nothing runs.
set -uo pipefail

STATE="${SLURM_LOCAL_DIR:-/var/tmp/slurm}"

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if alive "$STATE/slurmctld.pid"; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    # let slurmd end the cancelled job steps before it goes away
    for _ in $(seq 40); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.25; done
fi
for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid" /run/munge/munged.pid; do
    if alive "$pidfile"; then
        pid=$(cat "$pidfile")
        kill "$pid"
        for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
done
echo "slurm-local-down: stopped"
