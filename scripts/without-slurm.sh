#!/usr/bin/env bash
# Runs a command as it would run on a machine without SLURM: every PATH directory that holds a SLURM command
# (sbatch, squeue, sinfo, srun, the daemons, munge) is replaced by a shadow directory of links to everything else
# in it, so `command -v sbatch` and shutil.which("sbatch") find nothing.
#
#   scripts/without-slurm.sh bash -c 'pip install -e ".[test]" && pytest'
#
# CI uses it for the README's test command: a CI image may come with SLURM installed (or even running), and a test
# that silently needs a cluster must fail there, not pass because CI happened to have one. Nothing is uninstalled
# or stopped; the shadow directories are removed when the command ends, and its exit status is returned.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/without-slurm.sh COMMAND [ARG...]" >&2; exit 2; }

is_slurm() {
    case "$1" in
        sacct|sacctmgr|salloc|sattach|sbatch|sbcast|scancel|scontrol|scrontab|sdiag|sh5util|sinfo|sprio|squeue|\
        sreport|srun|sshare|sstat|strigger|sview|slurm*|munge*) return 0 ;;
    esac
    return 1
}

shadow="$(mktemp -d "${TMPDIR:-/tmp}/aiayn-noslurm.XXXXXX")"
trap 'rm -rf "$shadow"' EXIT
IFS=: read -ra dirs <<<"$PATH"
newpath=""
n=0
for dir in "${dirs[@]}"; do
    [ -n "$dir" ] && [ -d "$dir" ] || continue
    hides=0
    for file in "$dir"/*; do
        if is_slurm "${file##*/}"; then hides=1; break; fi
    done
    if [ "$hides" = 1 ]; then
        n=$((n + 1))
        mkdir "$shadow/$n"
        for file in "$dir"/*; do
            is_slurm "${file##*/}" || ln -s "$file" "$shadow/$n/${file##*/}"
        done
        echo "without-slurm: $dir shadowed without its SLURM commands" >&2
        dir="$shadow/$n"
    fi
    newpath="${newpath:+$newpath:}$dir"
done
if found="$(PATH="$newpath" command -v sbatch)"; then
    echo "without-slurm: sbatch still found at $found; not running the command" >&2
    exit 1
fi
rc=0
PATH="$newpath" "$@" || rc=$?
exit "$rc"
