#!/usr/bin/env bash
# local_cluster.sh: a one-node Slurm on this machine for the `slurm` tests (Debian's slurmctld, slurmd,
# slurm-client and munge; no systemd needed). It starts and stops exactly the daemons it started, by PID.
#
#   eval "$(scripts/slurm/local_cluster.sh start DIR)"   # starts munged, slurmctld, slurmd; prints exports
#   scripts/slurm/local_cluster.sh stop DIR
#
# Facts that shape it: the hostname is not `localhost`, so slurmd runs as `-N localhost`; munge's socket
# directory must be o+x; clients find the cluster through SLURM_CONF; MpiDefault=pmix (pmi2 fails with
# Debian's OpenMPI); with 2 CPUs, more tasks need --overcommit (the node is oversubscribable).
set -euo pipefail

usage() { sed -n '2,10s/^# \{0,1\}//p' "$0"; }
die() { echo "local_cluster: $*" >&2; exit 2; }

[[ $# -eq 2 ]] || { usage; exit 2; }
cmd=$1 dir=$2

stop() {
  for d in slurmd slurmctld munged; do
    local pidfile="$dir/$d.pid"
    [[ -f "$pidfile" ]] || continue
    local pid
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$pidfile"
  done
}

case "$cmd" in
  stop) [[ -d "$dir" ]] && stop; exit 0 ;;
  start) ;;
  *) usage; exit 2 ;;
esac

for b in munged slurmctld slurmd sinfo; do command -v "$b" >/dev/null || die "$b not found (apt-get install slurmctld slurmd slurm-client munge)"; done
mkdir -p "$dir"/{state,spool,log}
dir=$(cd "$dir" && pwd)
chmod 755 "$dir"  # munge's socket directory must be o+x
stop

# munge, with its own key, socket, pid, log and seed files in DIR.
head -c 1024 /dev/urandom >"$dir/munge.key"
chmod 400 "$dir/munge.key"
munged --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
  --log-file="$dir/log/munged.log" --seed-file="$dir/munged.seed" --force

# Two free ports, away from a system Slurm's defaults (6817/6818) and from another local cluster.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=7817
while ! port_free "$port" || ! port_free $((port + 1)); do port=$((port + 2)); done

cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
cat >"$dir/slurm.conf" <<CONF
ClusterName=flowrun
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=10
MinJobAge=300
NodeName=localhost CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF="$dir/slurm.conf"
not_started() { tail -5 "$dir/log/$1.log" >&2; stop; die "$1 did not start (its log: $dir/log/$1.log)"; }
slurmctld -f "$SLURM_CONF" -i || not_started slurmctld
slurmd -f "$SLURM_CONF" -N localhost || not_started slurmd
for _ in $(seq 100); do
  sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && break
  sleep 0.2
done
sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)' ||
  { tail -5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2; stop; die "the node did not come up"; }
echo "export SLURM_CONF=$dir/slurm.conf"
