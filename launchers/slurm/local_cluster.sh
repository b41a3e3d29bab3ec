#!/usr/bin/env bash
# A real SLURM cluster of one or more nodes on this machine, with slurmdbd + MariaDB accounting
# (submitit polls job state with sacct, so accounting is required).
#
#   local_cluster.sh install                        apt-get install slurm-wlm munge slurmdbd mariadb-server
#   local_cluster.sh start  [--nodes N] [STATE_DIR] start munged, mariadbd, slurmdbd, slurmctld, N slurmd
#   local_cluster.sh stop   [STATE_DIR]             stop the daemons and remove the namespaces `start` made
#   local_cluster.sh status [STATE_DIR]             exit 0 when the cluster is up and healthy, 1 otherwise
#   local_cluster.sh kill-node NAME [STATE_DIR]     a lost node: kill every process in node NAME's namespaces
#                                                   (its slurmd, job steps, ranks); `start` brings it back
#       --silent                                    cut its link first, so no peer sees a connection close
#                                                   (a machine that lost power): peers wait in a collective
#
# --nodes 1 (the default): this machine is the one compute node (its hostname, 127.0.0.1).
# --nodes N > 1: node i is its own host: a network and UTS namespace with hostname dpo-n<i> and
# address SUBNET.(10+i) on a bridge (dpo-br0, SUBNET.1, where slurmctld and slurmdbd listen), its own
# slurmd (-N dpo-n<i>); jobs on node i run in its namespaces. /etc/hosts gets one line per node.
#
# Needs root (slurmd runs jobs as their user, the daemons run as root). No systemd needed.
# Every file (configs, logs, pid files, databases, state) lives under STATE_DIR, except the
# munge key (/etc/munge/munge.key), munged's socket (/run/munge) and the /etc/hosts lines.
# After `start`, `source STATE_DIR/env.sh` to point sbatch/srun/sinfo/sacct at the cluster.
#
# Environment knobs: SLURM_LOCAL_CPUS (CPUs advertised per node, default 8), SLURM_LOCAL_MEM_MB
# (memory advertised per node, default 85% of the real one), SLURM_LOCAL_WAIT_S (bound on each
# wait, default 60), SLURM_LOCAL_SUBNET (first three octets of the nodes' /24, default 10.147.14).
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

DEFAULT_STATE_DIR=/tmp/dpo-sweeps-slurm
CLUSTER_NAME=dposweeps
PARTITION=debug
URGENT_PARTITION=urgent
ADVERTISED_CPUS=${SLURM_LOCAL_CPUS:-8}
WAIT_S=${SLURM_LOCAL_WAIT_S:-60}
CTLD_PORT=6817
SLURMD_PORT=6818
DBD_PORT=6819
DB_NAME=slurm_acct_db
DB_USER=slurm
# Multi-node layout: namespaces, links and names this script creates (and `stop` removes).
SUBNET=${SLURM_LOCAL_SUBNET:-10.147.14}
BRIDGE=dpo-br0
NODE_PREFIX=dpo-n
HOSTS_TAG="# dpo-sweeps local_cluster.sh node"

# iproute2 (ip) and util-linux (nsenter, unshare) make the nodes of a multi-node cluster
PACKAGES=(slurm-wlm munge slurmdbd mariadb-server iproute2 util-linux)
BINARIES=(munged mungekey munge unmunge mariadbd mariadb-install-db mariadb mariadb-admin
          slurmctld slurmd slurmdbd sinfo squeue sbatch srun scontrol scancel sacct sacctmgr
          ip nsenter unshare)

say() { printf '[local_cluster] %s\n' "$*"; }
die() { printf '[local_cluster] error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-2}"
}

# ----------------------------------------------------------------------------- helpers

require_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (the SLURM daemons and munged need it)"
}

missing_binaries() {
    local b out=()
    for b in "${BINARIES[@]}"; do
        command -v "$b" >/dev/null 2>&1 || out+=("$b")
    done
    printf '%s\n' "${out[@]}"
}

# A process is alive if /proc says so and it is not a zombie (stopped daemons stay
# zombies for a while when PID 1 reaps slowly). With a name, /proc/PID/comm must match.
pid_alive() {
    local pid=${1:-} comm=${2:-} state
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    state=$(awk '/^State:/ {print $2; exit}' "/proc/$pid/status" 2>/dev/null) || return 1
    case "$state" in '' | Z | X) return 1 ;; esac
    if [ -n "$comm" ]; then
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
    fi
    return 0
}

pidfile_pid() { [ -r "$1" ] && tr -dc '0-9' <"$1" || true; }

# daemon_alive PIDFILE COMM -> prints the pid, status 0 when alive
daemon_alive() {
    local pid
    pid=$(pidfile_pid "$1")
    pid_alive "$pid" "$2" && { printf '%s' "$pid"; return 0; }
    return 1
}

port_in_use() {
    local port=$1
    if command -v ss >/dev/null 2>&1; then
        [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ]
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
    fi
}

