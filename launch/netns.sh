#!/usr/bin/env bash
# netns.sh - test "hosts" on this machine: network namespaces joined by veth
# pairs and a bridge, and the launch agent mpirun uses to start ranks in them.
#
#   launch/netns.sh up DIR [N]      make N hosts (2..4, default 2); DIR is created
#                                   and holds what the others need
#   launch/netns.sh down DIR        remove them (and DIR); quiet if already gone
#   launch/netns.sh exec DIR H CMD...  run CMD on host H (0..N-1, or its address)
#                                   under its own hostname
#   launch/netns.sh link DIR H up|down  plug or cut host H's cable at the switch
#   launch/netns.sh shape DIR CLASS  give every host's link CLASS: 100g (100 Gb/s,
#                                   5 us), 25g (25 Gb/s, 20 us), 1g (1 Gb/s, 200 us),
#                                   or none (the bare veth); tc netem, or tbf (the
#                                   rate only) where the kernel has no netem
#   launch/netns.sh check           exit 0 when this machine lets us make
#                                   namespaces, 77 (and say why) when not
#
# The layout, for N hosts and a tag T of 4 hex digits chosen by `up`:
#
#   namespace btT-sw: the switch, a bridge `br` with one port `pI` per host
#   namespace btT-hI: host I, interface eth0 = 10.77.0.(I+1)/24, hostname btT-hI
#   (each eth0 -- pI is a veth pair; a link class is a tc qdisc on each eth0)
#
# Nothing is added to the machine's own namespace: no address, route or
# interface, so several sets (and the machine's network) never meet.
#
# DIR holds: `tag`, `hosts` (N), `agent` (for mpirun's plm_rsh_agent: `agent ADDRESS
# COMMAND...` runs COMMAND in that host's namespace with its hostname, as ssh would
# on a remote machine), `topology.yaml` (one cpu rank a host, one thread each) and
# `subnet` (10.77.0.0/24).  mpirun itself runs on host 0 (`exec DIR 0 ...`):
# launch/baton-run --agent DIR/agent picks the MCA settings (see its help).
#
# `up` undoes what it made when a step fails; a caller cleans up with
# `trap 'launch/netns.sh down DIR' EXIT`.  Needs root and iproute2 (ip, tc).
set -euo pipefail
me="netns.sh"
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
subnet_prefix=10.77.0

die() {
    echo "$me: $*" >&2
    exit 1
}
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

# check: can this process make namespaces, veths and qdiscs?  Prints why not.
can_netns() {
    if [ "$(id -u)" != 0 ]; then
        echo "network namespaces need root (running as uid $(id -u))"
        return 1
    fi
    for p in ip tc unshare; do
        command -v "$p" >/dev/null 2>&1 || {
            echo "'$p' not found (Debian: apt-get install iproute2 util-linux)"
            return 1
        }
    done
    local probe="btchk$$"
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "cannot make a network namespace: $err"
        return 1
    fi
    local ok=0
    if ! err=$(ip -n "$probe" link add name va type veth peer name vb 2>&1); then
        echo "cannot make a veth pair in a namespace: $err"
        ok=1
    elif ! err=$(ip -n "$probe" link add name br type bridge 2>&1); then
        echo "cannot make a bridge in a namespace: $err"
        ok=1
    fi
    ip netns del "$probe" 2>/dev/null || true
    return $ok
}

state() { # DIR KEY
    [ -f "$1/$2" ] || die "$1 is not a namespace set made by '$me up' (no $1/$2)"
    cat "$1/$2"
}

