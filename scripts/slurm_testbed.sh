#!/usr/bin/env bash
# The Slurm testbed (DESIGN.md §10): a real Slurm cluster of N nodes on this one machine. Its own
# munged (own key, own socket), one slurmctld, and one `slurmd -N nodeK` per node, each node on
# its own port but all on this hostname. Nothing touches a system munge or Slurm: every path is in
# the state dir and every port is the testbed's own. Needs root. See docs/testbed.md.
#
#   slurm_testbed.sh up       start the cluster (taking down any earlier one), wait for idle nodes
#   slurm_testbed.sh down     stop every daemon and job step of the testbed, remove the state dir
#   slurm_testbed.sh env      print `export SLURM_CONF=...` to eval in a shell
#   slurm_testbed.sh status   one line per daemon: name, pid, running|stopped; then sinfo
#   slurm_testbed.sh kill NODE   power loss: SIGKILL the node's slurmd, its job steps and tasks
#   slurm_testbed.sh start NODE  start the node's slurmd again; returns once it responds
#   slurm_testbed.sh install  install slurm-wlm and munge (done by `up` when missing)
#
# Environment: FTRUN_SLURMBED_DIR (/tmp/ftrun-slurmbed), FTRUN_SLURMBED_NODES (4),
# FTRUN_SLURMBED_CTLD_PORT (16817), FTRUN_SLURMBED_SLURMD_PORT (17001: node k listens on
# PORT+k-1), FTRUN_SLURMBED_READY_TIMEOUT (30 s for every node to be idle).
set -euo pipefail

PROG=slurm_testbed.sh
STATE_DIR=${FTRUN_SLURMBED_DIR:-/tmp/ftrun-slurmbed}
N_NODES=${FTRUN_SLURMBED_NODES:-4}
CTLD_PORT=${FTRUN_SLURMBED_CTLD_PORT:-16817}
SLURMD_PORT=${FTRUN_SLURMBED_SLURMD_PORT:-17001}
READY_TIMEOUT=${FTRUN_SLURMBED_READY_TIMEOUT:-30}
STOP_TIMEOUT=10   # seconds for a daemon to exit after SIGTERM before it gets SIGKILL
MAX_NODES=32
MARKER=.ftrun-slurmbed
# Every daemon of the testbed carries this in its environment, and slurmd passes its environment
# to the slurmstepd it starts: `down` finds all of them by it, even when a pid file is missing.
TAG_VAR=FTRUN_SLURMBED_TAG

die() { echo "$PROG: error: $*" >&2; DIED=1; exit 1; }
info() { echo "$PROG: $*" >&2; }