# wait_until SECONDS CMD... : poll CMD every 0.5 s; status 1 on timeout
wait_until() {
    local end=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.5
    done
}

tail_logs() {
    local f
    for f in "$@"; do
        [ -s "$f" ] || continue
        printf -- '----- last 30 lines of %s -----\n' "$f" >&2
        tail -n 30 "$f" >&2
    done
}

fail_with_logs() {
    local msg=$1
    shift
    printf '[local_cluster] error: %s\n' "$msg" >&2
    tail_logs "$@"
    exit 1
}

set_paths() {
    STATE_DIR=${1:-$DEFAULT_STATE_DIR}
    case "$STATE_DIR" in /*) ;; *) STATE_DIR="$(pwd)/$STATE_DIR" ;; esac
    ETC=$STATE_DIR/etc
    RUN=$STATE_DIR/run
    LOG=$STATE_DIR/log
    SLURM_CONF_FILE=$ETC/slurm.conf
    DBD_CONF_FILE=$ETC/slurmdbd.conf
    MY_CNF=$ETC/my.cnf
    DB_DATA=$STATE_DIR/mariadb
    DB_PORT_FILE=$ETC/mariadb.port
    DB_PASS_FILE=$ETC/mariadb.slurm-password
    ENV_FILE=$STATE_DIR/env.sh
    NODES_FILE=$ETC/nodes
    HOST=$(hostname -s)
    # Everything this script runs (sacctmgr, sinfo, ...) talks to this cluster.
    export SLURM_CONF=$SLURM_CONF_FILE
}

# set_layout N : the compute nodes (NODE_NAMES, NODE_ADDRS) and the controller's address. One node is
# this machine itself; several are namespaces joined by a bridge, so that each has its own name
# and address and the controller is reachable from all of them at the bridge's address.
set_layout() {
    NODES=$1
    NODE_NAMES=()
    NODE_ADDRS=()
    if [ "$NODES" = 1 ]; then
        NODE_NAMES=("$HOST")
        NODE_ADDRS=(127.0.0.1)
        CTLD_ADDR=127.0.0.1
        ACCT_HOST=localhost
        return
    fi
    local i
    for i in $(seq 1 "$NODES"); do
        NODE_NAMES+=("$NODE_PREFIX$i")
        NODE_ADDRS+=("$SUBNET.$((10 + i))")
    done
    CTLD_ADDR=$SUBNET.1
    ACCT_HOST=$CTLD_ADDR
}

# The node count the cluster was last started with (1 when it never was).
stored_nodes() {
    local n
    n=$(pidfile_pid "$NODES_FILE")
    echo "${n:-1}"
}

slurmd_pidfile() {
    if [ "$NODES" = 1 ]; then echo "$RUN/slurmd.pid"; else echo "$RUN/slurmd-$1.pid"; fi
}

make_dirs() {
    mkdir -p "$ETC" "$RUN" "$LOG" "$STATE_DIR/state/ctld" "$STATE_DIR/state/d"
    # slurm.conf must be readable by whoever submits; slurmdbd.conf and the database
    # password file are mode 600
    chmod 755 "$STATE_DIR" "$ETC"
}

# Serialise start/stop (CI jobs or several test sessions may call start at once).
# fd 9 must not leak into the daemons: every daemon launch closes it (9>&-).
take_lock() {
    exec 9>"$STATE_DIR/.lock"
    flock -w 300 9 || die "could not lock $STATE_DIR/.lock within 300 s"
}

# write_if_changed FILE MODE : content on stdin; status 0 if the file changed
write_if_changed() {
    local file=$1 mode=$2 tmp
    tmp=$(mktemp "$file.XXXXXX")
    cat >"$tmp"
    chmod "$mode" "$tmp"
    if [ -f "$file" ] && cmp -s "$tmp" "$file"; then
        rm -f "$tmp"
        return 1
    fi
    mv -f "$tmp" "$file"
    return 0
}

# ----------------------------------------------------------------------------- install

cmd_install() {
    require_root
    local missing
    missing=$(missing_binaries)
    if [ -z "$missing" ]; then
        say "already installed: $(slurmctld -V 2>/dev/null || echo slurm), munge, slurmdbd, mariadb"
        return 0
    fi
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install ${PACKAGES[*]} by hand (missing: $(echo $missing))"

    # Keep the packages' maintainer scripts from starting services: a policy-rc.d that
    # exits 101 ("action forbidden"). An existing one is put back afterwards.
    local policy=/usr/sbin/policy-rc.d backup=""
    if [ -e "$policy" ] || [ -L "$policy" ]; then
        backup=$(mktemp /usr/sbin/.policy-rc.d.local_cluster.XXXXXX)
        cp -a "$policy" "$backup"
    fi
    # shellcheck disable=SC2064
    trap "if [ -n '$backup' ]; then mv -f '$backup' '$policy'; else rm -f '$policy'; fi" EXIT
    printf '#!/bin/sh\n# written by local_cluster.sh install; removed afterwards\nexit 101\n' >"$policy"
    chmod 755 "$policy"

    local apt_opts=(-y -q --no-install-recommends -o DPkg::Lock::Timeout=300
                    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    export DEBIAN_FRONTEND=noninteractive
    local t0=$SECONDS
    if ! apt-cache show "${PACKAGES[@]}" >/dev/null 2>&1; then
        say "package lists lack ${PACKAGES[*]}: apt-get update"
        apt-get update -q -o DPkg::Lock::Timeout=300
    fi
    say "apt-get install ${PACKAGES[*]}"
    if ! apt-get install "${apt_opts[@]}" "${PACKAGES[@]}"; then
        say "install failed; apt-get update and retry once"
        apt-get update -q -o DPkg::Lock::Timeout=300
        apt-get install "${apt_opts[@]}" "${PACKAGES[@]}"
    fi
    missing=$(missing_binaries)
    [ -z "$missing" ] || die "still missing after install: $(echo $missing)"
    say "installed in $((SECONDS - t0)) s"
}

# ----------------------------------------------------------------------------- configs

ensure_hostname() {
    if ! getent hosts "$HOST" >/dev/null 2>&1; then
        say "hostname $HOST does not resolve: adding '127.0.0.1 $HOST' to /etc/hosts"
        printf '127.0.0.1 %s  # added by local_cluster.sh\n' "$HOST" >>/etc/hosts
    fi
}

choose_db_port() {
    local stored port
    stored=$(pidfile_pid "$DB_PORT_FILE")
    if [ -n "$stored" ] && daemon_alive "$RUN/mariadbd.pid" mariadbd >/dev/null; then
        DB_PORT=$stored
        return
    fi
    for port in $stored 3306 $(seq 3307 3399); do
        if ! port_in_use "$port"; then
            DB_PORT=$port
            echo "$DB_PORT" >"$DB_PORT_FILE"
            return
        fi
    done
    die "no free port for MariaDB in 3306-3399"
}

db_password() {
    if [ ! -s "$DB_PASS_FILE" ]; then
        (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$DB_PASS_FILE")
    fi
    cat "$DB_PASS_FILE"
}

write_my_cnf() {
    MY_CNF_CHANGED=0
    write_if_changed "$MY_CNF" 644 <<EOF && MY_CNF_CHANGED=1 || true
# written by local_cluster.sh
[client]
user=root
socket=$RUN/mariadb.sock

[mysqld]
user=root
datadir=$DB_DATA
socket=$RUN/mariadb.sock
pid-file=$RUN/mariadbd.pid
port=$DB_PORT
bind-address=127.0.0.1
skip-name-resolve
log-error=$LOG/mariadb.log
# slurmdbd asks for innodb_lock_wait_timeout=900; its buffer-pool warning is harmless here
innodb_buffer_pool_size=128M
innodb_lock_wait_timeout=900
innodb_use_native_aio=0
EOF
}

write_slurmdbd_conf() {
    local pass
    pass=$(db_password)
    DBD_CONF_CHANGED=0
    write_if_changed "$DBD_CONF_FILE" 600 <<EOF && DBD_CONF_CHANGED=1 || true
# written by local_cluster.sh
AuthType=auth/munge
DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=$DB_USER
StoragePass=$pass
StorageLoc=$DB_NAME
EOF
}

real_memory_mb() {
    local mem
    mem=$(slurmd -C 2>/dev/null | tr ' ' '\n' | sed -n 's/^RealMemory=//p' | head -n1)
    if [ -z "$mem" ]; then
        mem=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
    fi
    echo $((mem * 85 / 100))
}

ctld_supports() {
    # SlurmctldParameters values are parsed by libslurmfull / slurmctld; look for the word.
    local f
    for f in /usr/sbin/slurmctld /usr/lib/*/slurm-wlm/libslurmfull*.so* /usr/lib/slurm/libslurmfull*.so*; do
        [ -f "$f" ] && grep -aqs "$1" "$f" && return 0
    done
    return 1
}

