#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine (slurmctld + slurmd + munge), for the SLURM tests.
#
#   scripts/slurm-local-up.sh      # idempotent: does nothing if the node is already idle
#   scripts/slurm-local-down.sh    # cancels jobs, stops the daemons
#
# Needs root and Debian's packages: apt-get install --no-install-recommends slurm-wlm munge
# (.ci/run installs them). Follows ../shared/docs/slurm-local.md: no systemd, no cgroups, no
# accounting; state, spool and logs under $SLURM_LOCAL_DIR (default /var/tmp/slurm).
# CPUs is set above the core count (SLURM_LOCAL_CPUS, default 8) so that two 2-task CPU jobs
# (4 one-CPU tasks) run at once with headroom; SLURM does not pin tasks (task/none).
set -euo pipefail

STATE="${SLURM_LOCAL_DIR:-/var/tmp/slurm}"
CONF=/etc/slurm/slurm.conf
NODE="$(hostname -s)"
CPUS="${SLURM_LOCAL_CPUS:-8}"

for bin in slurmctld slurmd munged sinfo scontrol; do
    if ! PATH="$PATH:/usr/sbin" command -v "$bin" >/dev/null; then
        echo "slurm-local-up: $bin not found; install it: apt-get install --no-install-recommends slurm-wlm munge" >&2
        exit 2
    fi
done
[ "$(id -u)" = 0 ] || { echo "slurm-local-up: run as root (it starts munged, slurmctld, slurmd)" >&2; exit 2; }

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1; }

if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid" && [ "$(node_state)" = idle ]; then
    echo "slurm-local-up: already up (node $NODE idle)"
    exit 0
fi

# Memory: 95% of what slurmd sees (more than the node has makes it INVAL).
MEM=$(( $(/usr/sbin/slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p') * 95 / 100 ))
mkdir -p /etc/slurm "$STATE"/{state,spool,log}
cat > "$CONF.tmp" <<CONFEOF
# written by scripts/slurm-local-up.sh
ClusterName=localcluster
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# also the wait before a requeued job may start again (default 120 s)
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONFEOF
mv "$CONF.tmp" "$CONF"

if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
fi
install -d -o munge -g munge -m 0755 /run/munge
alive /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged

# Restart the SLURM daemons if only some are up (a half-started cluster from an earlier attempt).
for d in slurmd slurmctld; do
    if alive "$STATE/$d.pid"; then kill "$(cat "$STATE/$d.pid")"; fi
done
for _ in $(seq 50); do alive "$STATE/slurmctld.pid" || alive "$STATE/slurmd.pid" || break; sleep 0.2; done
started=$(date +%s)
/usr/sbin/slurmctld -f "$CONF"
/usr/sbin/slurmd -f "$CONF" -N "$NODE"

# Ready when the node is idle AND its slurmd registered after this start (after a restart sinfo can
# report idle from the saved state before slurmd has registered).
for _ in $(seq 120); do
    boot=$(scontrol show node "$NODE" 2>/dev/null | sed -n 's/.*SlurmdStartTime=\([^ ]*\).*/\1/p')
    if [ "$(node_state)" = idle ] && [ -n "$boot" ] && [ "$(date -d "$boot" +%s 2>/dev/null || echo 0)" -ge "$((started - 1))" ]; then
        echo "slurm-local-up: node $NODE idle, $CPUS CPUs, partition debug ($(sinfo --version))"
        exit 0
    fi
    sleep 0.5
done
echo "slurm-local-up: node $NODE did not become idle in 60 s; see $STATE/log/slurmctld.log and slurmd.log" >&2
sinfo >&2 || true
exit 1
