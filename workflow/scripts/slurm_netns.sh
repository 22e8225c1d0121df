#!/usr/bin/env bash
# A SLURM cluster of several emulated nodes on this machine, for testing `phub launch
# --from-slurm` across nodes: each node is a network namespace (and a UTS namespace, so that its
# host name is its node name) with one address on a bridge of its own in 198.19.78.0/24, running
# its own slurmd; the controller runs in one more namespace. No accounting. Run as root.
#
#   workflow/scripts/slurm_netns.sh start [NODES]   NODES compute nodes (default 3); waits until
#                                                   every node takes jobs
#   workflow/scripts/slurm_netns.sh run CMD...      run CMD in the controller's namespace, where
#                                                   SLURM's commands (salloc, srun) reach the cluster
#   workflow/scripts/slurm_netns.sh stop            stop the daemons, delete the namespaces
#
# The config, logs and state live in $PHUB_SLURM_NETNS_DIR (default /var/spool/phub-slurm-netns).
# munged is the machine's (started here if none answers; SLURM needs it to sign messages).
# Every wait is bounded ($PHUB_SLURM_WAIT seconds, default 60).
set -euo pipefail

DIR=${PHUB_SLURM_NETNS_DIR:-/var/spool/phub-slurm-netns}
CONF=$DIR/slurm.conf
WAIT=${PHUB_SLURM_WAIT:-60}
NET=198.19.78
PREFIX=phs
MUNGE_SOCKET=/run/munge/munge.socket.2

say() { echo "slurm_netns: $*" >&2; }
die() { say "error: $*"; exit 1; }

wait_for() {
    local deadline=$((SECONDS + WAIT))
    while ((SECONDS < deadline)); do
        "$@" && return 0
        sleep 0.5
    done
    return 1
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    munge_works && return 0
    [[ -s /etc/munge/munge.key ]] || die "no /etc/munge/munge.key (workflow/scripts/slurm_localhost.sh start makes one)"
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    rm -f "$MUNGE_SOCKET"
    timeout 30 runuser -u munge -- munged --socket="$MUNGE_SOCKET" --pid-file=/run/munge/munged.pid \
        --log-file=/var/log/munge/munged.log || die "munged did not start"
    wait_for munge_works || die "munged runs but \`munge -n | unmunge\` fails"
    cp /run/munge/munged.pid "$DIR/munged.pid"
    say "started munged"
}

# in_ns NAMESPACE CMD...: run CMD in the node's network namespace, with its host name.
in_ns() {
    local ns=$1
    shift
    # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup mounts slurmd reads
    nsenter --net="/run/netns/$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

write_conf() {
    local count=$1 i
    {
        echo "# Written by slurm_netns.sh: $count emulated nodes, one network namespace each."
        echo "ClusterName=phub-netns"
        echo "SlurmctldHost=$PREFIX-ctl($NET.1)"
        echo "SlurmctldPort=6817"
        echo "SlurmdPort=6818"
        echo "AuthType=auth/munge"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$DIR/state"
        echo "SlurmdSpoolDir=$DIR/spool-%n"
        echo "SlurmctldPidFile=$DIR/slurmctld.pid"
        echo "SlurmdPidFile=$DIR/slurmd-%n.pid"
        echo "SlurmctldLogFile=$DIR/slurmctld.log"
        echo "SlurmdLogFile=$DIR/slurmd-%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "MpiDefault=none"
        echo "ReturnToService=2"
        echo "SchedulerType=sched/backfill"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        for ((i = 1; i <= count; i++)); do
            echo "NodeName=$PREFIX-node$i NodeAddr=$NET.$((10 + i)) CPUs=1 RealMemory=1000 State=UNKNOWN"
        done
        echo "PartitionName=netns Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$CONF"
}

add_ns() {
    local ns=$1 address=$2 index=$3
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add eth0 type veth peer name "p$index" netns "$PREFIX-sw"
    ip -n "$PREFIX-sw" link set "p$index" master br0 up
    ip -n "$ns" address add "$address/24" dev eth0
    ip -n "$ns" link set eth0 up
}

nodes_idle() {
    local count=$1 idle
    idle=$(SLURM_CONF=$CONF ip netns exec "$PREFIX-ctl" sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$' || true)
    ((idle == count))
}

start() {
    local count=${1:-3} i
    [[ $(id -u) == 0 ]] || die "run as root (namespaces and SLURM's daemons)"
    ip netns list | grep -q "^$PREFIX-sw\b" && die "already up (stop it first)"
    mkdir -p "$DIR/state"
    write_conf "$count"
    start_munge
    ip netns add "$PREFIX-sw"
    ip -n "$PREFIX-sw" link add br0 type bridge
    ip -n "$PREFIX-sw" link set br0 up
    add_ns "$PREFIX-ctl" "$NET.1" 0
    for ((i = 1; i <= count; i++)); do
        add_ns "$PREFIX-node$i" "$NET.$((10 + i))" "$i"
    done
    in_ns "$PREFIX-ctl" slurmctld -f "$CONF" -c -i || die "slurmctld did not start (log: $DIR/slurmctld.log)"
    for ((i = 1; i <= count; i++)); do
        mkdir -p "$DIR/spool-$PREFIX-node$i"
        in_ns "$PREFIX-node$i" slurmd -f "$CONF" || die "slurmd of node $i did not start (log: $DIR/slurmd-$PREFIX-node$i.log)"
    done
    wait_for nodes_idle "$count" || { tail -n 20 "$DIR"/*.log >&2; die "not all $count nodes are idle after $WAIT s"; }
    say "up: $count nodes ($NET.11..$NET.$((10 + count))), controller $NET.1"
}

stop() {
    local ns pid
    for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
        for pid in $(ip netns pids "$ns"); do kill -TERM "$pid" 2>/dev/null || true; done
    done
    for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
        wait_for test -z "$(ip netns pids "$ns")" || for pid in $(ip netns pids "$ns"); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns delete "$ns"
    done
    if [[ -s $DIR/munged.pid ]]; then  # ours: started by `start`
        kill -TERM "$(<"$DIR/munged.pid")" 2>/dev/null || true
        rm -f "$DIR/munged.pid"
    fi
    say "stopped"
}

case ${1:-} in
    start) shift; start "$@" ;;
    stop) stop ;;
    run) shift; SLURM_CONF=$CONF exec ip netns exec "$PREFIX-ctl" "$@" ;;
    *) die "usage: $0 start [NODES] | run CMD... | stop" ;;
esac
