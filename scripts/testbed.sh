#!/usr/bin/env bash
# The multi-host testbed (DESIGN.md §10): N hosts as network namespaces on a private bridge, each
# running Debian's sshd on its own address, one filesystem shared by all but /dev/shm (each host's
# own memory). Faults: `kill` is a power loss, `cut`/`heal` a partition. Traffic never leaves the
# testbed's /24 (no NAT, no forwarding, no default route inside a host, IPv6 off on every testbed
# link). Needs root. See docs/testbed.md.
#
#   testbed.sh up N        create N hosts (tearing down any previous one), print their addresses
#   testbed.sh down        remove everything: processes, namespaces, links, bridge, state dir
#   testbed.sh kill HOST   power loss: link down, then SIGKILL every process of the host
#   testbed.sh start HOST  power on a killed host again: link up, a fresh sshd
#   testbed.sh cut HOST    take the host's link down (its processes keep running)
#   testbed.sh heal HOST   bring it up again
#   testbed.sh status      one line per host: name, address, link, sshd, process count
#   testbed.sh install     install what the testbed needs (done by `up` when missing)
# HOST is an alias (node2), an address (10.213.47.12) or a namespace name (fttb-node2).
set -euo pipefail

PROG=testbed.sh
SUBNET=${FTRUN_TESTBED_SUBNET:-10.213.47.0/24}
STATE_DIR=${FTRUN_TESTBED_DIR:-/tmp/ftrun-testbed}
PREFIX=${FTRUN_TESTBED_PREFIX:-fttb}
READY_TIMEOUT=${FTRUN_TESTBED_READY_TIMEOUT:-30}   # seconds for every sshd to accept a login
KILL_TIMEOUT=10                                    # seconds for a host's processes to be gone
MAX_HOSTS=64
FIRST_HOST=11                                      # node1 is .11, node2 .12, ...
SSHD=/usr/sbin/sshd
MARKER=.ftrun-testbed
READY_PIDS=()

die() { echo "$PROG: error: $*" >&2; DIED=1; exit 1; }
info() { echo "$PROG: $*" >&2; }

