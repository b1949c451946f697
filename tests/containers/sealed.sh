#!/usr/bin/env bash
# sealed.sh WORKDIR ENGINE -- CMD [ARGS...]
#
# Runs CMD with a container engine (podman or docker) that lives ONLY inside a
# fresh network namespace with no uplink (just `lo`). Nothing the engine or its
# containers do can leave this machine: the namespace has no route anywhere.
#
# WORKDIR keeps the engine's persistent state (image store, network configs,
# docker data-root) so a rerun reuses imported images; runtime state (podman
# runroot/tmp_dir, docker exec-root) is wiped/recreated every run, which podman
# treats like a reboot (it resets container states it finds in its db).
#
# Environment seen by CMD:
#   AIRLOCK_TEST_SEALED=1, SEALED_ENGINE=podman|docker, SEALED_WORKDIR=WORKDIR
#   podman: CONTAINERS_CONF, CONTAINERS_STORAGE_CONF
#   docker: DOCKER_HOST=unix://WORKDIR/docker.sock
#
# Knobs: SEALED_DOCKER_CLI (CLI used for the readiness check/teardown; default
# `docker` on PATH — here /usr/local/bin/docker 28.2.2, which talks API 1.41 to
# dockerd 20.10 fine, as does /usr/bin/docker 20.10.24); SEALED_DOCKERD_FLAGS
# (extra dockerd flags, appended so they win).
#
# Exit status: CMD's exit status; 2 for usage errors; 3 if sealing/engine
# start-up failed (CMD not run).
set -euo pipefail

die() { echo "sealed.sh: error: $*" >&2; exit 3; }
log() { echo "sealed.sh: $*" >&2; }
usage() {
    echo "usage: sealed.sh WORKDIR ENGINE -- CMD [ARGS...]   (ENGINE = podman|docker)" >&2
    exit 2
}

[ $# -ge 4 ] || usage
WORKDIR=$1
ENGINE=$2
[ "$3" = "--" ] || usage
shift 3
case $ENGINE in podman|docker) ;; *) usage ;; esac

