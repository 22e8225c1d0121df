#!/usr/bin/env bash
# A SLURM cluster of several emulated nodes on this machine, for testing `phub launch
# --from-slurm` and the pipeline's `network: hostfile` across nodes: each node is a network
# namespace (and a UTS namespace, so that its host name is its node name) with one address on a
# bridge of its own in 198.19.78.0/24, running its own slurmd; the controller runs in one more
# namespace, with accounting (slurmdbd on a private MariaDB instance bound to that namespace's
# loopback) because Snakemake's slurm executor follows its jobs with `sacct`. Run as root.
#
#   workflow/scripts/slurm_netns.sh start [NODES]   NODES compute nodes (default 3); waits until
#                                                   every node takes jobs
#   workflow/scripts/slurm_netns.sh run CMD...      run CMD in the controller's namespace, where
#                                                   SLURM's commands (salloc, sbatch, sacct) reach
#                                                   the cluster
#   workflow/scripts/slurm_netns.sh stop            stop the daemons, delete the namespaces
#
# The config, logs, state and database live in $PHUB_SLURM_NETNS_DIR (default
# /var/spool/phub-slurm-netns). Every node has the CPUs and memory `slurmd -C` reports for the
# machine; partition `netns` (the default). munged is the machine's (started here if none answers;
# SLURM needs it to sign messages). What it shares with slurm_localhost.sh (packages, munged,
# accounting, waits) is in slurm_common.sh. Every wait is bounded ($PHUB_SLURM_WAIT seconds,
# default 60).
set -euo pipefail

DIR=${PHUB_SLURM_NETNS_DIR:-/var/spool/phub-slurm-netns}
CONF=$DIR/slurm.conf
WAIT=${PHUB_SLURM_WAIT:-60}
NET=198.19.78
PREFIX=phs
PORT=6817  # slurmctld; slurmd, slurmdbd and MariaDB take the next three (namespaces of their own)
CLUSTER=phub-netns
NAME=slurm_netns

# The argv prefix that runs a command in namespace NS, with NS as its host name; nsenter, not
# `ip netns exec`: that remounts /sys, hiding the cgroup mounts slurmd reads. A plain command
# (not a function), so that a daemon started in the background through it has no shell as parent.
# shellcheck disable=SC2016  # the inner sh expands them
ns_prefix() { NS_PREFIX=(nsenter --net="/run/netns/$1" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$1"); }
ns_prefix "$PREFIX-ctl"
CONTROLLER=("${NS_PREFIX[@]}")  # slurmctld, slurmdbd and MariaDB run there
# shellcheck source=workflow/scripts/slurm_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_common.sh"

# in_ns NAMESPACE CMD...: run CMD in the node's network namespace, with its host name.
in_ns() {
    ns_prefix "$1"
    shift
    "${NS_PREFIX[@]}" "$@"
}

write_conf() {
    local count=$1 i
    read_hardware
    write_dbd_conf
    {
        echo "# Written by slurm_netns.sh: $count emulated nodes, one network namespace each."
        echo "ClusterName=$CLUSTER"
        echo "SlurmctldHost=$PREFIX-ctl($NET.1)"
        echo "SlurmctldPort=$PORT"
        echo "SlurmdPort=$((PORT + 1))"
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
        accounting_conf
        echo "JobCompType=jobcomp/none"
        for ((i = 1; i <= count; i++)); do
            echo "NodeName=$PREFIX-node$i NodeAddr=$NET.$((10 + i)) CPUs=$HW_CPUS RealMemory=$HW_MEM State=UNKNOWN"
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
    chmod 0700 "$DIR"
    install_packages
    export SLURM_CONF=$CONF
    write_conf "$count"
    start_munge
    ip netns add "$PREFIX-sw"
    ip -n "$PREFIX-sw" link add br0 type bridge
    ip -n "$PREFIX-sw" link set br0 up
    add_ns "$PREFIX-ctl" "$NET.1" 0
    for ((i = 1; i <= count; i++)); do
        add_ns "$PREFIX-node$i" "$NET.$((10 + i))" "$i"
    done
    rm -f "$DIR/mariadbd.pid" "$DIR/slurmdbd.pid"  # left by daemons that died with their namespace
    start_accounting
    in_ns "$PREFIX-ctl" slurmctld -f "$CONF" -c -i || die "slurmctld did not start (log: $DIR/slurmctld.log)"
    for ((i = 1; i <= count; i++)); do
        mkdir -p "$DIR/spool-$PREFIX-node$i"
        in_ns "$PREFIX-node$i" slurmd -f "$CONF" || die "slurmd of node $i did not start (log: $DIR/slurmd-$PREFIX-node$i.log)"
    done
    wait_for nodes_idle "$count" || { show_logs; die "not all $count nodes are idle after $WAIT s"; }
    say "up: $count nodes ($NET.11..$NET.$((10 + count))), controller $NET.1"
}

ns_empty() { [[ -z $(ip netns pids "$1") ]]; }

stop() {
    local ns pid
    for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
        for pid in $(ip netns pids "$ns"); do kill -TERM "$pid" 2>/dev/null || true; done
    done
    for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
        wait_for ns_empty "$ns" || for pid in $(ip netns pids "$ns"); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns delete "$ns"
    done
    [[ -s $DIR/munged.pid ]] && stop_pidfile "$DIR/munged.pid" munged  # only a munged started here
    say "stopped"
}

case ${1:-} in
    start) shift; start "$@" ;;
    stop) stop ;;
    run) shift; SLURM_CONF=$CONF exec ip netns exec "$PREFIX-ctl" "$@" ;;
    *) die "usage: $0 start [NODES] | run CMD... | stop" ;;
esac