write_slurm_conf() {
    local mem ctld_params=""
    mem=${SLURM_LOCAL_MEM_MB:-$(real_memory_mb)}
    if ctld_supports preempt_send_user_signal; then
        ctld_params="SlurmctldParameters=preempt_send_user_signal"
    fi
    SLURM_CONF_CHANGED=0
    local i node_lines="" slurmd_files="SlurmdSpoolDir=$STATE_DIR/state/d
SlurmdPidFile=$RUN/slurmd.pid
SlurmdLogFile=$LOG/slurmd.log"
    for i in "${!NODE_NAMES[@]}"; do
        node_lines+="NodeName=${NODE_NAMES[$i]} NodeHostname=${NODE_NAMES[$i]} NodeAddr=${NODE_ADDRS[$i]} CPUs=$ADVERTISED_CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$ADVERTISED_CPUS ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN"$'\n'
    done
    if [ "$NODES" != 1 ]; then
        # one slurmd per node: each its own spool, pid and log file (%n: the node's name)
        slurmd_files="SlurmdSpoolDir=$STATE_DIR/state/d/%n
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmdLogFile=$LOG/slurmd-%n.log"
    fi
    write_if_changed "$SLURM_CONF_FILE" 644 <<EOF && SLURM_CONF_CHANGED=1 || true
# written by local_cluster.sh: $NODES-node cluster for dpo-sweeps
ClusterName=$CLUSTER_NAME
SlurmctldHost=$HOST($CTLD_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$ACCT_HOST
AccountingStoragePort=$DBD_PORT
SchedulerType=sched/backfill
# a requeued job may start again only after the credential lifetime (default 120 s) and
# the next scheduler pass (default 60 s): keep both short so requeue tests run fast
AuthInfo=cred_expire=10
SchedulerParameters=sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# refuse impossible requests at sbatch time instead of letting them pend forever
EnforcePartLimits=ALL
# requeue (scontrol requeue, preemption) for batch jobs, as submitit's checkpointing needs
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
$ctld_params
# the node advertises the CPUs written below, not the ones it has
SlurmdParameters=config_overrides
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$STATE_DIR/state/ctld
$slurmd_files
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
InactiveLimit=0
KillWait=5
# A loaded CI machine (2 cores, many ranks) answers slowly: without room here a requeued job's step
# launch can fail with "Application launch failed: Communication connection failure".
MessageTimeout=30
TCPTimeout=10
MinJobAge=300
Waittime=0
# a node whose slurmd stops answering is marked down (and its jobs fail) after this many seconds
SlurmdTimeout=30
${node_lines}PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=30
# jobs here preempt (requeue) jobs of $PARTITION when they need their CPUs: for preemption tests
PartitionName=$URGENT_PARTITION Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF
}

write_env_file() {
    write_if_changed "$ENV_FILE" 644 <<EOF || true
# written by launchers/slurm/local_cluster.sh: source it to use the local SLURM cluster
export SLURM_CONF='$SLURM_CONF_FILE'
export DPO_SWEEPS_SLURM_STATE_DIR='$STATE_DIR'
export DPO_SWEEPS_SLURM_NODES='$NODES'
EOF
}

# ----------------------------------------------------------------------------- node namespaces

# netns_exists, setup_node_network, remove_node_network, check_subnet_free
# shellcheck source=node_namespaces.sh
. "$(dirname "${BASH_SOURCE[0]}")/node_namespaces.sh"

# ----------------------------------------------------------------------------- daemons

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_ok; then
        return 0
    fi
    local key=/etc/munge/munge.key
    mkdir -p /etc/munge
    if [ ! -s "$key" ]; then
        say "creating munge key $key"
        mungekey --create --keyfile="$key"
    fi
    chown -R munge:munge /etc/munge
    chmod 700 /etc/munge
    chmod 600 "$key"
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 755 /run/munge
    say "starting munged"
    STARTED=$((STARTED + 1))
    runuser -u munge -- munged --force </dev/null >>"$LOG/munged.out" 2>&1 9>&- ||
        fail_with_logs "munged did not start" "$LOG/munged.out" /var/log/munge/munged.log
    wait_until 10 munge_ok ||
        fail_with_logs "munge -n | unmunge fails after starting munged" "$LOG/munged.out" /var/log/munge/munged.log
    # remember that this cluster started it, so that `stop` stops it
    pidfile_pid /run/munge/munged.pid >"$RUN/munged.pid"
}

