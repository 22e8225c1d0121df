# What the test clusters share (sourced by slurm_localhost.sh and slurm_netns.sh, not run):
# Debian's packages, munged, accounting (slurmdbd on a private MariaDB instance) and bounded waits.
#
# The sourcing script sets, before sourcing it:
#   NAME     its name, for messages
#   DIR      the folder of its config, logs, state and database
#   WAIT     the bound of every wait, in seconds
#   PORT     slurmctld's port; slurmdbd listens on PORT+2 and MariaDB on PORT+3, both on 127.0.0.1
#   CLUSTER  the ClusterName, registered with slurmdbd
#   CONTROLLER  the argv prefix that runs a command where slurmctld runs (empty: here): MariaDB
#            and slurmdbd start there, bound to that side's loopback, and sacctmgr talks to
#            slurmdbd from there
# SLURM_CONF must point at the cluster's slurm.conf (slurmdbd reads the slurmdbd.conf beside it).
# shellcheck shell=bash

PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server-core mariadb-client-core)
MUNGE_SOCKET=/run/munge/munge.socket.2
SQL_SOCKET=$DIR/mariadb.sock

# shellcheck disable=SC2153  # NAME: set by the sourcing script
say() { echo "$NAME: $*" >&2; }
die() { say "error: $*"; exit 1; }
# on_controller CMD...: run CMD where slurmctld runs.
on_controller() { "${CONTROLLER[@]}" "$@"; }

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

# Has process PID ended (gone, or a zombie not yet reaped)?
ended() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    [[ ${stat:0:1} == Z ]]
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

# Poll COMMAND... every half second until it succeeds or $WAIT seconds have passed; then its
# last try's status.
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
dbd_works() { on_controller timeout 5 sacctmgr -n list cluster format=cluster >/dev/null 2>&1; }

# The last lines of the given logs (default: the SLURM daemons').
show_logs() {
    local f
    (($#)) || set -- "$DIR"/slurm*.log
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

# The machine's CPUs and memory as `slurmd -C` reports them: sets HW_LINE (its node line), HW_CPUS
# and HW_MEM (MB).
read_hardware() {
    HW_LINE=$(timeout 30 slurmd -C 2>/dev/null | head -n1) || true
    [[ $HW_LINE == NodeName=* ]] || die "\`slurmd -C\` printed no node line (got: '${HW_LINE}')"
    HW_CPUS=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$HW_LINE")
    HW_MEM=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$HW_LINE")
    [[ -n $HW_CPUS && -n $HW_MEM ]] || die "could not read CPUs and RealMemory from \`slurmd -C\`: $HW_LINE"
}

start_munge() {
    munge_works && return 0  # a munged answers already (the system's, or one from an earlier start)
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

# slurm.conf's accounting lines: slurmctld sends jobs to slurmdbd on the controller's loopback.
accounting_conf() {
    cat <<CONF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$((PORT + 2))
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/none
CONF
}

# slurmdbd.conf beside slurm.conf, with the database's password (made once, kept in DIR).
write_dbd_conf() {
    [[ -s $DIR/db.secret ]] || (umask 077 && od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$DIR/db.secret")
    (umask 077 && cat >"$DIR/slurmdbd.conf" <<DBD
# Written by $NAME.
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
}

# A private MariaDB for slurmdbd: its own data folder, socket and port, bound to 127.0.0.1 on the
# controller's side.
start_mariadb() {
    if ! alive "$DIR/mariadbd.pid" mariadbd; then
        if [[ ! -d $DIR/mariadb/mysql ]]; then
            say "creating the accounting database in $DIR/mariadb"
            timeout 120 mariadb-install-db --no-defaults --user=root --datadir="$DIR/mariadb" \
                --auth-root-authentication-method=socket --skip-test-db >"$DIR/mariadb-install.log" 2>&1 \
                || { tail -n 20 "$DIR/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
        fi
        "${CONTROLLER[@]}" setsid mariadbd --no-defaults --user=root --datadir="$DIR/mariadb" --socket="$SQL_SOCKET" \
            --port=$((PORT + 3)) --bind-address=127.0.0.1 --pid-file="$DIR/mariadbd.pid" \
            --log-error="$DIR/mariadb.log" --innodb-buffer-pool-size=64M </dev/null >/dev/null 2>&1 &
        local pid=$! deadline=$((SECONDS + WAIT))
        while ((SECONDS < deadline)); do
            sql_works && break
            if ended "$pid"; then
                show_logs "$DIR/mariadb.log"
                die "mariadbd exited while starting (is port $((PORT + 3)) taken? PHUB_SLURM_PORT moves all four)"
            fi
            sleep 0.5
        done
        sql_works || { show_logs "$DIR/mariadb.log"; die "MariaDB did not answer on $SQL_SOCKET within ${WAIT} s"; }
        say "started mariadbd (pid $(<"$DIR/mariadbd.pid"))"
    fi
    local pass
    pass=$(<"$DIR/db.secret")
    sql -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" \
        || die "could not create the database user for slurmdbd"
}

# slurmdbd on the controller's side, and the cluster registered with it.
start_slurmdbd() {
    if ! alive "$DIR/slurmdbd.pid" slurmdbd; then
        on_controller timeout 30 slurmdbd || { show_logs; die "slurmdbd did not start"; }
        say "started slurmdbd"
    fi
    wait_for dbd_works || { show_logs; die "slurmdbd does not answer \`sacctmgr list cluster\` after ${WAIT} s"; }
    if ! on_controller timeout 10 sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
        on_controller timeout 30 sacctmgr -i add cluster "$CLUSTER" >/dev/null \
            || die "sacctmgr could not add cluster $CLUSTER"
    fi
}

# Everything accounting needs, in order: the database, then slurmdbd (slurmctld comes after).
start_accounting() {
    start_mariadb
    start_slurmdbd
}