usage() {
    sed -n '7,15s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

# ---- configuration, validated once -----------------------------------------------------------

validate_config() {  # $1 = use_record: take the subnet recorded by `up` (all commands but up)
    [[ $PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] \
        || die "FTRUN_TESTBED_PREFIX='$PREFIX' must be 1-8 lowercase letters/digits, starting with a letter"
    [[ $READY_TIMEOUT =~ ^[0-9]+$ ]] && ((10#$READY_TIMEOUT >= 1)) \
        || die "FTRUN_TESTBED_READY_TIMEOUT='$READY_TIMEOUT' must be a whole number of seconds >= 1"
    [[ $STATE_DIR == /* && $STATE_DIR != / && $STATE_DIR != *$'\n'* ]] \
        || die "FTRUN_TESTBED_DIR='$STATE_DIR' must be an absolute path other than /"
    STATE_DIR=${STATE_DIR%/}
    # A subnet recorded by `up` wins, so kill/cut/heal/down act on the testbed that is running.
    if [ "${1:-}" = use_record ] && [ -f "$STATE_DIR/subnet" ]; then SUBNET=$(<"$STATE_DIR/subnet"); fi
    local re='^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.0/24$'
    [[ $SUBNET =~ $re ]] || die "FTRUN_TESTBED_SUBNET='$SUBNET' must look like 10.213.47.0/24"
    local a=$((10#${BASH_REMATCH[1]})) b=$((10#${BASH_REMATCH[2]})) c=$((10#${BASH_REMATCH[3]}))
    ((c <= 255)) || die "FTRUN_TESTBED_SUBNET='$SUBNET' is not an IPv4 /24"
    # Only private space: a public /24 on the bridge would capture the machine's traffic to it.
    ((a == 10 && b <= 255)) || ((a == 172 && b >= 16 && b <= 31)) || ((a == 192 && b == 168)) \
        || die "FTRUN_TESTBED_SUBNET='$SUBNET' is not private (use 10/8, 172.16/12 or 192.168/16)"
    NET=$a.$b.$c
    BR=$PREFIX-br
    BR_ADDR=$NET.1
    SSH_CONFIG=$STATE_DIR/ssh_config
    KNOWN_HOSTS=$STATE_DIR/known_hosts
    KEY=$STATE_DIR/id_ed25519
}

ns_name() { echo "$PREFIX-node$1"; }
veth() { echo "$PREFIX-n$1"; }
host_addr() { echo "$NET.$((FIRST_HOST + $1 - 1))"; }
host_dir() { echo "$STATE_DIR/node$1"; }

require_root() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
}

missing_tools() {
    local missing=() t
    for t in ip ssh ssh-keygen unshare flock mount hostname timeout; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    [ -x "$SSHD" ] || missing+=("$SSHD")
    echo "${missing[*]}"
}

install_packages() {
    command -v apt-get >/dev/null 2>&1 \
        || die "missing $(missing_tools) and no apt-get to install openssh-server openssh-client iproute2"
    info "installing openssh-server openssh-client iproute2 with apt-get"
    # policy-rc.d 101 stops the package from starting a system sshd on 0.0.0.0:22.
    local policy=/usr/sbin/policy-rc.d made_policy=0 rc=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
    fi
    {
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq update \
            && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq install -y \
                --no-install-recommends openssh-server openssh-client iproute2
    } >&2 || rc=$?
    if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi
    [ "$rc" = 0 ] || die "apt-get install openssh-server openssh-client iproute2 failed (exit $rc)"
    local still
    still=$(missing_tools)
    [ -z "$still" ] || die "still missing after install: $still"
}

ensure_tools() {
    [ -z "$(missing_tools)" ] || install_packages
}

# One testbed command at a time. The lock is on this script's file, so nothing is left behind;
# long-lived children are started with the descriptor closed.
take_lock() {
    exec 9<"${BASH_SOURCE[0]}"
    flock -w 120 9 || die "another testbed.sh command still holds the lock after 120 s"
}

# ---- hosts ---------------------------------------------------------------------------------

# Host indices of this testbed's namespaces, ascending.
host_indices() {
    ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$PREFIX-node\([0-9]\{1,\}\)\$/\1/p" | sort -n
}

# HOST (node2 | 10.213.47.12 | fttb-node2) -> index, or die.
resolve_host() {
    local arg=$1 k=""
    if [[ $arg =~ ^node([0-9]+)$ ]]; then k=${BASH_REMATCH[1]}
    elif [[ $arg =~ ^$PREFIX-node([0-9]+)$ ]]; then k=${BASH_REMATCH[1]}
    elif [[ $arg == "$NET".* ]]; then
        local last=${arg##*.}
        if [[ $last =~ ^[0-9]{1,3}$ ]] && ((10#$last >= FIRST_HOST)); then k=$((10#$last - FIRST_HOST + 1)); fi
    fi
    if [[ -n $k ]] && ((10#$k >= 1)) && [ -e "/run/netns/$(ns_name "$((10#$k))")" ]; then
        echo "$((10#$k))"
        return 0
    fi
    local hosts
    hosts=$(host_indices | sed 's/^/node/' | paste -sd ' ' -)
    if [ -z "$hosts" ]; then die "no testbed host '$arg': no testbed with prefix '$PREFIX' is up"; fi
    die "no testbed host '$arg' (hosts: $hosts)"
}

# PIDs of every live process in a network namespace, found by the namespace's inode (which works
# even if the namespace's name is gone). Zombies have left their namespaces and do not show.
pids_in_netns() {
    local ino=$1
    find /proc/[0-9]*/ns/net -maxdepth 0 -lname "net:\[$ino\]" 2>/dev/null | cut -d/ -f3 || true
}

netns_inode() {  # current inode of host k's namespace, else the one recorded at `up`
    local k=$1 f
    f=$(host_dir "$k")/netns_inode
    if [ -e "/run/netns/$(ns_name "$k")" ]; then stat -L -c %i "/run/netns/$(ns_name "$k")"
    elif [ -f "$f" ]; then cat "$f"
    fi
}

# SIGKILL everything in the namespace with this inode until nothing is left (bounded).
kill_netns_processes() {
    local ino=$1 what=$2 pids deadline=$((SECONDS + KILL_TIMEOUT))
    [ -n "$ino" ] || return 0
    while :; do
        pids=$(pids_in_netns "$ino")
        [ -z "$pids" ] && return 0
        if ((SECONDS >= deadline)); then
            echo "$PROG: error: processes of $what survive SIGKILL for ${KILL_TIMEOUT} s: ${pids//$'\n'/ }" >&2
            return 1
        fi
        # shellcheck disable=SC2086
        kill -9 $pids 2>/dev/null || true
        sleep 0.02   # poll interval while the kernel finishes the exits
    done
}

write_host_files() {
    local k=$1 d addr i
    d=$(host_dir "$k")
    addr=$(host_addr "$k")
    mkdir -p "$d"
    ssh-keygen -q -t ed25519 -N '' -C "ftrun-testbed node$k" -f "$d/ssh_host_ed25519_key"
    cat >"$d/sshd_config" <<EOF
# Generated by scripts/testbed.sh for node$k. Removed by \`testbed.sh down\`.
ListenAddress $addr
Port 22
HostKey "$d/ssh_host_ed25519_key"
PidFile "$d/sshd.pid"
AuthorizedKeysFile "$STATE_DIR/authorized_keys"
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
MaxStartups 100:30:200
MaxSessions 100
ClientAliveInterval 2
ClientAliveCountMax 3
AcceptEnv LANG LC_* FTRUN_*
Subsystem sftp internal-sftp
LogLevel INFO
EOF
    # /etc/hosts as seen over ssh on this host: every node by name, the bridge as the machine's
    # own hostname (where the controller runs), so hostname-based rendezvous resolves in the /24.
    {
        echo "127.0.0.1 localhost"
        echo "$BR_ADDR $(hostname) testbed-bridge"
        for ((i = 1; i <= N_HOSTS; i++)); do echo "$(host_addr "$i") node$i"; done
    } >"$d/hosts"
}

# sshd in the host's namespace with its own hostname (UTS namespace), /etc/hosts (a bind mount
# private to the mount namespace `ip netns exec` creates) and host memory: a /dev/shm of its own,
# which dies with the host's last process, as RAM does at a power loss (the memory tier of
# ftrun.checkpoint lives there; a shared one would let a spare "restore from memory" what only the
# dead host held). sshd daemonizes and writes its pid file.
start_sshd() {
    local k=$1 d
    d=$(host_dir "$k")
    rm -f "$d/sshd.pid"
    ip netns exec "$(ns_name "$k")" unshare --uts -- /bin/sh -c \
        'hostname "$1" && mount --bind "$2" /etc/hosts && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$3" -f "$4" -E "$5"' \
        sh "node$k" "$d/hosts" "$SSHD" "$d/sshd_config" "$d/sshd.log" \
        </dev/null >>"$d/sshd.log" 2>&1 9<&- \
        || die "sshd for node$k did not start: $(tail -n 3 "$d/sshd.log" | tr '\n' ' ')"
}

# Every host in $@ accepts a key login within READY_TIMEOUT (checked in parallel). The probe opens
# the sftp subsystem (served inside sshd) rather than a shell, so it never runs root's ~/.bashrc: a
# host killed while a probe's shell starts could otherwise leave that shell's locks (pyenv's rehash
# lock, say) behind on the shared filesystem.
wait_ready() {
    local k pids=() failed=()
    for k in "$@"; do
        (
            deadline=$((SECONDS + READY_TIMEOUT))
            until timeout 5 ssh -F "$SSH_CONFIG" -o ConnectTimeout=2 -s "node$k" sftp </dev/null >/dev/null 2>&1; do
                ((SECONDS < deadline)) || exit 1
                kill -0 $$ 2>/dev/null || exit 1   # the script is gone (interrupted): stop
                sleep 0.05   # poll interval
            done
        ) 9<&- &
        pids+=($!)
        READY_PIDS+=($!)
    done
    local i=0
    for k in "$@"; do
        wait "${pids[$i]}" || failed+=("node$k")
        i=$((i + 1))
    done
    if ((${#failed[@]})); then
        local first=${failed[0]#node}
        die "${failed[*]} did not accept ssh within ${READY_TIMEOUT} s; sshd log: $(tail -n 3 "$(host_dir "$first")/sshd.log" 2>/dev/null | tr '\n' ' ')"
    fi
}

stop_probes() {  # the readiness probes of an interrupted wait_ready, and their ssh children
    local pid children
    for pid in "${READY_PIDS[@]}"; do
        kill -STOP "$pid" 2>/dev/null || continue   # holds it: no new child while we look
        children=$(awk -v p="$pid" '$4 == p {print $1}' /proc/[0-9]*/stat 2>/dev/null || true)
        # shellcheck disable=SC2086
        if [ -n "$children" ]; then kill $children 2>/dev/null || true; fi   # `timeout` passes it to ssh
        kill -KILL "$pid" 2>/dev/null || true
        { wait "$pid"; } 2>/dev/null || true   # reaped quietly (no "Killed" line)
    done
}

wait_link_up() {  # both ends of host k's link carry traffic (bridge port forwarding)
    local k=$1 v deadline=$((SECONDS + 5))
    v=$(veth "$k")
    until [ "$(cat "/sys/class/net/$v/brport/state" 2>/dev/null)" = 3 ] \
        && ip -n "$(ns_name "$k")" link show eth0 2>/dev/null | grep -q LOWER_UP; do
        ((SECONDS < deadline)) || die "link of node$k did not come up within 5 s"
        sleep 0.02
    done
}

disable_ipv6() {  # $1: path under /proc/sys/net/ipv6/conf (absent when IPv6 is off anyway)
    if [ -w "/proc/sys/net/ipv6/conf/$1/disable_ipv6" ]; then echo 1 >"/proc/sys/net/ipv6/conf/$1/disable_ipv6"; fi
}

# Host keys are checked (ftrun refuses an unknown or changed key): the testbed's own known_hosts
# holds each host's key, generated once at `up` and kept by `start`, under its alias and address.
write_known_hosts() {
    local i
    for ((i = 1; i <= N_HOSTS; i++)); do
        printf 'node%d,%s %s\n' "$i" "$(host_addr "$i")" \
            "$(cut -d' ' -f1,2 "$(host_dir "$i")/ssh_host_ed25519_key.pub")"
    done >"$KNOWN_HOSTS"
}

write_ssh_config() {
    local i aliases=""
    for ((i = 1; i <= N_HOSTS; i++)); do aliases+=" node$i"; done
    {
        echo "# Generated by scripts/testbed.sh: ssh -F \"$SSH_CONFIG\" node1"
        for ((i = 1; i <= N_HOSTS; i++)); do
            printf 'Host node%d\n    HostName %s\n' "$i" "$(host_addr "$i")"
        done
        cat <<EOF
Host$aliases $NET.*
    User root
    Port 22
    IdentityFile "$KEY"
    IdentitiesOnly yes
    StrictHostKeyChecking yes
    UserKnownHostsFile "$KNOWN_HOSTS"
    GlobalKnownHostsFile none
    CheckHostIP no
    BatchMode yes
    LogLevel ERROR
    ConnectTimeout 5
    ServerAliveInterval 2
    ServerAliveCountMax 3
EOF
    } >"$SSH_CONFIG"
}

# The /24 must not already be routed or addressed on this machine (checked after our own teardown).
check_subnet_free() {
    local used
    used=$( { ip -4 route show match "$NET.0/24"; ip -4 route show root "$NET.0/24"; } 2>/dev/null \
        | grep -v '^default' | head -n 1 || true)
    [ -z "$used" ] || die "subnet $SUBNET is already in use here (route: $used); set FTRUN_TESTBED_SUBNET to a free private /24"
    used=$(ip -4 -o addr show to "$NET.0/24" 2>/dev/null | awk '{print $2, $4}' | head -n 1 || true)
    [ -z "$used" ] || die "subnet $SUBNET is already in use here (address: $used); set FTRUN_TESTBED_SUBNET to a free private /24"
}

# ---- teardown --------------------------------------------------------------------------------

# Removes everything this testbed (PREFIX, STATE_DIR) made. Safe when nothing is up. Returns
# non-zero (after doing all it can) if something could not be removed.
teardown() {
    local rc=0 k f link ns
    # 1. Power off every host: by namespace name, and by inode recorded at `up` in case a name is gone.
    for k in $(host_indices); do
        ip link set "$(veth "$k")" down 2>/dev/null || true
        kill_netns_processes "$(netns_inode "$k")" "node$k" || rc=1
    done
    for f in "$STATE_DIR"/node*/netns_inode; do
        [ -f "$f" ] || continue
        kill_netns_processes "$(cat "$f")" "${f%/netns_inode}" || rc=1
    done
    # 2. Links (deleting a host-side veth deletes its peer synchronously), then the bridge.
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' \
        | grep -E "^$PREFIX-n[0-9]+\$" || true); do
        ip link del "$link" 2>/dev/null || true
    done
    if ip link show "$BR" >/dev/null 2>&1; then ip link del "$BR" || rc=1; fi
    # 3. Namespaces.
    for k in $(host_indices); do
        ns=$(ns_name "$k")
        ip netns del "$ns" 2>/dev/null || { echo "$PROG: error: could not delete namespace $ns" >&2; rc=1; }
    done
    # 4. State dir: only one this script made (it holds the marker), never anything else.
    if [ -d "$STATE_DIR" ]; then
        if [ -e "$STATE_DIR/$MARKER" ]; then
            rm -rf -- "$STATE_DIR"
        elif ! rmdir -- "$STATE_DIR" 2>/dev/null; then
            echo "$PROG: error: left $STATE_DIR alone: it is not a testbed state dir (no $MARKER)" >&2
            rc=1
        fi
    fi
    return "$rc"
}

# ---- commands --------------------------------------------------------------------------------

cmd_up() {
    [[ ${1:-} =~ ^[0-9]+$ ]] && (($# == 1)) && ((10#$1 >= 1 && 10#$1 <= MAX_HOSTS)) \
        || die "usage: $PROG up N  (N hosts, 1..$MAX_HOSTS)"
    N_HOSTS=$((10#$1))
    require_root
    ensure_tools
    take_lock
    local t0=$EPOCHREALTIME k ns v addr
    if [ -e "$STATE_DIR" ] && [ ! -e "$STATE_DIR/$MARKER" ] && [ -n "$(ls -A "$STATE_DIR" 2>/dev/null)" ]; then
        die "FTRUN_TESTBED_DIR=$STATE_DIR exists and is not a testbed state dir; choose another"
    fi
    # From here on, failing or being interrupted tears down whatever exists (then or before).
    UP_DONE=0
    trap 'rc=$?; if [ "${UP_DONE:-1}" = 0 ]; then
              if [ "$rc" -gt 128 ]; then info "interrupted; tearing down what up made"
              elif [ -z "${DIED:-}" ]; then echo "$PROG: error: up failed (the command above); tearing down" >&2; fi
              stop_probes
              teardown >/dev/null 2>&1 || true
          fi' EXIT
    trap 'exit 130' INT   # exit, so that the EXIT trap runs
    trap 'exit 143' TERM
    teardown >/dev/null || die "could not tear down the previous testbed; run '$PROG down' and read its errors"
    check_subnet_free

    mkdir -p "$STATE_DIR"
    chmod 700 "$STATE_DIR"
    : >"$STATE_DIR/$MARKER"
    echo "$SUBNET" >"$STATE_DIR/subnet"
    ssh-keygen -q -t ed25519 -N '' -C "ftrun-testbed client" -f "$KEY"
    cp "$KEY.pub" "$STATE_DIR/authorized_keys"
    mkdir -p /run/sshd && chmod 755 /run/sshd   # sshd's privilege-separation dir

    # The bridge: the root namespace's end of the /24 (where the controller listens).
    # A fixed MAC: by default a bridge takes its ports' lowest MAC, which changes as hosts come and go.
    ip link add "$BR" address "$(printf '02:00:%02x:%02x:%02x:01' ${NET//./ })" type bridge stp_state 0
    disable_ipv6 "$BR"
    ip addr add "$BR_ADDR/24" dev "$BR"
    ip link set "$BR" up

    for ((k = 1; k <= N_HOSTS; k++)); do
        ns=$(ns_name "$k")
        v=$(veth "$k")
        addr=$(host_addr "$k")
        ip netns add "$ns"
        mkdir -p "$(host_dir "$k")"
        stat -L -c %i "/run/netns/$ns" >"$(host_dir "$k")/netns_inode"
        # IPv6 off before any link exists in the namespace: no link-local chatter leaves the /24.
        ip netns exec "$ns" /bin/sh -c 'for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; do [ -w "$f" ] && echo 1 > "$f"; done; true'
        ip link add "$v" type veth peer name eth0 netns "$ns"
        disable_ipv6 "$v"
        ip link set "$v" master "$BR"
        ip link set "$v" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$addr/24" dev eth0   # the only route: the /24, no default
        ip -n "$ns" link set eth0 up
    done
    for ((k = 1; k <= N_HOSTS; k++)); do write_host_files "$k"; done
    write_known_hosts
    write_ssh_config
    for ((k = 1; k <= N_HOSTS; k++)); do start_sshd "$k"; done
    wait_ready $(seq 1 "$N_HOSTS")
    UP_DONE=1

    for ((k = 1; k <= N_HOSTS; k++)); do host_addr "$k"; done
    info "$N_HOSTS hosts up in $(awk "BEGIN {printf \"%.1f\", $EPOCHREALTIME - $t0}") s; bridge $BR_ADDR; ssh -F \"$SSH_CONFIG\" node1"
}

cmd_down() {
    (($# == 0)) || die "usage: $PROG down"
    require_root
    if ! command -v ip >/dev/null 2>&1; then   # nothing can have been made without ip
        teardown_state_only
        return
    fi
    take_lock
    teardown || die "teardown incomplete (see the errors above)"
}

teardown_state_only() {
    if [ -e "$STATE_DIR/$MARKER" ]; then rm -rf -- "$STATE_DIR"; fi
}

cmd_kill() {
    (($# == 1)) || die "usage: $PROG kill HOST"
    require_root
    take_lock
    local k
    k=$(resolve_host "$1")
    ip link set "$(veth "$k")" down   # first, so no FIN or RST escapes: silence, as on power loss
    kill_netns_processes "$(netns_inode "$k")" "node$k" || exit 1
}

cmd_start() {
    (($# == 1)) || die "usage: $PROG start HOST"
    require_root
    ensure_tools
    take_lock
    local k
    k=$(resolve_host "$1")
    kill_netns_processes "$(netns_inode "$k")" "node$k" || exit 1
    ip link set "$(veth "$k")" up
    wait_link_up "$k"
    start_sshd "$k"
    wait_ready "$k"
}

cmd_cut() {
    (($# == 1)) || die "usage: $PROG cut HOST"
    require_root
    take_lock
    local k
    k=$(resolve_host "$1")
    ip link set "$(veth "$k")" down
}

cmd_heal() {
    (($# == 1)) || die "usage: $PROG heal HOST"
    require_root
    take_lock
    local k
    k=$(resolve_host "$1")
    ip link set "$(veth "$k")" up
    wait_link_up "$k"
}

cmd_status() {
    (($# == 0)) || die "usage: $PROG status"
    require_root
    local k link sshd n pid
    for k in $(host_indices); do
        if ip -o link show "$(veth "$k")" 2>/dev/null | grep -q '[<,]UP[,>]'; then link=up; else link=down; fi
        sshd=stopped
        pid=$(cat "$(host_dir "$k")/sshd.pid" 2>/dev/null || true)
        if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "net:[$(netns_inode "$k")]" ]; then sshd=running; fi
        n=$(pids_in_netns "$(netns_inode "$k")" | wc -l)
        echo "node$k $(host_addr "$k") link=$link sshd=$sshd processes=$n"
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
        "") die "usage: $PROG up N | down | kill HOST | start HOST | cut HOST | heal HOST | status | install" ;;
    esac
    shift
    if [ "$cmd" = up ]; then validate_config; else validate_config use_record; fi
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        kill) cmd_kill "$@" ;;
        start) cmd_start "$@" ;;
        cut) cmd_cut "$@" ;;
        heal) cmd_heal "$@" ;;
        status) cmd_status "$@" ;;
        install) cmd_install "$@" ;;
        *) die "unknown command '$cmd' (up N | down | kill HOST | start HOST | cut HOST | heal HOST | status | install)" ;;
    esac
}

main "$@"
