#!/usr/bin/env bash
# exec-scenario.sh AIRLOCK AIRLOCKD — one `airlock exec --backend podman|docker` session
# inside sealed.sh, as a user would run it, with the escapes a sandbox container could try.
# Prints `RESULT name=value` lines that tests/it/container_backend.rs judges; everything
# else is the session's own output, for the reader of a failed run.
#
# Network safety: runs only inside sealed.sh's namespace (no uplink). The one upstream
# server listens in that namespace; names resolve only through the test resolver file.
set -euo pipefail
[ "${AIRLOCK_TEST_SEALED:-}" = 1 ] || { echo "exec-scenario.sh: run inside sealed.sh" >&2; exit 2; }
[ $# -eq 2 ] || { echo "usage: exec-scenario.sh AIRLOCK AIRLOCKD" >&2; exit 2; }
AIRLOCK=$1 AIRLOCKD=$2
E=$SEALED_ENGINE W=$SEALED_WORKDIR
here=$(dirname "$(realpath "$0")")
result() { echo "RESULT $1=$2"; }

"$here/images.sh" "$E" "$AIRLOCKD" "$W" >&2

# The engine's default network (the proxy's uplink) exists once a container used it; its
# gateway is this namespace's side, where the upstream server listens.
if [ "$E" = podman ]; then
    podman network inspect podman >/dev/null
    GW=$(podman network inspect --format '{{range .Subnets}}{{.Gateway}}{{end}}' podman)
else
    # The default bridge's IPAM entry may name no gateway; docker0's own address is it.
    GW=$(ip -4 -o addr show docker0 | awk '{print $4}' | cut -d/ -f1)
fi
[ -n "$GW" ] || { echo "no gateway on the engine's default network" >&2; exit 3; }
result gateway "$GW"

S=$(mktemp -d "$W/scenario.XXXXXX")
export HOME="$S/home"
# This world's own airlockd: another scenario's (another namespace) must not be found.
export XDG_RUNTIME_DIR="$S/xdg"
unset AIRLOCK_SOCKET
mkdir -p "$HOME/.airlock" "$S/app" "$XDG_RUNTIME_DIR"
chmod 0700 "$XDG_RUNTIME_DIR"
PORT=18080
mkdir -p "$S/www" && echo upstream-ok > "$S/www/ok"
python3 -m http.server "$PORT" --bind 0.0.0.0 --directory "$S/www" >"$S/www.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
# A resolver on every address of this namespace (127.0.0.1 too) that answers any name and
# counts queries: nothing the sandbox does may reach it (Docker's embedded resolver forwards
# to the `--dns` address; Podman's aardvark-dns to the host's).
cat > "$S/dns.py" <<'PY'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 53))
log = open(sys.argv[1], "a", buffering=1)
while True:
    q, peer = s.recvfrom(512)
    log.write(peer[0] + "\n")
    # Answer with one A record 10.99.99.99 (a name that "resolved" shows the leak).
    s.sendto(q[:2] + b"\x81\x80" + q[4:6] + q[4:6] + b"\x00\x00\x00\x00" + q[12:]
             + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\x0a\x63\x63\x63", peer)
PY
# The engines read the host's resolver list for their containers and their own forwarding;
# in this mount namespace it names the counting resolver, so a sandbox given any resolver at
# all is seen.
printf 'nameserver %s\n' "$GW" > "$S/resolv.conf"
mount --bind "$S/resolv.conf" /etc/resolv.conf
: > "$S/dns.log"
python3 "$S/dns.py" "$S/dns.log" &
dns=$!
trap 'kill $srv $dns 2>/dev/null || true' EXIT
printf 'allowed.test %s\ndenied.test %s\nfleet-blocked.test %s\n' "$GW" "$GW" "$GW" > "$S/resolver"
export AIRLOCK_TEST_RESOLVER="$S/resolver"
# The user allows fleet-blocked.test; the machine's managed layer blocks it. The proxy
# container can read neither file: it must get both through the layers file.
cat > "$HOME/.airlock/config.toml" <<TOML
[network]
allow = ["allowed.test:$PORT", "fleet-blocked.test:$PORT"]
allow_private = ["$GW/32"]
TOML
export AIRLOCK_TEST_MANAGED_POLICY="$S/managed-policy.toml"
printf '[network]\nblock = ["fleet-blocked.test"]\n' > "$AIRLOCK_TEST_MANAGED_POLICY"
"$AIRLOCK" login --email dev@example.test >/dev/null 2>&1 || true
git -C "$S/app" init -q
mkdir -p "$S/app/.git/hooks"
cd "$S/app"

# The session: the allowed fetch, the denied one, then every escape a sandbox may try.
set +e
"$AIRLOCK" exec --backend "$E" -- sh -c '
  echo "RESULT inside_user=$(id -u):$(id -g)"
  echo "RESULT inside_home=$HOME"
  echo "RESULT inside_pwd=$(pwd)"
  echo "RESULT inside_hostname=$(hostname)"
  echo "RESULT inside_proxy=$HTTPS_PROXY"
  echo "RESULT fetch_allowed=$(curl -sS -m 10 http://allowed.test:'"$PORT"'/ok 2>&1)"
  echo "RESULT fetch_managed_block=$(curl -sS -m 10 -o /dev/null -w %{http_code} http://fleet-blocked.test:'"$PORT"'/ok 2>&1)"
  echo "RESULT fetch_denied=$(curl -sS -m 10 -o /dev/null -w %{http_code} http://denied.test:'"$PORT"'/ok 2>&1)"
  python3 - <<PY
import socket, os, subprocess
def tcp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.settimeout(3)
    try:
        s.connect((host, port)); return "connected"
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()
print("RESULT direct_gateway=" + tcp("'"$GW"'", '"$PORT"'))
# The first address of the internal network: the internal bridge of Docker holds it on the
# engine host unless inhibit_ipv4 takes it away (the upstream listens on every host address).
# (No apostrophe in this block: it is inside a single-quoted sh -c script.)
import ipaddress
mine = [l.split()[3] for l in subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout.splitlines() if " lo " not in l]
first = str(next(ipaddress.ip_interface(mine[0]).network.hosts())) if mine else "none"
print("RESULT internal_first=" + (tcp(first, '"$PORT"') if first != ipaddress.ip_interface(mine[0]).ip.compressed else "self"))
proxy = socket.gethostbyname("airlock-proxy")
print("RESULT proxy_other_port=" + tcp(proxy, '"$PORT"'))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
try:
    u.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x04test\x00\x00\x01\x00\x01", ("'"$GW"'", 53))
    u.recvfrom(512); print("RESULT dns_udp=answered")
except OSError as e:
    print("RESULT dns_udp=" + type(e).__name__)
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")] if os.path.exists("/etc/resolv.conf") else []
print("RESULT resolv_conf=" + (",".join(ns) if ns else "absent"))
try:
    socket.getaddrinfo("leak-probe.example", 80); print("RESULT name_lookup=resolved")
except OSError as e:
    print("RESULT name_lookup=" + type(e).__name__)
v6 = open("/proc/net/if_inet6").read().strip() if os.path.exists("/proc/net/if_inet6") else ""
print("RESULT ipv6_addresses=" + str(len(v6.splitlines()) if v6 else 0))
r = subprocess.run(["ip", "route", "replace", "default", "via", proxy], capture_output=True, text=True)
print("RESULT route_change=" + ("ok" if r.returncode == 0 else "refused"))
print("RESULT engine_socket=" + ("visible" if any(os.path.exists(p) for p in ["/run/podman/podman.sock", "/var/run/docker.sock", "/run/docker.sock"]) else "absent"))
print("RESULT daemon_socket=" + ("visible" if os.path.exists("'"$XDG_RUNTIME_DIR"'/airlock/airlock.sock") else "absent"))
print("RESULT host_home=" + ("visible" if os.path.exists("'"$HOME"'/.airlock") else "absent"))
PY
  echo planted > .envrc 2>/dev/null && echo "RESULT envrc_write=written" || echo "RESULT envrc_write=refused"
  echo "#!/bin/sh" > .git/hooks/post-checkout 2>/dev/null && echo "RESULT hook_write=written" || echo "RESULT hook_write=refused"
  mkdir -p sub evil/objects evil/refs
  printf "ref: refs/heads/main\n" > evil/HEAD
  printf "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch '"$S"'/pwned\n" > evil/config
  printf "gitdir: ../evil\n" > sub/.git && echo "RESULT plant_gitdir=written"
  exit 7
'
rc=$?
set -e
result exit_code "$rc"
result envrc_after "$([ -e "$S/app/.envrc" ] && echo present || echo absent)"
result hook_after "$([ -e "$S/app/.git/hooks/post-checkout" ] && echo present || echo absent)"
# Step two of the planted git dir: the host's own git, run where the agent left it, must not
# take the planted `.git` file (whose git dir's fsmonitor would run a command on the host).
result gitdir_after "$([ -e "$S/app/sub/.git" ] && echo present || echo absent)"
(cd "$S/app/sub" && git status >/dev/null 2>&1) || true
result host_git_ran_planted "$([ -e "$S/pwned" ] && echo yes || echo no)"
# `--rm` removal is the engine's, after the container stopped (Docker's is asynchronous).
for _ in $(seq 50); do [ "$("$E" ps -aq | wc -l)" = 0 ] && break; sleep 0.1; done
result containers_left "$("$E" ps -aq | wc -l)"
key8=$(printf '%s' "$(realpath "$S/app")" | sha256sum | cut -c1-8)
result network_made "$("$E" network inspect "airlock-net-$key8" >/dev/null 2>&1 && echo yes || echo no)"
logs=$(ls -d "$HOME"/.airlock/logs/app* | head -n1)
result audit_allow "$(cat "$logs"/audit-*.jsonl | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r.get("host")=="allowed.test" and r.get("allowed"): print(r.get("session","")[:8]+","+str(r.get("user_id") is not None)+","+str(r.get("layer")))
' | head -n1)"
result audit_deny "$(cat "$logs"/audit-*.jsonl | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r.get("host")=="denied.test" and not r.get("allowed"): print(str(r.get("reason"))+","+str(r.get("layer")))
' | head -n1)"
result audit_managed "$(cat "$logs"/audit-*.jsonl | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r.get("host")=="fleet-blocked.test": print(str(r.get("allowed"))+","+str(r.get("layer")))
' | head -n1)"
result dns_queries_seen "$(wc -l < "$S/dns.log")"
result session_records "$(cat "$logs"/sessions-*.jsonl | python3 -c '
import json,sys
recs=[json.loads(l) for l in sys.stdin]
audit_sessions={json.loads(l).get("session") for f in sys.argv[1:] for l in open(f)}
starts=[r for r in recs if r.get("kind")=="start"]
ends=[r for r in recs if r.get("kind")=="end"]
same=all(r.get("session") in audit_sessions for r in starts)
status = ends[0].get("exit_status") if ends else None
rooted = bool(ends and ends[0].get("audit_root"))
print(",".join(str(x) for x in [len(starts), len(ends), same, status, rooted]))
' "$logs"/audit-*.jsonl)"
result audit_repo_key "$(head -n1 "$logs"/audit-*.jsonl | python3 -c 'import json,sys; r=json.loads(sys.stdin.readline()); print(str(r.get("repo_path") is not None)+","+str(r.get("repo_key") is not None))')"

# Docker's second wall, alone: the host-side drop rule for the repo's bridge, which a helper
# container put in place. An address given to the bridge later (inhibit_ipv4 then no longer
# holds) is on the sandbox's link, and the upstream listens on every address here: only the
# rule stands between them.
tcpprobe='import socket,sys
s=socket.socket(); s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print("connected")
except OSError as e:
    print(type(e).__name__)'
if [ "$E" = docker ]; then
    br="alk-$key8"
    result bridge_guard "$(nft list table inet "airlock-guard-$br" 2>/dev/null | grep -c "iifname \"$br\" drop" || true)"
    sub=$(docker network inspect --format '{{range .IPAM.Config}}{{.Subnet}}{{end}}' "airlock-net-$key8")
    first=$(python3 -c 'import ipaddress,sys; print(next(ipaddress.ip_network(sys.argv[1]).hosts()))' "$sub")
    ip addr add "$first/${sub#*/}" dev "$br"
    result guard_added_address "$("$AIRLOCK" exec --quiet --backend docker -- python3 -c "$tcpprobe" "$first" "$PORT" 2>/dev/null)"
    ip addr del "$first/${sub#*/}" dev "$br"