# host index from an index or an address
host_index() { # DIR H
    local n h=$2
    n=$(state "$1" hosts)
    case "$h" in
    "$subnet_prefix".*) h=$((${h##*.} - 1)) ;;
    esac
    [[ "$h" =~ ^[0-9]+$ ]] && [ "$h" -lt "$n" ] || die "no host '$2' in $1 (hosts 0..$((n - 1)) or $subnet_prefix.1..$n)"
    echo "$h"
}

cmd_down() { # DIR
    local dir=$1 tag n i
    [ -f "$dir/tag" ] || {
        rm -rf "$dir"
        return 0
    }
    tag=$(cat "$dir/tag")
    n=$(cat "$dir/hosts" 2>/dev/null || echo 4)
    for ((i = 0; i < n; i++)); do
        # what still runs in a host (a rank, an orted) goes with it
        local pids
        pids=$(ip netns pids "bt$tag-h$i" 2>/dev/null || true)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
        ip netns del "bt$tag-h$i" 2>/dev/null || true
    done
    ip netns del "bt$tag-sw" 2>/dev/null || true
    rm -rf "$dir"
}

cmd_up() { # DIR N
    local dir=$1 n=${2:-2}
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] && [ "$n" -le 4 ] || die "up: N must be 2, 3 or 4 (got '$n')"
    [ ! -e "$dir/tag" ] || die "up: $dir already holds a set ($(cat "$dir/tag")); '$me down $dir' first"
    local why
    if ! why=$(can_netns); then
        echo "$me: $why" >&2
        exit 77
    fi
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    local tag
    while :; do
        tag=$(od -An -N2 -tx2 /dev/urandom | tr -d ' \n')
        ip netns list | grep -q "^bt$tag-" || break
    done
    echo "$tag" >"$dir/tag"
    echo "$n" >"$dir/hosts"
    # from here a failure removes what was made
    trap 'cmd_down "$dir"' ERR
    local sw="bt$tag-sw"
    ip netns add "$sw"
    ip -n "$sw" link set dev lo up
    ip -n "$sw" link add name br type bridge
    ip -n "$sw" link set dev br up
    for ((i = 0; i < n; i++)); do
        local ns="bt$tag-h$i"
        ip netns add "$ns"
        ip -n "$ns" link set dev lo up
        ip -n "$sw" link add name "p$i" type veth peer name eth0 netns "$ns"
        ip -n "$sw" link set dev "p$i" master br
        ip -n "$sw" link set dev "p$i" up
        # a connection with unacknowledged data to a peer behind a cut cable
        # fails after ~6 s of retransmissions, not the default ~15 minutes
        # (mpirun's kill order to a daemon it can no longer reach)
        ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=4
        ip -n "$ns" addr add "$subnet_prefix.$((i + 1))/24" dev eth0
        ip -n "$ns" link set dev eth0 up
    done
    trap - ERR
    echo "$subnet_prefix.0/24" >"$dir/subnet"
    cat >"$dir/agent" <<EOF
#!/bin/sh
# mpirun's launch agent for the namespace set in $dir (made by $self):
# "agent [ssh options] ADDRESS COMMAND..." runs COMMAND in that host's namespace
# under its own hostname, as ssh would on another machine.
# "agent --subnet" prints the set's subnet (launch/baton-run asks).
if [ "\$1" = --subnet ]; then cat "$dir/subnet"; exit 0; fi
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
exec "$self" exec "$dir" "\$host" sh -c "\$*"
EOF
    chmod +x "$dir/agent"
    {
        echo "# $n hosts in network namespaces (made by launch/netns.sh up $dir $n)"
        echo "hosts:"
        for ((i = 0; i < n; i++)); do echo "  - {name: bt$tag-h$i, slots: 1, address: $subnet_prefix.$((i + 1))}"; done
        echo "ranks:"
        for ((i = 0; i < n; i++)); do echo "  - {rank: $i, host: bt$tag-h$i, backend: cpu, threads: 1}"; done
        echo "pipeline: {micro_batches: $n}"
        echo "mpi: {pml: ob1}"
    } >"$dir/topology.yaml"
    # wait until every cable is up at both ends (a fresh veth takes a moment)
    for ((i = 0; i < n; i++)); do
        local t
        for t in $(seq 50); do
            ip -n "bt$tag-h$i" -o link show dev eth0 | grep -q 'state UP' &&
                ip -n "$sw" -o link show dev "p$i" | grep -q 'state UP' && break
            if [ "$t" = 50 ]; then
                cmd_down "$dir"
                die "up: the link of host $i ($subnet_prefix.$((i + 1))) did not come up"
            fi
            sleep 0.1
        done
    done
    echo "$me: $n hosts up in $dir (tag $tag, $subnet_prefix.1..$n)" >&2
}

cmd_exec() { # DIR H CMD...
    local dir=$1 tag h
    tag=$(state "$dir" tag)
    h=$(host_index "$dir" "$2")
    shift 2
    [ $# -ge 1 ] || die "exec: no command"
    # unshare --uts: a hostname of its own, as Open MPI tells hosts apart by name
    exec ip netns exec "bt$tag-h$h" unshare --uts sh -c 'hostname "$0" && exec "$@"' "bt$tag-h$h" "$@"
}

cmd_link() { # DIR H up|down
    local dir=$1 tag h
    tag=$(state "$dir" tag)
    h=$(host_index "$dir" "$2")
    case "${3:-}" in up | down) ;; *) die "link: want up or down, got '${3:-}'" ;; esac
    ip -n "bt$tag-sw" link set dev "p$h" "$3"
    [ "$3" = up ] || return 0
    # back in service: both ends up, and no host remembers a neighbour as
    # unreachable from while the cable was out
    local t n i
    n=$(state "$dir" hosts)
    for t in $(seq 50); do
        ip -n "bt$tag-h$h" -o link show dev eth0 | grep -q 'state UP' &&
            ip -n "bt$tag-sw" -o link show dev "p$h" | grep -q 'state UP' && break
        sleep 0.1
    done
    for ((i = 0; i < n; i++)); do ip -n "bt$tag-h$i" neigh flush all 2>/dev/null || true; done
}

