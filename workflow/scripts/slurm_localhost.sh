#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, from Debian's packages, for testing the cluster
# profile (profiles/cluster) without a real cluster. Run as root.
#
#   workflow/scripts/slurm_localhost.sh start    install what is missing, write the config, start
#                                                munged (unless one runs), the accounting database,
#                                                slurmdbd, slurmctld and slurmd; wait until the
#                                                node takes jobs
#   workflow/scripts/slurm_localhost.sh stop     stop the daemons that `start` started
#   workflow/scripts/slurm_localhost.sh status   say what runs (exit 0 when the node takes jobs)
#   workflow/scripts/slurm_localhost.sh env      print the line that points SLURM's commands here
#
# The config lives in its own folder ($PHUB_SLURM_DIR, default /var/spool/phub-slurm), never in
# /etc/slurm: clients find it through SLURM_CONF (`eval "$(... env)"`). One node, named after
# `hostname -s`, with the CPUs and memory `slurmd -C` reports; partition `debug` (the default);
# no cgroups. Accounting is real (slurmdbd on a private MariaDB instance in the same folder,
# listening on 127.0.0.1 only) because Snakemake's slurm executor follows its jobs with `sacct`.
# `start` is idempotent: a second call finds the cluster up and returns. Every wait is bounded
# ($PHUB_SLURM_WAIT seconds, default 60). Ports: $PHUB_SLURM_PORT (default 6817) and the next three.
# What it shares with slurm_netns.sh (packages, munged, accounting, waits) is in slurm_common.sh.
set -euo pipefail

DIR=${PHUB_SLURM_DIR:-/var/spool/phub-slurm}
CONF=$DIR/slurm.conf
WAIT=${PHUB_SLURM_WAIT:-60}
PARTITION=${PHUB_SLURM_PARTITION:-debug}
NODE=$(hostname -s)
PORT=${PHUB_SLURM_PORT:-6817}  # slurmctld; slurmd, slurmdbd and MariaDB take the next three
CLUSTER=phub-localhost
NAME=slurm_localhost
CONTROLLER=()  # slurmctld, slurmdbd and MariaDB run here
# shellcheck source=workflow/scripts/slurm_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_common.sh"

node_state() { { timeout 5 sinfo -h -n "$NODE" -o %T 2>/dev/null || true; } | head -n1 | tr -d '*~#$@+'; }

write_conf() {
    local new
    read_hardware
    write_dbd_conf
    # Addresses are loopback: no DNS needed.
    new=$(cat <<CONF
# Written by slurm_localhost.sh: a one-node test cluster on $NODE.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
$(accounting_conf)
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
$HW_LINE NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
)
    if [[ -s $CONF && $(<"$CONF") == "$new" ]]; then
        return 1  # unchanged
    fi
    printf '%s\n' "$new" >"$CONF"
    say "wrote $CONF ($HW_CPUS CPUs, $HW_MEM MB on node $NODE, partition $PARTITION)"
}

wait_until_up() {
    local state="" deadline=$((SECONDS + WAIT))
    while ((SECONDS < deadline)); do
        if timeout 5 scontrol ping 2>/dev/null | grep -q "is UP"; then
            state=$(node_state)
            case $state in
                idle | mixed | allocated | completing) return 0 ;;
                down | drain | drained | draining | fail)
                    # Left down by an earlier run (ReturnToService covers most cases, not all).
                    timeout 10 scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
            esac
        fi
        sleep 0.5
    done
    show_logs
    die "the cluster is not up after ${WAIT} s (scontrol ping: $(timeout 5 scontrol ping 2>&1 | tr '\n' ' '); node $NODE: '${state:-no answer}')"
}

DAEMONS=(slurmd slurmctld slurmdbd mariadbd)  # the order `stop` uses; `start` goes the other way

start() {
    [[ $(id -u) == 0 ]] || die "run as root (it installs packages and starts system daemons)"
    mkdir -p "$DIR/ctld" "$DIR/d"
    chmod 0700 "$DIR"
    install_packages
    export SLURM_CONF=$CONF
    local changed=0 p pid
    write_conf && changed=1
    # Another SLURM (other config, same default ports) would answer our clients: refuse.
    for p in slurmctld slurmd slurmdbd; do
        for pid in $(pgrep -x "$p" || true); do
            running "$pid" "$p" || continue
            # Another network namespace's (slurm_netns.sh's) has ports of its own.
            [[ $(readlink "/proc/$pid/ns/net") == $(readlink /proc/self/ns/net) ]] || continue
            if ! alive "$DIR/$p.pid" "$p" || [[ $pid != $(<"$DIR/$p.pid") ]]; then
                die "a $p (pid $pid) that this script did not start runs already; stop it first"
            fi
        done
    done
    if ((changed)); then  # a new config: restart what runs so it reads it (nothing on a first start)
        for p in slurmd slurmctld slurmdbd; do stop_pidfile "$DIR/$p.pid" "$p"; done
    fi
    start_munge
    start_accounting
    if ! alive "$DIR/slurmctld.pid" slurmctld; then
        timeout 30 slurmctld -f "$CONF" || { show_logs; die "slurmctld did not start"; }
        say "started slurmctld"
    fi
    if ! alive "$DIR/slurmd.pid" slurmd; then
        timeout 30 slurmd -f "$CONF" || { show_logs; die "slurmd did not start"; }
        say "started slurmd"
    fi
    wait_until_up
    say "up: node $NODE, partition $PARTITION; for SLURM's commands: export SLURM_CONF=$CONF"
}

stop() {
    local p
    for p in "${DAEMONS[@]}"; do stop_pidfile "$DIR/$p.pid" "$p"; done
    [[ -s $DIR/munged.pid ]] && stop_pidfile "$DIR/munged.pid" munged  # only a munged started here
    return 0
}

status() {
    export SLURM_CONF=$CONF
    local p state
    for p in munged "${DAEMONS[@]}"; do
        if alive "$DIR/$p.pid" "$p"; then say "$p: running (pid $(<"$DIR/$p.pid"))"; else say "$p: not started here"; fi
    done
    [[ -s $CONF ]] || { say "no config at $CONF"; return 1; }
    state=$(node_state)
    say "node $NODE: ${state:-no answer}"
    [[ $state =~ ^(idle|mixed|allocated|completing)$ ]]
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