fi

# Phase 2, while a session of this repo runs: a container on the engine's default network
# (the proxy's uplink) tries to use the proxy, and a second repo's sandbox tries to reach it.
# (The command handles no signal: as the container's PID 1 it would ignore SIGTERM; the
# sandbox's init passes it on.)
"$AIRLOCK" exec --quiet --backend "$E" -- \
    sh -c "curl -sS -m 5 -o /dev/null http://allowed.test:$PORT/ok; exec sleep 120" &
long=$!
for _ in $(seq 100); do
    name=$("$E" ps --format '{{.Names}}' | grep '^airlock-proxy-app-' | head -n1 || true)
    [ -n "$name" ] && [ -n "$(ls "$HOME"/.airlock/run/*/proxy/ready 2>/dev/null)" ] && break
    sleep 0.1
done
pip=$("$E" inspect --format "{{(index .NetworkSettings.Networks \"airlock-net-$key8\").IPAddress}}" "$name")
uip=$("$E" inspect --format "{{(index .NetworkSettings.Networks \"$([ "$E" = podman ] && echo podman || echo bridge)\").IPAddress}}" "$name")
probe='import socket,sys
s=socket.socket(); s.settimeout(3)
try:
    s.connect((sys.argv[1], 8888)); print("connected")
except OSError as e:
    print(type(e).__name__)'