# ---------------------------------------------------------------- outside ---
if [ -z "${SEALED_INSIDE:-}" ]; then
    [ "$(id -u)" = 0 ] || die "must run as root (unshare --net and mounting tmpfs need it)"
    command -v unshare >/dev/null || die "unshare (util-linux) not found"
    command -v ip >/dev/null || die "ip (iproute2) not found"
    mkdir -p "$WORKDIR"
    WORKDIR=$(realpath "$WORKDIR")
    # These paths get a private tmpfs inside; a WORKDIR under them would vanish.
    case $WORKDIR/ in
        /run/*|/var/run/*|/var/lib/containers/*|/etc/docker/*)
            die "WORKDIR $WORKDIR is under a path that is replaced by tmpfs inside the namespace" ;;
    esac
    self=$(realpath "$0")
    # New net ns (only lo, down) + new mount ns whose mounts never propagate
    # back to the host. exec: this process becomes the namespace's anchor.
    SEALED_INSIDE=1 exec unshare --net --mount --propagation private -- \
        bash "$self" "$WORKDIR" "$ENGINE" -- "$@"
fi

# ----------------------------------------------------------------- inside ---
# Never trust an inherited SEALED_INSIDE blindly: the seal is re-checked here.
ip link set lo up || die "cannot bring lo up"
links=$(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//')
if [ "$links" != "lo" ]; then
    die "refusing to start $ENGINE: network namespace is not sealed (links: $(echo $links))"
fi
if ip -4 route show table all | grep -qv -e ' lo ' -e '^local' -e '^broadcast' 2>/dev/null; then
    die "refusing to start $ENGINE: unexpected routes: $(ip route show table all | tr '\n' ';')"
fi
mynet=$(readlink /proc/self/ns/net)
[ "$mynet" != "$(readlink /proc/1/ns/net)" ] || die "still in the host network namespace (pid 1's)"

[ -d "$WORKDIR" ] || die "WORKDIR $WORKDIR does not exist"

# One sealed.sh per WORKDIR at a time: two engines sharing one store corrupt it.
exec 9>"$WORKDIR/.sealed.lock"
flock -n 9 || die "WORKDIR $WORKDIR is in use by another sealed.sh (lock $WORKDIR/.sealed.lock)"

# Private tmpfs over the engines' well-known runtime/config paths so nothing
# the host's own podman/docker/containerd uses is seen or touched (e.g. the
# host's /run/containerd/containerd.sock, /etc/docker/daemon.json).
for d in /run /var/lib/containers /etc/docker; do
    mkdir -p "$d"
    mount -t tmpfs -o mode=0755 tmpfs "$d" || die "cannot mount tmpfs on $d"
done
mkdir -p /run/lock /run/user

# Runtime state is per run: wipe what a previous run left behind.
rm -rf "$WORKDIR/tmp" "$WORKDIR/runroot"
mkdir -p "$WORKDIR/tmp" "$WORKDIR/runroot" "$WORKDIR/storage" "$WORKDIR/net"

cat >"$WORKDIR/containers.conf" <<EOF
# written by tests/containers/sealed.sh
[containers]
# the host's hard nofile limit can be below podman's default of 1048576
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
# no systemd inside the namespace; hybrid cgroup v1 host
cgroup_manager = "cgroupfs"
exit_command_delay = 5
# journald is not reachable from here
events_logger = "file"
tmp_dir = "$WORKDIR/tmp"

[network]
network_config_dir = "$WORKDIR/net"
EOF
cat >"$WORKDIR/storage.conf" <<EOF
# written by tests/containers/sealed.sh
[storage]
driver = "overlay"
graphroot = "$WORKDIR/storage"
runroot = "$WORKDIR/runroot"
EOF
export CONTAINERS_CONF=$WORKDIR/containers.conf
export CONTAINERS_STORAGE_CONF=$WORKDIR/storage.conf
export AIRLOCK_TEST_SEALED=1 SEALED_ENGINE=$ENGINE SEALED_WORKDIR=$WORKDIR
# the host's registries.conf may name remote registries; make sure nothing
# tries to resolve short names against them (there is no network anyway).
unset DOCKER_CONFIG REGISTRY_AUTH_FILE || true

DOCKER_PID=
DOCKER_PIDFILE=$WORKDIR/docker/dockerd.pid
DOCKER_SOCK=$WORKDIR/docker.sock
DOCKER_BIN=${SEALED_DOCKER_CLI:-docker}

start_docker() {
    command -v dockerd >/dev/null || die "dockerd not found"
    command -v "$DOCKER_BIN" >/dev/null || die "docker CLI ($DOCKER_BIN) not found"
    # unix socket paths are limited to 108 bytes
    [ ${#DOCKER_SOCK} -lt 100 ] || die "WORKDIR path too long for a unix socket: $DOCKER_SOCK"
    mkdir -p "$WORKDIR/docker/data"
    rm -f "$DOCKER_SOCK" "$DOCKER_PIDFILE"
    # Measured here (dockerd 20.10.24 in this netns): dockerd starts with NO
    # special flags (it then makes docker0 172.17.0.1/16, NAT rules and sets
    # ip_forward=1 inside this netns). The flags below are choices, not needs:
    # --exec-root on the private /run tmpfs: fresh each run, and short enough
    #   for containerd's socket paths (unix sockets are limited to 108 bytes).
    # --iptables=false --ip-forward=false --ip-masq=false: keep the netns
    #   free of NAT/forwarding. NOTE docker's --internal isolation is iptables
    #   FORWARD rules only; traffic from a container to the engine netns' own
    #   bridge IPs is never forwarded, so with or without iptables a sandbox
    #   reaches services on the bridge IPs unless the internal network is
    #   created with -o com.docker.network.bridge.inhibit_ipv4=true.
    # The default bridge (docker0) stays: it is the proxy container's uplink, as on a user's
    # machine; in this namespace its gateway is the namespace's own side, where tests serve.
    # --storage-driver overlay2: WORKDIR is on ext4, overlay2 works (no vfs).
    # containerd: dockerd starts its own (host's /run/containerd is hidden).
    # SEALED_DOCKERD_FLAGS is appended; later flags win (e.g. --iptables=true).
    dockerd \
        --data-root "$WORKDIR/docker/data" \
        --exec-root /run/sealed-docker \
        --pidfile "$DOCKER_PIDFILE" \
        -H "unix://$DOCKER_SOCK" \
        --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
        --storage-driver overlay2 \
        --userland-proxy=false \
        --default-ulimit nofile=1024:1024 \
        --log-level warn \
        ${SEALED_DOCKERD_FLAGS:-} \
        >"$WORKDIR/docker/dockerd.log" 2>&1 &
    DOCKER_PID=$!
    export DOCKER_HOST=unix://$DOCKER_SOCK
    local i
    for i in $(seq 1 60); do
        if "$DOCKER_BIN" version >/dev/null 2>&1; then
            log "dockerd up after ~$((i / 2)) s (pid $DOCKER_PID, log $WORKDIR/docker/dockerd.log)"
            return 0
        fi
        if ! kill -0 "$DOCKER_PID" 2>/dev/null; then
            tail -20 "$WORKDIR/docker/dockerd.log" >&2 || true
            die "dockerd exited during start-up (log: $WORKDIR/docker/dockerd.log)"
        fi
        sleep 0.5
    done
    tail -20 "$WORKDIR/docker/dockerd.log" >&2 || true
    die "dockerd did not answer 'docker version' within 30 s (log: $WORKDIR/docker/dockerd.log)"
}

# Kill processes whose network namespace is exactly ours. Everything an engine
# spawns here (conmon, aardvark-dns, containerd, shims) shares our netns; a
# same-named process elsewhere on the host never does, so we never kill by name.
kill_ours() {
    local sig=$1 p pid ns comm n=0
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [ "$pid" = "$$" ] && continue
        [ "$pid" = "${BASHPID:-$$}" ] && continue
        ns=$(readlink "$p/ns/net" 2>/dev/null) || continue
        [ "$ns" = "$mynet" ] || continue
        comm=$(cat "$p/comm" 2>/dev/null) || continue
        case $comm in
            conmon|aardvark-dns|containerd|containerd-shim*|dockerd|docker-proxy|catatonit|podman|netavark)
                kill "-$sig" "$pid" 2>/dev/null && n=$((n + 1)) ;;
        esac
    done
    echo "$n"
}

teardown() {
    set +e
    if [ "$ENGINE" = podman ]; then
        timeout 60 podman rm -af -t 0 >/dev/null 2>&1 || log "warning: podman rm -af failed"
        timeout 30 podman pod rm -af -t 0 >/dev/null 2>&1
    elif [ -n "$DOCKER_PID" ]; then
        local ids
        ids=$(timeout 20 "$DOCKER_BIN" ps -aq 2>/dev/null)
        [ -n "$ids" ] && timeout 60 "$DOCKER_BIN" rm -f $ids >/dev/null 2>&1
        local pid
        pid=$(cat "$DOCKER_PIDFILE" 2>/dev/null || echo "$DOCKER_PID")
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -KILL "$pid" 2>/dev/null
        wait "$DOCKER_PID" 2>/dev/null
    fi
    local n
    n=$(kill_ours TERM)
    if [ "$n" != 0 ]; then
        sleep 1
        n=$(kill_ours KILL)
        [ "$n" = 0 ] || log "killed $n leftover engine process(es) in this netns"
    fi
}

if [ "$ENGINE" = docker ]; then
    start_docker
else
    command -v podman >/dev/null || die "podman not found"
fi
trap 'teardown; exit 130' INT TERM

# CMD must not believe it is already sealed if it starts sealed.sh again with
# another WORKDIR (that must get its own namespace).
unset SEALED_INSIDE
set +e
"$@"
status=$?
set -e
trap - INT TERM
teardown
exit "$status"