cmd_shape() { # DIR CLASS
    local dir=$1 tag n rate delay bytes_s
    tag=$(state "$dir" tag)
    n=$(state "$dir" hosts)
    case "${2:-}" in
    100g) rate=100gbit delay=5us bytes_s=12500000000 ;;
    25g) rate=25gbit delay=20us bytes_s=3125000000 ;;
    1g) rate=1gbit delay=200us bytes_s=125000000 ;;
    none) rate="" delay="" bytes_s=0 ;;
    *) die "shape: unknown link class '${2:-}' (100g, 25g, 1g, none)" ;;
    esac
    # every host's eth0 sends at the class's rate (both directions of a
    # host-to-host path pass one sender's eth0) and, where the kernel has
    # netem, adds the class's one-way latency.  Without netem (some kernels
    # leave it out), tbf gives the rate alone: said once on stderr.
    local warned=0 i burst
    burst=$((bytes_s / 10000)) # 100 us at the rate
    [ "$burst" -lt 16384 ] && burst=16384
    for ((i = 0; i < n; i++)); do
        local ns="bt$tag-h$i"
        tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
        [ -n "$rate" ] || continue
        if ! tc -n "$ns" qdisc add dev eth0 root netem delay "$delay" rate "$rate" limit 100000 2>/dev/null; then
            tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
            if [ "$warned" = 0 ]; then
                echo "$me: shape: this kernel has no netem qdisc: $rate by tbf, no added latency ($delay not emulated)" >&2
                warned=1
            fi
        fi
    done
}

[ $# -ge 1 ] || {
    usage >&2
    exit 2
}
case "$1" in
up) [ $# -ge 2 ] || die "usage: $me up DIR [N]" && cmd_up "$2" "${3:-2}" ;;
down) [ $# -ge 2 ] || die "usage: $me down DIR" && cmd_down "$2" ;;
exec) [ $# -ge 4 ] || die "usage: $me exec DIR H CMD..." && shift && cmd_exec "$@" ;;
link) [ $# -ge 4 ] || die "usage: $me link DIR H up|down" && cmd_link "$2" "$3" "$4" ;;
shape) [ $# -ge 3 ] || die "usage: $me shape DIR CLASS" && cmd_shape "$2" "$3" ;;
check)
    if why=$(can_netns); then exit 0; fi
    echo "$me: $why" >&2
    exit 77
    ;;
-h | --help) usage ;;
*)
    usage >&2
    exit 2
    ;;
esac