result neighbour_uplink_ip "$("$E" run --rm --network "$([ "$E" = podman ] && echo podman || echo bridge)" airlock/base:latest python3 -c "$probe" "$uip" 2>/dev/null)"
# The page's live view: the proxy container's stdout has an ALLOW line per allowed attempt.
for _ in $(seq 50); do "$E" logs "$name" 2>/dev/null | grep -q ' ALLOW ' && break; sleep 0.1; done
# What the proxy container is given: its own directory, never the sandbox's env file.
result proxy_dir "$(ls "$HOME"/.airlock/run/*/proxy/ | sort | tr '\n' ' ')"
result live_view "$("$E" logs "$name" 2>/dev/null | grep -c "Z ALLOW allowed.test:$PORT GET ")"
# A second session of the same repo (same network) asks the first session's proxy: refused,
# so it cannot take that session's phase or be recorded as that session.
result same_repo_other_proxy "$(cd "$S/app" && "$AIRLOCK" exec --quiet --backend "$E" -- \
    sh -c "curl -sS -m 5 -x http://$pip:8888 http://allowed.test:$PORT/ok 2>/dev/null || echo refused")"
mkdir -p "$S/other" && git -C "$S/other" init -q
result other_repo_reach "$(cd "$S/other" && "$AIRLOCK" exec --quiet --backend "$E" -- python3 -c "$probe" "$pip" 2>/dev/null)"
result other_repo_net_differs "$([ "$("$E" network ls --format '{{.Name}}' | grep -c '^airlock-net-')" -ge 2 ] && echo yes || echo no)"
# SIGTERM to `airlock` alone ends that session cleanly: passed on to the engine CLI, then the
# proxy stopped and removed, the sweep, the end record.
kill -TERM "$long"
set +e
wait "$long"
result long_exit "$?"
set -e
result long_containers_left "$("$E" ps -a --format '{{.Names}}' | grep -c "$(echo "$name" | cut -d- -f1-4)" || true)"
# A network of another repo's name made by someone else, not sealed: the session refuses it.
mkdir -p "$S/planted" && git -C "$S/planted" init -q
pk=$(printf '%s' "$(realpath "$S/planted")" | sha256sum | cut -c1-8)
if [ "$E" = podman ]; then
    podman network create --internal "airlock-net-$pk" >/dev/null