usage() {
    sed -n '7,13s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

# ---- configuration, validated once -----------------------------------------------------------

is_port() { [[ $1 =~ ^[0-9]+$ ]] && ((10#$1 >= 1024 && 10#$1 <= 65535)); }

validate_config() {  # $1 = use_record: take what `up` recorded (every command but up)
    # slurm.conf has no quoting for paths, and a unix socket path is at most 107 bytes.
    [[ $STATE_DIR == /* && $STATE_DIR != / && $STATE_DIR =~ ^[A-Za-z0-9/._+-]+$ ]] \
        || die "FTRUN_SLURMBED_DIR='$STATE_DIR' must be an absolute path other than / made of [A-Za-z0-9/._+-]"
    STATE_DIR=${STATE_DIR%/}
    ((${#STATE_DIR} <= 80)) || die "FTRUN_SLURMBED_DIR='$STATE_DIR' is longer than 80 characters (munge's socket lives in it)"
    if [ "${1:-}" = use_record ] && [ -f "$STATE_DIR/ports" ]; then
        read -r N_NODES CTLD_PORT SLURMD_PORT <"$STATE_DIR/ports"
    fi
    [[ $N_NODES =~ ^[0-9]+$ ]] && ((10#$N_NODES >= 1 && 10#$N_NODES <= MAX_NODES)) \
        || die "FTRUN_SLURMBED_NODES='$N_NODES' must be 1..$MAX_NODES"
    N_NODES=$((10#$N_NODES))
    is_port "$CTLD_PORT" || die "FTRUN_SLURMBED_CTLD_PORT='$CTLD_PORT' must be a port 1024..65535"
    is_port "$SLURMD_PORT" && ((10#$SLURMD_PORT + N_NODES - 1 <= 65535)) \
        || die "FTRUN_SLURMBED_SLURMD_PORT='$SLURMD_PORT' must be a port with room for $N_NODES nodes"
    CTLD_PORT=$((10#$CTLD_PORT))
    SLURMD_PORT=$((10#$SLURMD_PORT))
    ((CTLD_PORT < SLURMD_PORT || CTLD_PORT >= SLURMD_PORT + N_NODES)) \
        || die "FTRUN_SLURMBED_CTLD_PORT=$CTLD_PORT falls among the slurmd ports $SLURMD_PORT..$((SLURMD_PORT + N_NODES - 1))"
    [[ $READY_TIMEOUT =~ ^[0-9]+$ ]] && ((10#$READY_TIMEOUT >= 1)) \
        || die "FTRUN_SLURMBED_READY_TIMEOUT='$READY_TIMEOUT' must be a whole number of seconds >= 1"
    CONF=$STATE_DIR/slurm.conf
    MUNGE_SOCKET=$STATE_DIR/munge/munge.socket
    HOST=$(hostname)
}

require_root() {
    [ "$(id -u)" = 0 ] || die "must run as root (slurmd starts job steps as any user)"
}

missing_tools() {
    local missing=() t
    for t in munged slurmctld slurmd sbatch srun sinfo scontrol squeue scancel flock; do
        command -v "$t" >/dev/null 2>&1 || [ -x "/usr/sbin/$t" ] || missing+=("$t")
    done
    echo "${missing[*]}"
}

install_packages() {
    command -v apt-get >/dev/null 2>&1 || die "missing $(missing_tools) and no apt-get to install slurm-wlm munge"
    info "installing slurm-wlm munge with apt-get"
    # policy-rc.d 101 stops the packages from starting a system munged/slurmctld/slurmd.
    local policy=/usr/sbin/policy-rc.d made_policy=0 rc=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
    fi
    {
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq update \
            && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq install -y \
                --no-install-recommends --no-upgrade slurm-wlm munge
    } >&2 || rc=$?
    if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi
    [ "$rc" = 0 ] || die "apt-get install slurm-wlm munge failed (exit $rc)"
    local still
    still=$(missing_tools)
    [ -z "$still" ] || die "still missing after install: $still"
}

ensure_tools() {
    [ -z "$(missing_tools)" ] || install_packages
    PATH=$PATH:/usr/sbin   # munged, slurmctld and slurmd live there
}

# One command at a time per testbed; the lock is on this script, so nothing is left behind.
# Daemons are started with the descriptor closed, so they never hold it.
take_lock() {
    exec 9<"${BASH_SOURCE[0]}"
    flock -w 120 9 || die "another $PROG command still holds the lock after 120 s"
}

# ---- daemons ---------------------------------------------------------------------------------

node_name() { echo "node$1"; }

# Live (non-zombie) processes that carry this testbed's tag: munged, slurmctld, slurmd.
tagged_pids() {
    local f pid
    for f in /proc/[0-9]*/environ; do
        pid=${f#/proc/}
        pid=${pid%/environ}
        [ "$pid" != $$ ] || continue
        if { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qxF "$TAG_VAR=$STATE_DIR"; then
            if alive "$pid"; then echo "$pid"; fi
        fi
    done
}

# Live slurmstepd processes of this testbed ($1: of that node only). slurmd starts them with an
# empty environment, so the tag is gone; but each holds its node's slurmd log open (and runs in
# slurmd's working directory, the state dir).
step_pids() {
    local f pid head node=${1:-}
    for f in /proc/[0-9]*/cmdline; do
        pid=${f#/proc/}
        pid=${pid%/cmdline}
        { read -r -d '' -n 11 head <"$f"; } 2>/dev/null || true
        [ "${head:-}" = slurmstepd: ] || continue
        head=""
        if [ -n "$node" ]; then
            find "/proc/$pid/fd" -maxdepth 1 -lname "$STATE_DIR/slurmd-$node.log" 2>/dev/null | grep -q . || continue
        elif [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" != "$STATE_DIR" ]; then
            find "/proc/$pid/fd" -maxdepth 1 -lname "$STATE_DIR/*" 2>/dev/null | grep -q . || continue
        fi
        if alive "$pid"; then echo "$pid"; fi
    done
}

# Descendants of the given pids (job tasks under a slurmstepd), found by parent pid, not by name.
descendants() {
    [ $# -gt 0 ] || return 0
    # cat, not awk on the files: mawk quits (printing nothing) when a file vanishes mid-read.
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v roots=" $* " '
        { pid = $1; sub(/^[0-9]+ \(.*\) /, ""); split($0, a, " "); parent[pid] = a[2] }
        END {
            n = split(roots, r, " "); for (i = 1; i <= n; i++) seen[r[i]] = 1
            do { grew = 0; for (p in parent) if (!(p in seen) && (parent[p] in seen)) { seen[p] = 1; print p; grew = 1 } } while (grew)
        }' || true
}

# SIGKILL every job step (slurmstepd) and everything under it. They are stopped first, all of
# them, until the set stops growing: a killed slurmstepd's tasks would be reparented to init and
# no longer be found, and a running task could fork while we look. Then they are killed deepest
# first: a parent killed before its stopped children orphans their process group, and the kernel
# sends such a group SIGHUP and SIGCONT, which a real power loss never does (an srun woken that
# way cancelled the job's steps on the other nodes: "forcing job termination").
kill_steps() {  # $1: of that node only
    local set=() order=() prev="" roots i
    for ((i = 0; i < 50; i++)); do
        roots=$(step_pids "${1:-}" | tr '\n' ' ')
        [ -n "$roots" ] || return 0
        # shellcheck disable=SC2086
        mapfile -t set < <({ printf '%s\n' $roots; descendants $roots; } | sort -un)
        kill -STOP "${set[@]}" 2>/dev/null || true
        [ "${set[*]}" != "$prev" ] || break
        prev=${set[*]}
    done
    # descendants lists parents before their children: reversed, children come first.
    # shellcheck disable=SC2086
    mapfile -t order < <({ printf '%s\n' $roots; descendants $roots; } | tac)
    for i in "${order[@]}"; do kill -KILL "$i" 2>/dev/null || true; done
    kill -KILL "${set[@]}" 2>/dev/null || true
    kill -CONT "${set[@]}" 2>/dev/null || true   # a stopped process dies of SIGKILL anyway; harmless
    wait_gone 5 "${set[@]}"
}

alive() {  # the process exists and is not a zombie (the state follows the last ')' in stat)
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

# Waits up to $1 seconds for the pids to be gone; returns 1 (naming them) if some are not.
wait_gone() {
    local timeout=$1 p left=() deadline
    shift
    deadline=$((SECONDS + timeout))
    while :; do
        left=()
        for p in "$@"; do if alive "$p"; then left+=("$p"); fi; done
        ((${#left[@]})) || return 0
        ((SECONDS < deadline)) || break
        sleep 0.05   # poll interval while the processes exit
    done
    echo "$PROG: error: processes still alive after ${timeout} s: ${left[*]}" >&2
    return 1
}

# SIGTERM (a daemon removes its pid file and socket), SIGKILL after STOP_TIMEOUT, then bounded.
stop_pids() {
    local p left=()
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    wait_gone "$STOP_TIMEOUT" "$@" 2>/dev/null && return 0
    for p in "$@"; do if alive "$p"; then left+=("$p"); fi; done
    ((${#left[@]})) || return 0
    kill -KILL "${left[@]}" 2>/dev/null || true
    wait_gone 5 "${left[@]}"
}

# Stops whatever this testbed (STATE_DIR) runs and removes the state dir. Safe when nothing is up,
# and after a half-failed `up`: it finds daemons by their tag, not only by pid file.
teardown() {
    local rc=0 f pid pids=() group
    # 1. Job steps and their tasks, while slurmd still runs (a slurmd that sees its steps die
    #    just reports it; a step outlives its slurmd otherwise).
    kill_steps || rc=1
    # 2. Daemons by pid file, in groups that stop together: the slurmds, then slurmctld, then
    #    munged last (the others talk to it on the way out).
    for group in "$STATE_DIR/slurmd-*.pid" "$STATE_DIR/slurmctld.pid" "$STATE_DIR/munge/munged.pid"; do
        pids=()
        for f in $group; do
            [ -f "$f" ] || continue
            pid=$(<"$f")
            if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" \
                && { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "$TAG_VAR=$STATE_DIR"; then
                pids+=("$pid")
            fi
        done
        if ((${#pids[@]})); then stop_pids "${pids[@]}" || rc=1; fi
    done
    # 3. Anything tagged that is left (a daemon whose pid file was never written), and any step
    #    started meanwhile.
    mapfile -t pids < <(tagged_pids)
    if ((${#pids[@]})); then stop_pids "${pids[@]}" || rc=1; fi
    kill_steps || rc=1
    # 4. State dir: only one this script made (it holds the marker), never anything else.
    if [ -d "$STATE_DIR" ]; then
        if [ -e "$STATE_DIR/$MARKER" ]; then
            rm -rf -- "$STATE_DIR"
        elif ! rmdir -- "$STATE_DIR" 2>/dev/null; then
            echo "$PROG: error: left $STATE_DIR alone: it is not a slurm testbed state dir (no $MARKER)" >&2
            rc=1
        fi
    fi
    return "$rc"
}

port_in_use() {  # a TCP listener on the port, anywhere on this machine
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

write_conf() {
    local last=$((SLURMD_PORT + N_NODES - 1))
    cat >"$CONF" <<EOF
# Generated by scripts/slurm_testbed.sh. Removed by \`slurm_testbed.sh down\`.
ClusterName=ftrun
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
# Our own munged, never the system one.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=5
StateSaveLocation=$STATE_DIR/ctld-state
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmctldLogFile=$STATE_DIR/slurmctld.log
SlurmdPidFile=$STATE_DIR/slurmd-%n.pid
SlurmdSpoolDir=$STATE_DIR/spool-%n
SlurmdLogFile=$STATE_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# All nodes are processes on one machine: no cgroups, no CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
LaunchType=launch/slurm
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Whole nodes per job (select/linear), but the CPU counts are fictional and generous, so steps
# with --overlap (an agent and its ranks) fit beside a batch job's own step.
SelectType=select/linear
SlurmdParameters=config_overrides
# Faults: a requeued job runs again; a node that comes back (slurmd restarted, resume) serves.
JobRequeue=1
ReturnToService=1
# Short timers so tests are fast.
SlurmctldTimeout=10
SlurmdTimeout=5
MessageTimeout=5
KillWait=2
MinJobAge=60
InactiveLimit=0
WaitTime=0
UnkillableStepTimeout=30
SchedulerParameters=sched_interval=1
NodeName=node[1-$N_NODES] NodeHostname=$HOST Port=$SLURMD_PORT-$last CPUs=16 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=node[1-$N_NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

start_munged() {
    mkdir -p "$STATE_DIR/munge"
    chmod 700 "$STATE_DIR/munge"
    # A fresh key per `up`: only this testbed's daemons and clients can talk to each other.
    dd if=/dev/urandom of="$STATE_DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$STATE_DIR/munge/munge.key"
    # --force: munged refuses to run as root and in a path under world-writable /tmp without it.
    env "$TAG_VAR=$STATE_DIR" munged --force \
        --socket="$MUNGE_SOCKET" \
        --key-file="$STATE_DIR/munge/munge.key" \
        --pid-file="$STATE_DIR/munge/munged.pid" \
        --log-file="$STATE_DIR/munge/munged.log" \
        --seed-file="$STATE_DIR/munge/munged.seed" \
        </dev/null >>"$STATE_DIR/munge/munged.out" 2>&1 9<&- \
        || die "munged did not start: $(tail -n 5 "$STATE_DIR/munge/munged.log" "$STATE_DIR/munge/munged.out" 2>/dev/null | tr '\n' ' ')"
    local deadline=$((SECONDS + 10))
    until [ -S "$MUNGE_SOCKET" ]; do
        ((SECONDS < deadline)) || die "munged made no socket within 10 s: $(tail -n 5 "$STATE_DIR/munge/munged.log" | tr '\n' ' ')"
        sleep 0.05
    done
}

start_slurmctld() {
    mkdir -p "$STATE_DIR/ctld-state"
    # -c: start with no jobs or node states from an earlier run (the state dir is new anyway).
    env "$TAG_VAR=$STATE_DIR" SLURM_CONF="$CONF" slurmctld -c -f "$CONF" \
        </dev/null >>"$STATE_DIR/slurmctld.out" 2>&1 9<&- \
        || die "slurmctld did not start: $(tail -n 5 "$STATE_DIR/slurmctld.log" "$STATE_DIR/slurmctld.out" 2>/dev/null | tr '\n' ' ')"
}

start_slurmd() {  # $1 = node index
    local name
    name=$(node_name "$1")
    mkdir -p "$STATE_DIR/spool-$name"
    env "$TAG_VAR=$STATE_DIR" SLURM_CONF="$CONF" slurmd -N "$name" -f "$CONF" \
        </dev/null >>"$STATE_DIR/slurmd-$name.out" 2>&1 9<&- \
        || die "slurmd $name did not start: $(tail -n 5 "$STATE_DIR/slurmd-$name.log" "$STATE_DIR/slurmd-$name.out" 2>/dev/null | tr '\n' ' ')"
}

# Every node shows idle in sinfo within READY_TIMEOUT.
wait_idle() {
    local deadline=$((SECONDS + READY_TIMEOUT)) out=""
    while :; do
        out=$(SLURM_CONF=$CONF timeout 10 sinfo -h -N -o '%N %t' 2>&1 || true)
        if [ "$(grep -c ' idle$' <<<"$out")" = "$N_NODES" ]; then return 0; fi
        ((SECONDS < deadline)) || break
        sleep 0.2   # poll interval
    done
    die "not every node is idle after ${READY_TIMEOUT} s; sinfo: $(tr '\n' ' ' <<<"$out")
slurmctld.log: $(tail -n 8 "$STATE_DIR/slurmctld.log" 2>/dev/null)
slurmd-node1.log: $(tail -n 5 "$STATE_DIR/slurmd-node1.log" 2>/dev/null)"
}

# ---- commands --------------------------------------------------------------------------------

cmd_up() {
    (($# == 0)) || die "usage: $PROG up  (FTRUN_SLURMBED_NODES sets the node count)"
    require_root
    ensure_tools
    take_lock
    local t0=$EPOCHREALTIME k port
    if [ -e "$STATE_DIR" ] && [ ! -e "$STATE_DIR/$MARKER" ] && [ -n "$(ls -A "$STATE_DIR" 2>/dev/null)" ]; then
        die "FTRUN_SLURMBED_DIR=$STATE_DIR exists and is not a slurm testbed state dir; choose another"
    fi
    # From here on, failing or being interrupted stops whatever exists (then or before).
    UP_DONE=0
    trap 'rc=$?; if [ "${UP_DONE:-1}" = 0 ]; then
              if [ "$rc" -gt 128 ]; then info "interrupted; tearing down what up made"
              elif [ -z "${DIED:-}" ]; then echo "$PROG: error: up failed (the command above); tearing down" >&2; fi
              teardown >/dev/null 2>&1 || true
          fi' EXIT
    trap 'exit 130' INT   # exit, so that the EXIT trap runs
    trap 'exit 143' TERM
    # An earlier testbed in the same dir goes first: its recorded ports, not this run's.
    (
        if [ -f "$STATE_DIR/ports" ]; then read -r N_NODES CTLD_PORT SLURMD_PORT <"$STATE_DIR/ports"; fi
        teardown >/dev/null
    ) || die "could not tear down the previous testbed; run '$PROG down' and read its errors"
    for port in "$CTLD_PORT" $(seq "$SLURMD_PORT" $((SLURMD_PORT + N_NODES - 1))); do
        ! port_in_use "$port" || die "port $port is in use here; set FTRUN_SLURMBED_CTLD_PORT / FTRUN_SLURMBED_SLURMD_PORT to free ones"
    done

    mkdir -p "$STATE_DIR"
    chmod 700 "$STATE_DIR"
    : >"$STATE_DIR/$MARKER"
    echo "$N_NODES $CTLD_PORT $SLURMD_PORT" >"$STATE_DIR/ports"
    write_conf
    start_munged
    start_slurmctld
    for ((k = 1; k <= N_NODES; k++)); do start_slurmd "$k"; done
    wait_idle
    UP_DONE=1
    info "$N_NODES nodes up in $(awk "BEGIN {printf \"%.1f\", $EPOCHREALTIME - $t0}") s; eval \"\$($PROG env)\""
}

cmd_down() {
    (($# == 0)) || die "usage: $PROG down"
    require_root
    take_lock
    teardown || die "teardown incomplete (see the errors above)"
}

cmd_env() {
    (($# == 0)) || die "usage: $PROG env"
    [ -f "$CONF" ] || die "no slurm testbed is up in $STATE_DIR (run '$PROG up')"
    printf 'export SLURM_CONF=%s\n' "$CONF"
}

cmd_status() {
    (($# == 0)) || die "usage: $PROG status"
    require_root
    [ -f "$CONF" ] || die "no slurm testbed is up in $STATE_DIR"
    local name f pid state k
    for name in munged slurmctld $(for ((k = 1; k <= N_NODES; k++)); do echo "slurmd-node$k"; done); do
        case $name in
            munged) f=$STATE_DIR/munge/munged.pid ;;
            *) f=$STATE_DIR/$name.pid ;;
        esac
        pid=$(cat "$f" 2>/dev/null || true)
        state=stopped
        if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid"; then state=running; fi
        echo "$name pid=${pid:--} $state"
    done
    SLURM_CONF=$CONF timeout 10 sinfo -N -o '%N %t %E' 2>&1 || true
}

# NODE (node2 or 2) -> node2, or die.
resolve_node() {
    local k=${1#node}
    [[ $k =~ ^[0-9]+$ ]] && ((10#$k >= 1 && 10#$k <= N_NODES)) \
        || die "no node '$1' in the slurm testbed (node1..node$N_NODES)"
    node_name "$((10#$k))"
}

slurmd_pid() {  # the live slurmd of the node, by pid file, or nothing
    local pid
    pid=$(cat "$STATE_DIR/slurmd-$1.pid" 2>/dev/null || true)
    if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid"; then echo "$pid"; fi
}

cmd_kill() {
    (($# == 1)) || die "usage: $PROG kill NODE"
    require_root
    [ -f "$CONF" ] || die "no slurm testbed is up in $STATE_DIR"
    take_lock
    local node pid
    node=$(resolve_node "$1")
    pid=$(slurmd_pid "$node")
    # slurmd first, so it cannot report its steps' deaths: to slurmctld the node just goes silent.
    if [ -n "$pid" ]; then
        kill -KILL "$pid"
        wait_gone 5 "$pid" || exit 1
    fi
    kill_steps "$node" || exit 1
}

cmd_start() {
    (($# == 1)) || die "usage: $PROG start NODE"
    require_root
    [ -f "$CONF" ] || die "no slurm testbed is up in $STATE_DIR"
    take_lock
    local node deadline state=""
    node=$(resolve_node "$1")
    [ -z "$(slurmd_pid "$node")" ] || die "slurmd of $node is already running"
    start_slurmd "${node#node}"
    # It has registered once slurmctld no longer marks it not responding (`*`). A node that was
    # down for not responding is idle again (ReturnToService=1); one set down by hand stays down.
    deadline=$((SECONDS + READY_TIMEOUT))
    while :; do
        state=$(SLURM_CONF=$CONF timeout 10 sinfo -h -n "$node" -o '%t' 2>&1 || true)
        [[ -z $state || $state == *'*' || $state == unk* ]] || return 0
        ((SECONDS < deadline)) || die "$node did not register within ${READY_TIMEOUT} s (state '$state'); $(tail -n 3 "$STATE_DIR/slurmd-$node.log" | tr '\n' ' ')"
        sleep 0.1   # poll interval
    done
}

cmd_install() {
    (($# == 0)) || die "usage: $PROG install"
    require_root
    ensure_tools
}

main() {
    local cmd=${1:-}
    case $cmd in
        -h | --help | help) usage; exit 0 ;;
        "") die "usage: $PROG up | down | env | status | kill NODE | start NODE | install" ;;
    esac
    shift
    if [ "$cmd" = up ]; then validate_config; else validate_config use_record; fi
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        env) cmd_env "$@" ;;
        status) cmd_status "$@" ;;
        kill) cmd_kill "$@" ;;
        start) cmd_start "$@" ;;
        install) cmd_install "$@" ;;
        *) die "unknown command '$cmd' (up | down | env | status | kill NODE | start NODE | install)" ;;
    esac
}

main "$@"
