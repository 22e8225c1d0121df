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
set -euo pipefail

DIR=${PHUB_SLURM_DIR:-/var/spool/phub-slurm}
CONF=$DIR/slurm.conf
WAIT=${PHUB_SLURM_WAIT:-60}
PARTITION=${PHUB_SLURM_PARTITION:-debug}
NODE=$(hostname -s)
PORT=${PHUB_SLURM_PORT:-6817}  # slurmctld; slurmd, slurmdbd and MariaDB take the next three
CLUSTER=phub-localhost
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server-core mariadb-client-core)
SQL_SOCKET=$DIR/mariadb.sock
MUNGE_SOCKET=/run/munge/munge.socket.2

say() { echo "slurm_localhost: $*" >&2; }
die() { say "error: $*"; exit 1; }

# Is process PID the program NAME, and not a zombie (daemons leave their forked parents behind
# as zombies where nothing reaps them)?
running() {
    local pid=$1 name=$2 stat
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1  # PID (COMM) STATE ...
    [[ $stat == "$pid ($name) "* ]] || return 1
    stat=${stat#"$pid ($name) "}
    [[ ${stat:0:1} != Z ]]
}

# Is the process in PIDFILE alive and the program NAME?
alive() {
    [[ -s $1 ]] && running "$(<"$1")" "$2"
}

# Stop the process in PIDFILE (only if it is NAME): TERM, a bounded wait, then KILL.
stop_pidfile() {
    local pidfile=$1 name=$2 pid i
    if ! alive "$pidfile" "$name"; then
        rm -f "$pidfile"
        return 0
    fi
    pid=$(<"$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
        alive "$pidfile" "$name" || break
        sleep 0.5
    done
    if alive "$pidfile" "$name"; then
        say "$name (pid $pid) ignored SIGTERM for 20 s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "$pidfile"
    say "stopped $name (pid $pid)"
}

# Poll COMMAND... every half second until it succeeds or $WAIT seconds have passed.
wait_for() {
    local deadline=$((SECONDS + WAIT))
    while ((SECONDS < deadline)); do
        "$@" && return 0
        sleep 0.5
    done
    "$@"
}

munge_works() { timeout 5 munge -n 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }
sql() { timeout 10 mariadb --no-defaults --socket="$SQL_SOCKET" --user=root "$@"; }
sql_works() { sql -e "SELECT 1" >/dev/null 2>&1; }
dbd_works() { timeout 5 sacctmgr -n list cluster format=cluster >/dev/null 2>&1; }
node_state() { { timeout 5 sinfo -h -n "$NODE" -o %T 2>/dev/null || true; } | head -n1 | tr -d '*~#$@+'; }

# The last lines of the given logs (default: the SLURM daemons').
show_logs() {
    local f
    (($#)) || set -- "$DIR/slurmdbd.log" "$DIR/slurmctld.log" "$DIR/slurmd.log"
    for f in "$@"; do
        [[ -s $f ]] && { say "last lines of $f:"; tail -n 12 "$f" >&2; }
    done
    return 0
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get (Debian or Ubuntu only)"
    say "installing ${missing[*]} (apt-get; log: $DIR/apt.log)"
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be stale or absent on a fresh machine: refresh them once if needed.
    if ! timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >"$DIR/apt.log" 2>&1; then
        timeout 300 apt-get update -q >>"$DIR/apt.log" 2>&1 \
            || { tail -n 20 "$DIR/apt.log" >&2; die "apt-get update failed"; }
        timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$DIR/apt.log" 2>&1 \
            || { tail -n 20 "$DIR/apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $DIR/apt.log)"; }
    fi
}

start_munge() {
    munge_works && return 0  # a munged answers already (the system's, or ours from an earlier start)
    local key=/etc/munge/munge.key
    if [[ ! -s $key ]]; then
        say "creating $key"
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$key"
        else
            dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
        fi
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge "$key" /run/munge /var/log/munge /var/lib/munge
    chmod 0400 "$key"
    chmod 0755 /run/munge
    chmod 0700 /var/log/munge /var/lib/munge
    rm -f "$MUNGE_SOCKET"
    # munged refuses to run as root.
    timeout 30 runuser -u munge -- munged --socket="$MUNGE_SOCKET" --pid-file=/run/munge/munged.pid \
        --log-file=/var/log/munge/munged.log || { show_logs /var/log/munge/munged.log; die "munged did not start"; }
    wait_for munge_works || { show_logs /var/log/munge/munged.log; die "munged runs but \`munge -n | unmunge\` fails after ${WAIT} s"; }
    cp /run/munge/munged.pid "$DIR/munged.pid"  # marks it as ours, for `stop`
    say "started munged (pid $(<"$DIR/munged.pid"))"
}

# A private MariaDB for slurmdbd: its own data folder, socket and port, bound to 127.0.0.1.
start_mariadb() {
    if ! alive "$DIR/mariadbd.pid" mariadbd; then
        if [[ ! -d $DIR/mariadb/mysql ]]; then
            say "creating the accounting database in $DIR/mariadb"
            timeout 120 mariadb-install-db --no-defaults --user=root --datadir="$DIR/mariadb" \
                --auth-root-authentication-method=socket --skip-test-db >"$DIR/mariadb-install.log" 2>&1 \
                || { tail -n 20 "$DIR/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
        fi
        setsid mariadbd --no-defaults --user=root --datadir="$DIR/mariadb" --socket="$SQL_SOCKET" \
            --port=$((PORT + 3)) --bind-address=127.0.0.1 --pid-file="$DIR/mariadbd.pid" \
            --log-error="$DIR/mariadb.log" --innodb-buffer-pool-size=64M </dev/null >/dev/null 2>&1 &
        local pid=$! deadline=$((SECONDS + WAIT))
        while ((SECONDS < deadline)); do
            sql_works && break
            if ! running "$pid" mariadbd; then
                show_logs "$DIR/mariadb.log"
                die "mariadbd exited while starting (is port $((PORT + 3)) taken? PHUB_SLURM_PORT moves all four)"
            fi
            sleep 0.5
        done
        sql_works || { show_logs "$DIR/mariadb.log"; die "MariaDB did not answer on $SQL_SOCKET within ${WAIT} s"; }
        say "started mariadbd (pid $pid)"
    fi
    local pass
    pass=$(<"$DIR/db.secret")
    sql -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" \
        || die "could not create the database user for slurmdbd"
}

start_slurmdbd() {
    if ! alive "$DIR/slurmdbd.pid" slurmdbd; then
        timeout 30 slurmdbd || { show_logs; die "slurmdbd did not start"; }
        say "started slurmdbd"
    fi
    wait_for dbd_works || { show_logs; die "slurmdbd does not answer \`sacctmgr list cluster\` after ${WAIT} s"; }
    if ! timeout 10 sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
        timeout 30 sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr could not add cluster $CLUSTER"
    fi
}

write_conf() {
    local hw cpus mem new
    hw=$(timeout 30 slurmd -C 2>/dev/null | head -n1) || true
    [[ $hw == NodeName=* ]] || die "\`slurmd -C\` printed no node line (got: '${hw}')"
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
    mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
    [[ -n $cpus && -n $mem ]] || die "could not read CPUs and RealMemory from \`slurmd -C\`: $hw"
    [[ -s $DIR/db.secret ]] || (umask 077 && od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$DIR/db.secret")
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
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$((PORT + 2))
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
$hw NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
)
    (umask 077 && cat >"$DIR/slurmdbd.conf" <<DBD
# Written by slurm_localhost.sh.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$((PORT + 2))
SlurmUser=root
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((PORT + 3))
StorageUser=slurm
StoragePass=$(<"$DIR/db.secret")
StorageLoc=slurm_acct_db
DBD
)
    if [[ -s $CONF && $(<"$CONF") == "$new" ]]; then
        return 1  # unchanged
    fi
    printf '%s\n' "$new" >"$CONF"
    say "wrote $CONF ($cpus CPUs, $mem MB on node $NODE, partition $PARTITION)"
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
            if ! alive "$DIR/$p.pid" "$p" || [[ $pid != $(<"$DIR/$p.pid") ]]; then
                die "a $p (pid $pid) that this script did not start runs already; stop it first"
            fi
        done
    done
    if ((changed)); then  # a new config: restart what runs so it reads it (nothing on a first start)
        for p in slurmd slurmctld slurmdbd; do stop_pidfile "$DIR/$p.pid" "$p"; done
    fi
    start_munge
    start_mariadb
    start_slurmdbd
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