db_ping() { mariadb-admin --defaults-file="$MY_CNF" --connect-timeout=2 ping; }

start_mariadb() {
    if daemon_alive "$RUN/mariadbd.pid" mariadbd >/dev/null; then
        if [ "$MY_CNF_CHANGED" = 1 ]; then
            say "my.cnf changed: restarting mariadbd"
            stop_daemon mariadbd "$RUN/mariadbd.pid" mariadbd
        else
            wait_until "$WAIT_S" db_ping ||
                fail_with_logs "mariadbd is running but does not answer" "$LOG/mariadb.log"
            chmod 644 "$RUN/mariadbd.pid" 2>/dev/null || true
            return 0
        fi
    fi
    port_in_use "$DB_PORT" && die "port $DB_PORT (MariaDB) is in use by another process"
    if [ ! -d "$DB_DATA/mysql" ]; then
        say "initialising MariaDB in $DB_DATA"
        rm -rf "$DB_DATA"
        mariadb-install-db --defaults-file="$MY_CNF" --user=root --skip-test-db \
            </dev/null >>"$LOG/mariadb-install.log" 2>&1 9>&- ||
            fail_with_logs "mariadb-install-db failed" "$LOG/mariadb-install.log"
    fi
    say "starting mariadbd on 127.0.0.1:$DB_PORT"
    STARTED=$((STARTED + 1))
    setsid -f mariadbd --defaults-file="$MY_CNF" </dev/null >>"$LOG/mariadb.out" 2>&1 9>&-
    wait_until "$WAIT_S" db_ping ||
        fail_with_logs "mariadbd did not answer within $WAIT_S s" "$LOG/mariadb.out" "$LOG/mariadb.log"
    # mariadbd writes its pid file mode 660; `status` run by other users reads it
    chmod 644 "$RUN/mariadbd.pid" 2>/dev/null || true
}