else
    docker network create --internal "airlock-net-$pk" >/dev/null
fi
set +e
planted_err=$(cd "$S/planted" && "$AIRLOCK" exec --quiet --backend "$E" -- true 2>&1)
planted_rc=$?
set -e
result planted_network "$planted_rc,$(echo "$planted_err" | grep -c 'is not sealed')"
# The user's `[audit]` bounds reach the proxy container: past session_budget the session is
# stopped (exit 124, the message on stderr) and its sandbox killed, not left running its
# `sleep`; the proxy writes the stop line.
cp "$HOME/.airlock/config.toml" "$S/config.saved"
printf '[audit]\nsession_budget = "3KiB"\nburst = 0\n' >> "$HOME/.airlock/config.toml"
set +e
budget_err=$(cd "$S/app" && "$AIRLOCK" exec --quiet --backend "$E" -- \
    sh -c "i=0; while [ \$i -lt 200 ]; do curl -s -m 2 -o /dev/null http://denied.test:$PORT/\$i; i=\$((i + 1)); done; sleep 60; echo ran-on > ran-on" 2>&1 >/dev/null)
budget_rc=$?
set -e
cp "$S/config.saved" "$HOME/.airlock/config.toml"
result budget_stop "$budget_rc,$(echo "$budget_err" | grep -c 'session stopped: .*session_budget')"
# Killed, not left to finish with its traffic refused: the line after its `sleep` never ran.
result budget_ran_on "$([ -e "$S/app/ran-on" ] && echo yes || echo no)"
result budget_line "$(cat "$logs"/audit-*.jsonl | python3 -c '
import json, sys
print(sum(1 for l in sys.stdin if json.loads(l).get("reason") == "audit_budget" and not json.loads(l).get("seqs")))')"
result budget_end_reason "$(cat "$logs"/sessions-*.jsonl | python3 -c '
import json, sys
ends = [json.loads(l) for l in sys.stdin if json.loads(l).get("kind") == "end"]
print(",".join(str(e.get("end_reason")) for e in ends if e.get("exit_status") == 124))')"
set +e
doctor=$("$AIRLOCK" doctor --backend "$E" 2>&1)
set -e
result doctor_engine "$(echo "$doctor" | grep -c "^\[ok  \] backend   $E [0-9]")"
result doctor_images "$(echo "$doctor" | grep -c '^\[ok  \] backend   image airlock/.*: present')"
result doctor_sealed "$(echo "$doctor" | grep -c "network airlock-net-$key8: sealed")"
result doctor_planted "$(echo "$doctor" | grep -c "^\[FAIL\] backend   network airlock-net-$pk: not sealed")"
result doctor_seccomp "$(echo "$doctor" | grep -c "^\[ok  \] backend   $E runs containers with its seccomp profile" || true)"
result doctor_proxy_version "$(echo "$doctor" | grep -c '^\[ok  \] backend   image airlock/proxy:latest: airlockd [0-9.]*, as this airlock' || true)"
result doctor_guard "$(echo "$doctor" | grep -c "^\[ok  \] backend   bridge alk-$key8: the host drops" || true)"
# `airlock run --backend`: an image with a (fake) `claude` made from airlock/base, run twice.
"$E" rm -f airlock-test-mk >/dev/null 2>&1 || true
"$E" run --name airlock-test-mk --network none airlock/base:latest sh -c 'mkdir -p /usr/local/bin && cat > /usr/local/bin/claude <<"AGENT"
#!/bin/sh
echo "RESULT agent_home=$HOME"
echo "RESULT agent_args=$*"
n=$(cat "$HOME/.runs" 2>/dev/null || echo 0)
echo $((n + 1)) > "$HOME/.runs"
echo "RESULT agent_runs=$((n + 1))"
mkdir -p "$HOME/.claude/projects/app"
echo "{\"type\":\"user\",\"n\":$n}" >> "$HOME/.claude/projects/app/session.jsonl"
AGENT
chmod 0755 /usr/local/bin/claude' >/dev/null
"$E" commit airlock-test-mk localhost/airlock-test/agent:latest >/dev/null
"$E" rm -f airlock-test-mk >/dev/null
for _ in 1 2; do
    AIRLOCK_BASE_IMAGE=localhost/airlock-test/agent:latest \
        "$AIRLOCK" run --quiet --backend "$E" claude -- --print hello
done
result agent_record "$(cat "$logs"/sessions-*.jsonl | python3 -c '
import json, sys
recs = [json.loads(l) for l in sys.stdin]
end = [r for r in recs if r.get("kind") == "end"][-1]
start = [r for r in recs if r.get("kind") == "start" and r.get("session") == end.get("session")][0]
print(str(start.get("agent")) + "," + str(len(end.get("transcripts") or [])))
')"
result run_dir_left "$(ls "$HOME/.airlock/run" 2>/dev/null | wc -l)"
