#!/usr/bin/env bash
# rootless-scenario.sh AIRLOCK AIRLOCKD — one `airlock exec --backend podman` session run by an
# unprivileged user with rootless Podman (its own user namespace, `--userns=keep-id`, the
# repo network inside Podman's rootless network namespace), inside sealed.sh. Prints
# `RESULT name=value` lines that tests/it/container_backend.rs judges.
#
# As root (sealed.sh's namespace, private mounts): the test user (`airlock-ci`, as
# .ci/unprivileged makes it), its subordinate ids (a private bind over /etc/subuid and
# /etc/subgid), the images (built into root's store, then `podman save`d for the user), a
# link 10.77.0.1/24 with no uplink (a veth pair with both ends in the namespace) where the upstream listens (the proxy container
# reaches it through slirp4netns; the namespace still has no way out), and copies of the
# binaries the user can read. Then the user runs the session.
#
# Network safety: everything stays in sealed.sh's namespace; the veth pair goes nowhere.
set -euo pipefail
[ "${AIRLOCK_TEST_SEALED:-}" = 1 ] || { echo "rootless-scenario.sh: run inside sealed.sh" >&2; exit 2; }
[ $# -eq 2 ] || { echo "usage: rootless-scenario.sh AIRLOCK AIRLOCKD" >&2; exit 2; }
[ "$SEALED_ENGINE" = podman ] || { echo "rootless-scenario.sh: podman only" >&2; exit 2; }
AIRLOCK=$1 AIRLOCKD=$2
W=$SEALED_WORKDIR
here=$(dirname "$(realpath "$0")")
result() { echo "RESULT $1=$2"; }

U=airlock-ci
# (.ci/unprivileged makes the same user: if both race, the loser finds it made.)
id -u "$U" >/dev/null 2>&1 ||
    useradd --system --user-group --create-home --home-dir "/var/lib/$U" --shell /bin/bash "$U" ||
    id -u "$U" >/dev/null
uid=$(id -u "$U") gid=$(id -g "$U")
printf '%s:200000:65536\n' "$U" > "$W/subids"
for f in /etc/subuid /etc/subgid; do
    # A bind needs a file to cover (an empty one is what a machine without them means).
    [ -e "$f" ] || : > "$f"
    mount --bind "$W/subids" "$f"
done

"$here/images.sh" podman "$AIRLOCKD" "$W" >&2
R=$W/rootless
rm -rf "$R"
mkdir -p "$R/bin" "$R/home/.airlock" "$R/xdg" "$R/app" "$R/www"
# One archive per image (podman 4.3 loads a two-image archive as one image under both names).
podman save -o "$R/base.tar" airlock/base:latest >/dev/null
podman save -o "$R/proxy.tar" airlock/proxy:latest >/dev/null
cp "$AIRLOCK" "$AIRLOCKD" "$R/bin/"
echo upstream-ok > "$R/www/ok"

# (A veth pair with both ends here: the kernel may lack the dummy driver; either goes nowhere.)
ip link add alk-test-up type veth peer name alk-test-peer
ip addr add 10.77.0.1/24 dev alk-test-up
ip link set alk-test-up up
ip link set alk-test-peer up
PORT=18080
python3 -m http.server "$PORT" --bind 10.77.0.1 --directory "$R/www" >"$W/rootless-www.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT

cat > "$R/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
printf 'allowed.test 10.77.0.1\ndenied.test 10.77.0.1\n' > "$R/resolver"
cat > "$R/home/.airlock/config.toml" <<TOML
[network]
allow = ["allowed.test:$PORT"]
allow_private = ["10.77.0.1/32"]
TOML
chown -R "$uid:$gid" "$R"
chmod 0700 "$R/xdg"

# The user's session: the contract, the proxy, a direct escape, a file made inside.
cat > "$R/session.sh" <<'SESSION'
set -euo pipefail
podman load -i "$R/base.tar" >/dev/null
podman load -i "$R/proxy.tar" >/dev/null
git -C "$R/app" init -q
cd "$R/app"
set +e
"$R/bin/airlock" exec --quiet --backend podman -- sh -c '
  echo "RESULT inside_user=$(id -u):$(id -g)"
  echo "RESULT fetch_allowed=$(curl -sS -m 10 http://allowed.test:'"$PORT"'/ok 2>&1)"
  echo "RESULT fetch_denied=$(curl -sS -m 10 -o /dev/null -w %{http_code} http://denied.test:'"$PORT"'/ok 2>&1)"
  python3 -c "
import socket
s = socket.socket(); s.settimeout(3)
try:
    s.connect((\"10.77.0.1\", '"$PORT"')); print(\"RESULT direct=connected\")
except OSError as e:
    print(\"RESULT direct=\" + type(e).__name__)
"
  echo made > made-inside
  mkdir -p sub evil/objects evil/refs
  printf "ref: refs/heads/main\n" > evil/HEAD
  printf "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch '"$R"'/pwned\n" > evil/config
  printf "gitdir: ../evil\n" > sub/.git && echo "RESULT plant_gitdir=written"
  exit 5
'
echo "RESULT exit_code=$?"
set -e
echo "RESULT made_owner=$(stat -c %u:%g "$R/app/made-inside" 2>/dev/null || echo missing)"
# Step two, as the same unprivileged user: their own git, run where the sandbox planted a
# `.git` file whose git dir runs a command, runs nothing; the next session sees no plant.
echo "RESULT gitdir_after=$([ -e "$R/app/sub/.git" ] && echo present || echo absent)"
(cd "$R/app/sub" && git status >/dev/null 2>&1) || true
echo "RESULT host_git_ran_planted=$([ -e "$R/pwned" ] && echo yes || echo no)"
set +e
"$R/bin/airlock" exec --quiet --backend podman -- sh -c 'test ! -e sub/.git'
echo "RESULT next_session=$?"
set -e
# The control: a plain container on the rootless default network reaches the upstream, so the
# sandbox's refusal above is its network's doing, not an upstream nobody could reach.
echo "RESULT control_direct=$(podman run --rm --network podman airlock/base:latest python3 -c "
import socket
s = socket.socket(); s.settimeout(3)
try:
    s.connect(('10.77.0.1', $PORT)); print('connected')
except OSError as e:
    print(type(e).__name__)
" 2>/dev/null)"
echo "RESULT containers_left=$(podman ps -aq | wc -l)"
echo "RESULT rootless=$(podman info --format '{{.Host.Security.Rootless}}')"
logs=$(ls -d "$HOME"/.airlock/logs/app* | head -n1)
echo "RESULT audit=$(cat "$logs"/audit-*.jsonl | python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin]
ok = [l for l in lines if l.get("host") == "allowed.test" and l.get("allowed")]
no = [l for l in lines if l.get("host") == "denied.test" and not l.get("allowed")]
print(f"{len(ok)},{len(no)}")')"
echo "RESULT end_records=$(cat "$logs"/sessions-*.jsonl | grep -c '"kind":"end"' || true)"
SESSION

setpriv --reuid="$uid" --regid="$gid" --init-groups \
    env -i HOME="$R/home" XDG_RUNTIME_DIR="$R/xdg" PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    CONTAINERS_CONF="$R/containers.conf" AIRLOCK_TEST_RESOLVER="$R/resolver" R="$R" PORT="$PORT" \
    bash "$R/session.sh"
result user "$uid:$gid"