setup_database() {
    local pass u
    pass=$(db_password)
    {
        echo "CREATE DATABASE IF NOT EXISTS $DB_NAME;"
        for u in "'$DB_USER'@'127.0.0.1'" "'$DB_USER'@'localhost'"; do
            echo "CREATE USER IF NOT EXISTS $u IDENTIFIED BY '$pass';"
            echo "ALTER USER $u IDENTIFIED BY '$pass';"
            echo "GRANT ALL PRIVILEGES ON $DB_NAME.* TO $u;"
        done
        echo "FLUSH PRIVILEGES;"
    } | mariadb --defaults-file="$MY_CNF" >>"$LOG/mariadb-setup.log" 2>&1 ||
        fail_with_logs "could not create the accounting database" "$LOG/mariadb-setup.log" "$LOG/mariadb.log"
}

# stop_daemon NAME PIDFILE COMM
stop_daemon() {
    local name=$1 pidfile=$2 comm=$3 pid
    if ! pid=$(daemon_alive "$pidfile" "$comm"); then
        say "$name: not running"
        rm -f "$pidfile"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_until 30 eval "! pid_alive $pid $comm"; then
        say "$name (pid $pid) ignored SIGTERM for 30 s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_until 10 eval "! pid_alive $pid $comm" || die "$name (pid $pid) survives SIGKILL"
    fi
    rm -f "$pidfile"
    say "$name: stopped (pid $pid)"
}

dbd_ok() { timeout 15 sacctmgr -n -P list cluster format=cluster; }

start_slurmdbd() {
    if daemon_alive "$RUN/slurmdbd.pid" slurmdbd >/dev/null; then
        if [ "$DBD_CONF_CHANGED" = 1 ]; then
            say "slurmdbd.conf changed: restarting slurmdbd"
            stop_daemon slurmdbd "$RUN/slurmdbd.pid" slurmdbd
        else
            return 0
        fi
    fi
    port_in_use "$DBD_PORT" && die "port $DBD_PORT (slurmdbd) is in use by another process (another cluster? \`$0 status\`, \`ss -ltnp\`)"
    say "starting slurmdbd"
    STARTED=$((STARTED + 1))
    slurmdbd </dev/null >>"$LOG/slurmdbd.out" 2>&1 9>&- ||
        fail_with_logs "slurmdbd failed to start" "$LOG/slurmdbd.out" "$LOG/slurmdbd.log"
    wait_until "$WAIT_S" dbd_ok ||
        fail_with_logs "slurmdbd did not answer within $WAIT_S s" "$LOG/slurmdbd.out" "$LOG/slurmdbd.log" "$LOG/mariadb.log"
}

register_cluster() {
    if ! dbd_ok 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
        say "registering cluster $CLUSTER_NAME in slurmdbd"
        STARTED=$((STARTED + 1))
        timeout 30 sacctmgr -i add cluster "$CLUSTER_NAME" >>"$LOG/sacctmgr.log" 2>&1 ||
            fail_with_logs "sacctmgr add cluster failed" "$LOG/sacctmgr.log" "$LOG/slurmdbd.log"
    fi
}

ctld_ok() { timeout 15 scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_slurmctld() {
    if daemon_alive "$RUN/slurmctld.pid" slurmctld >/dev/null; then
        if [ "$SLURM_CONF_CHANGED" = 1 ]; then
            say "slurm.conf changed: restarting slurmctld"
            stop_daemon slurmctld "$RUN/slurmctld.pid" slurmctld
        else
            return 0
        fi
    fi
    port_in_use "$CTLD_PORT" && die "port $CTLD_PORT (slurmctld) is in use by another process (another cluster?)"
    say "starting slurmctld"
    STARTED=$((STARTED + 1))
    slurmctld -f "$SLURM_CONF_FILE" </dev/null >>"$LOG/slurmctld.out" 2>&1 9>&- ||
        fail_with_logs "slurmctld failed to start" "$LOG/slurmctld.out" "$LOG/slurmctld.log"
    wait_until "$WAIT_S" ctld_ok ||
        fail_with_logs "slurmctld did not answer within $WAIT_S s" "$LOG/slurmctld.out" "$LOG/slurmctld.log"
}

# start_slurmd NAME : one node's slurmd; on a multi-node cluster inside that node's namespaces, so that
# it and every job step it starts see the node's own hostname and address.
start_slurmd() {
    local name=$1 pidfile
    pidfile=$(slurmd_pidfile "$name")
    if daemon_alive "$pidfile" slurmd >/dev/null; then
        if [ "$SLURM_CONF_CHANGED" = 1 ]; then
            say "slurm.conf changed: restarting slurmd of $name"
            stop_daemon "slurmd ($name)" "$pidfile" slurmd
        else
            return 0
        fi
    fi
    say "starting slurmd (node $name, $ADVERTISED_CPUS CPUs advertised)"
    STARTED=$((STARTED + 1))
    SLURMD_LAUNCHED[$name]=$(date +%s)
    if [ "$NODES" = 1 ]; then
        port_in_use "$SLURMD_PORT" && die "port $SLURMD_PORT (slurmd) is in use by another process (another cluster?)"
        slurmd -f "$SLURM_CONF_FILE" </dev/null >>"$LOG/slurmd.out" 2>&1 9>&- ||
            fail_with_logs "slurmd failed to start" "$LOG/slurmd.out" "$LOG/slurmd.log"
        return 0
    fi
    mkdir -p "$STATE_DIR/state/d/$name"
    # nsenter: the node's network namespace; unshare --uts: a hostname of its own, set before slurmd starts
    nsenter --net="/run/netns/$name" -- unshare --uts -- \
        sh -c 'hostname "$1" && exec slurmd -f "$2" -N "$1"' sh "$name" "$SLURM_CONF_FILE" \
        </dev/null >>"$LOG/slurmd-$name.out" 2>&1 9>&- ||
        fail_with_logs "slurmd of $name failed to start" "$LOG/slurmd-$name.out" "$LOG/slurmd-$name.log"
}

# A slurmd of another layout (the one-node slurmd after `start --nodes 2`, or the reverse) goes.
stop_other_slurmds() {
    local f name keep
    for f in "$RUN"/slurmd.pid "$RUN"/slurmd-*.pid; do
        [ -e "$f" ] || continue
        keep=0
        for name in "${NODE_NAMES[@]}"; do
            [ "$f" = "$(slurmd_pidfile "$name")" ] && keep=1
        done
        [ "$keep" = 1 ] || stop_daemon "slurmd ($(basename "$f" .pid))" "$f" slurmd
    done
}

node_state() { timeout 15 sinfo -h -N -n "$1" -p "$PARTITION" -o %t 2>/dev/null | head -n1; }

# The epoch second each slurmd this invocation launched was launched at (wait_node).
declare -A SLURMD_LAUNCHED=()

node_ok() {
    case "$(node_state "$1")" in idle | mix | alloc | comp) ;; *) return 1 ;; esac
    # A slurmd just launched again (after kill-node) is up only once slurmctld has its registration: until
    # then the node's state is the one from before the kill, and SlurmdTimeout may still mark it down.
    local launched=${SLURMD_LAUNCHED[$1]:-} started
    [ -n "$launched" ] || return 0
    started=$(timeout 15 scontrol show node "$1" 2>/dev/null | sed -n 's/.*SlurmdStartTime=\([^ ]*\).*/\1/p' | head -n1)
    [ -n "$started" ] && [ "$(date -d "$started" +%s 2>/dev/null || echo 0)" -ge "$launched" ]
}

# wait_node NAME : until the node is up (a node down from an earlier run is resumed once)
wait_node() {
    local name=$1 end=$((SECONDS + WAIT_S)) resumed=0 state
    while ! node_ok "$name"; do
        state=$(node_state "$name")
        if [ "$resumed" = 0 ] && [[ $state =~ ^(down|drain|drng|fail) ]]; then
            say "node $name is '$state': resuming it"
            timeout 15 scontrol update nodename="$name" state=resume >/dev/null 2>&1 || true
            resumed=1
        fi
        [ "$SECONDS" -lt "$end" ] ||
            fail_with_logs "node $name not idle after $WAIT_S s (state '${state:-?}')" \
                "$LOG/slurmd.out" "$LOG/slurmd.log" "$LOG/slurmd-$name.out" "$LOG/slurmd-$name.log" "$LOG/slurmctld.log"
        sleep 0.5
    done
}

# Fail before starting anything when another process holds a SLURM port.
preflight_ports() {
    local spec name port
    for spec in "slurmdbd:$DBD_PORT" "slurmctld:$CTLD_PORT"; do
        name=${spec%%:*}
        port=${spec#*:}
        daemon_alive "$RUN/$name.pid" "$name" >/dev/null && continue
        if port_in_use "$port"; then
            die "port $port ($name) is in use by another process (another cluster? see \`ss -ltnp\`)"
        fi
    done
    # the one-node slurmd listens on this machine's own port; the nodes' slurmds in their namespaces
    if [ "$NODES" = 1 ] && ! daemon_alive "$RUN/slurmd.pid" slurmd >/dev/null && port_in_use "$SLURMD_PORT"; then
        die "port $SLURMD_PORT (slurmd) is in use by another process (another cluster? see \`ss -ltnp\`)"
    fi
}

# ----------------------------------------------------------------------------- health

healthy() {
    local name
    munge_ok || return 1
    daemon_alive "$RUN/mariadbd.pid" mariadbd >/dev/null || return 1
    daemon_alive "$RUN/slurmdbd.pid" slurmdbd >/dev/null || return 1
    daemon_alive "$RUN/slurmctld.pid" slurmctld >/dev/null || return 1
    for name in "${NODE_NAMES[@]}"; do
        daemon_alive "$(slurmd_pidfile "$name")" slurmd >/dev/null || return 1
    done
    [ -f "$SLURM_CONF_FILE" ] || return 1
    ctld_ok || return 1
    for name in "${NODE_NAMES[@]}"; do
        node_ok "$name" || return 1
    done
    dbd_ok 2>/dev/null | grep -qx "$CLUSTER_NAME" || return 1
}

print_usage_hint() {
    local i
    say "cluster '$CLUSTER_NAME' is up: $NODES node(s) of $ADVERTISED_CPUS CPUs, partitions $PARTITION (default) and $URGENT_PARTITION"
    for i in "${!NODE_NAMES[@]}"; do
        say "  node ${NODE_NAMES[$i]} at ${NODE_ADDRS[$i]}$([ "$NODES" = 1 ] && echo ' (this machine)' || echo " (namespace ${NODE_NAMES[$i]})")"
    done
    say "state dir: $STATE_DIR"
    say "env file:  $ENV_FILE  ->  source $ENV_FILE"
}

# ----------------------------------------------------------------------------- commands

cmd_start() {
    require_root
    [[ $ADVERTISED_CPUS =~ ^[1-9][0-9]*$ ]] || die "SLURM_LOCAL_CPUS must be a positive integer"
    [[ ${SLURM_LOCAL_MEM_MB:-1} =~ ^[1-9][0-9]*$ ]] || die "SLURM_LOCAL_MEM_MB must be a positive integer (MB)"
    [[ $OPT_NODES =~ ^[1-9][0-9]?$ ]] || die "--nodes must be an integer from 1 to 99 (got '$OPT_NODES')"
    [[ $SUBNET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "SLURM_LOCAL_SUBNET must be three octets, e.g. 10.147.14"
    local missing
    missing=$(missing_binaries)
    [ -z "$missing" ] || die "missing $(echo $missing): run \`$0 install\` first"
    if [ "$OPT_NODES" != 1 ]; then
        for missing in ip nsenter unshare; do
            command -v "$missing" >/dev/null 2>&1 || die "--nodes $OPT_NODES needs '$missing' (iproute2, util-linux)"
        done
    fi
    set_paths "${1:-}"
    local t0=$SECONDS name
    make_dirs
    take_lock
    set_layout "$OPT_NODES"
    # Each step below does nothing when its part is already up with the same config;
    # a daemon whose config file changed (e.g. a newer version of this script) restarts.
    STARTED=0
    preflight_ports
    ensure_hostname
    stop_other_slurmds
    if [ "$NODES" = 1 ]; then
        remove_node_network
    else
        setup_node_network
    fi
    echo "$NODES" >"$NODES_FILE"
    start_munge
    choose_db_port
    write_my_cnf
    start_mariadb
    setup_database
    write_slurmdbd_conf
    write_slurm_conf
    start_slurmdbd
    register_cluster
    start_slurmctld
    for name in "${NODE_NAMES[@]}"; do
        start_slurmd "$name"
    done
    for name in "${NODE_NAMES[@]}"; do
        wait_node "$name"
    done
    write_env_file
    if [ "$STARTED" = 0 ]; then
        say "already up and healthy"
    else
        say "started in $((SECONDS - t0)) s"
    fi
    print_usage_hint
}

cmd_stop() {
    require_root
    set_paths "${1:-}"
    if [ ! -d "$STATE_DIR" ]; then
        say "nothing to stop: $STATE_DIR does not exist"
        return 0
    fi
    take_lock
    local f
    for f in "$RUN"/slurmd.pid "$RUN"/slurmd-*.pid; do
        [ -e "$f" ] && stop_daemon "slurmd ($(basename "$f" .pid))" "$f" slurmd
    done
    stop_daemon slurmctld "$RUN/slurmctld.pid" slurmctld
    stop_daemon slurmdbd "$RUN/slurmdbd.pid" slurmdbd
    stop_daemon mariadbd "$RUN/mariadbd.pid" mariadbd
    # munged is system-wide; stop it only if this cluster started it
    if [ -f "$RUN/munged.pid" ]; then
        stop_daemon munged "$RUN/munged.pid" munged
    elif munge_ok; then
        say "munged: not started by this cluster, left alone"
    else
        say "munged: not running"
    fi
    remove_node_network
}

cmd_status() {
    set_paths "${1:-}"
    set_layout "$(stored_nodes)"
    local name comm pid
    say "state dir: $STATE_DIR ($NODES node(s))"
    if munge_ok; then say "munge:     ok"; else say "munge:     NOT working"; fi
    for name in mariadbd slurmdbd slurmctld; do
        comm=$name
        if pid=$(daemon_alive "$RUN/$name.pid" "$comm"); then
            say "$(printf '%-10s running (pid %s)' "$name:" "$pid")"
        else
            say "$(printf '%-10s stopped' "$name:")"
        fi
    done
    for name in "${NODE_NAMES[@]}"; do
        if pid=$(daemon_alive "$(slurmd_pidfile "$name")" slurmd); then
            say "$(printf 'slurmd:    running (pid %s) for node %s' "$pid" "$name")$([ "$NODES" = 1 ] || echo ", namespace $name: $(netns_exists "$name" && echo up || echo MISSING)")"
        else
            say "slurmd:    stopped for node $name"
        fi
    done
    if healthy; then
        timeout 15 sinfo -N -o '%N %t %c %m %P' 2>/dev/null || true
        say "healthy; source $ENV_FILE"
        return 0
    fi
    say "NOT healthy (start it with: $0 start --nodes $NODES $STATE_DIR)"
    return 1
}

# deepest_first PID... : the pids ordered by their depth in the process tree, deepest first
deepest_first() {
    ps -e -o pid=,ppid= | awk -v want=" $* " '
        { parent[$1] = $2 }
        END {
            n = split(want, pids, " ")
            for (i = 1; i <= n; i++) {
                depth = 0
                for (p = pids[i]; (p in parent) && p > 1; p = parent[p]) depth++
                print depth, pids[i]
            }
        }' | sort -k1,1nr | awk '{ print $2 }'
}

cmd_kill_node() {
    require_root
    local name=${1:-} pids
    set_paths "${2:-}"
    set_layout "$(stored_nodes)"
    [ "$NODES" != 1 ] || die "kill-node needs a cluster of several nodes (start --nodes N); this one is this machine"
    [[ " ${NODE_NAMES[*]} " == *" $name "* ]] || die "no node '$name' (accepted: ${NODE_NAMES[*]})"
    netns_exists "$name" || die "node $name has no namespace (is the cluster up? \`$0 status\`)"
    if [ "$OPT_SILENT" = 1 ]; then
        # the node's end of the bridge goes down: what its processes send from now on (a FIN, a RST as they
        # die) is lost, as from a machine without power; `start` brings the link up again
        ip link set "dpo-h${name#dpo-n}" down
        say "node $name: link dpo-h${name#dpo-n} down"
    fi
    pids=$(ip netns pids "$name")
    [ -n "$pids" ] || { say "node $name: no process to kill"; return 0; }
    # A lost machine stops all at once; kill(1) goes through the pids one at a time. A process still
    # running could act on another's end (srun --kill-on-bad-exit ends the job's tasks on the other nodes),
    # so every one is stopped first (a fork made meanwhile too), then killed deepest first: a process dies
    # after its descendants, or the kernel would wake a stopped group it orphaned (SIGHUP, SIGCONT).
    local stopped="" new=$pids round
    for round in 1 2 3 4 5; do
        kill -STOP $new 2>/dev/null || true
        stopped="$stopped $new"
        new=$(comm -13 <(printf '%s\n' $stopped | sort) <(ip netns pids "$name" | sort))
        [ -n "$new" ] || break
    done
    pids=$(ip netns pids "$name")
    kill -KILL $(deepest_first $pids) 2>/dev/null || true
    say "node $name: killed $(echo $pids | wc -w) processes (slurmd, job steps, ranks); SLURM marks it down after SlurmdTimeout"
    say "bring it back with: $0 start --nodes $NODES $STATE_DIR"
}

main() {
    local cmd=${1:-} args=()
    [ $# -gt 0 ] && shift
    OPT_NODES=1
    OPT_SILENT=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) [ $# -ge 2 ] || usage; OPT_NODES=$2; shift 2 ;;
            --nodes=*) OPT_NODES=${1#--nodes=}; shift ;;
            --silent) OPT_SILENT=1; shift ;;
            -*) usage ;;
            *) args+=("$1"); shift ;;
        esac
    done
    [ "${#args[@]}" -le "$([ "$cmd" = kill-node ] && echo 2 || echo 1)" ] || usage
    [ "$OPT_NODES" = 1 ] || [ "$cmd" = start ] || die "--nodes goes with start only"
    [ "$OPT_SILENT" = 0 ] || [ "$cmd" = kill-node ] || die "--silent goes with kill-node only"
    case "$cmd" in
        kill-node) [ "${#args[@]}" -ge 1 ] || usage; cmd_kill_node "${args[@]}" ;;
        install) cmd_install ;;
        start) cmd_start "${args[@]}" ;;
        stop) cmd_stop "${args[@]}" ;;
        status) cmd_status "${args[@]}" ;;
        -h | --help | help) usage 0 ;;
        *) usage ;;
    esac
}

main "$@"
