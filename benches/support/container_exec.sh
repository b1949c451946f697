#!/usr/bin/env bash
# container_exec.sh AIRLOCK AIRLOCKD — issue 21's benchmark, run INSIDE tests/containers/sealed.sh:
#
#   tests/containers/sealed.sh /tmp/airlock-bench podman -- \
#       benches/support/container_exec.sh target/release/airlock target/release/airlockd
#
# (or `cargo bench --bench container_exec`, which does exactly that). Target:
# `airlock exec --backend podman -- true` ≤ 1.3× a same-run PAIR of `podman run`s doing the same
# work by hand: a proxy container (`airlockd proxy --layers ...` from airlock/proxy, on the repo's
# internal network + the `podman` uplink, `--sysctl net.ipv4.ip_forward=0`, waited for through
# its ready file as the CLI does), then the sandbox container (`podman run --rm` with
# src/container/plan.rs's sandbox_run flags and the same binds a real session makes) running
# `true`, then `podman stop -t 7` of the proxy. Rows, interleaved in rotating order per round:
#   a  airlock exec --quiet --backend podman -- true     (in a git repo; warm engine state)
#   b  the hand-made pair above                          (same images, same networks)
#   c  podman run --rm --network none airlock/base:latest true   (one bare container, reference)
# Prints per-round wall times (ms), the median of each row and the median of per-round a/b.
# Then BENCH_TRACE_RUNS (default 5) extra `airlock exec` runs with each engine command timed
# (a logging wrapper named by AIRLOCK_PODMAN; it adds one bash process per command) to show
# where the session's time goes.
#
# Knobs: BENCH_ROUNDS (default 20), BENCH_TRACE_RUNS (default 5).
# Network safety: everything runs in sealed.sh's namespace (no uplink); the proxy listens on the
# internal network and nothing connects out.
set -euo pipefail
[ "${AIRLOCK_TEST_SEALED:-}" = 1 ] || { echo "container_exec.sh: run inside sealed.sh" >&2; exit 2; }
[ $# -eq 2 ] || { echo "usage: container_exec.sh AIRLOCK AIRLOCKD" >&2; exit 2; }
[ "$SEALED_ENGINE" = podman ] || { echo "container_exec.sh: podman only" >&2; exit 2; }
AIRLOCK=$(realpath "$1") AIRLOCKD=$(realpath "$2")
W=$SEALED_WORKDIR
here=$(dirname "$(realpath "$0")")
ROUNDS=${BENCH_ROUNDS:-20}
TRACE_RUNS=${BENCH_TRACE_RUNS:-5}

"$here/../../tests/containers/images.sh" podman "$AIRLOCKD" "$W" >&2
podman network inspect podman >/dev/null

S=$(mktemp -d "$W/bench.XXXXXX")
trap 'rm -rf "$S"' EXIT
export HOME="$S/home"
mkdir -p "$HOME/.airlock" "$S/app"
cat > "$HOME/.airlock/config.toml" <<'TOML'
[network]
allow = ["example.test", "=github.com", "*.githubusercontent.com"]
TOML
git -C "$S/app" init -q
APP=$(realpath "$S/app")
# The pair's own checkout (the session makes placeholders for absent protected paths and removes
# them at its end; the pair's binds need them to exist, so it gets a copy made once, below).
mkdir -p "$S/pair-app"
git -C "$S/pair-app" init -q
PAIR_APP=$(realpath "$S/pair-app")

# A logging engine wrapper (breakdown runs and the one capture run below only).
cat > "$S/podman-trace" <<'SH'
#!/usr/bin/env bash
t0=$EPOCHREALTIME
if [ -n "${PODMAN_TRACE_TYPES:-}" ] && [ "$1 $2 $3" = "run --rm -i" ]; then
    # capture run only: the kind of each bind source of the sandbox (placeholders included)
    for a in "$@"; do
        case $a in type=bind,source=*)
            src=${a#type=bind,source=}; src=${src%%,target=*}
            printf '%s %s\n' "$(stat -c %F "$src" | cut -c1)" "$a" >> "$PODMAN_TRACE_TYPES" ;;
        esac
    done
fi
/usr/bin/podman "$@"
rc=$?
printf '%s %s %s %s\n' "$t0" "$EPOCHREALTIME" "$rc" "$*" >> "$PODMAN_TRACE_LOG"
exit $rc
SH
chmod +x "$S/podman-trace"

# Warm-up + capture: one session through the wrapper (makes the repo's network; shows the exact
# engine command lines, which the hand-made pair below mirrors).
cd "$APP"
PODMAN_TRACE_LOG=$S/capture.log PODMAN_TRACE_TYPES=$S/capture.types AIRLOCK_PODMAN=$S/podman-trace \
    "$AIRLOCK" exec --quiet --backend podman -- true
echo "== engine commands of one \`airlock exec --backend podman -- true\` (captured):"
cut -d' ' -f4- "$S/capture.log" | sed 's/^/   podman /'
key8=$(printf '%s' "$APP" | sha256sum | cut -c1-8)
NET=airlock-net-$key8
podman network inspect "$NET" >/dev/null
SUBNET=$(podman network inspect --format '{{range .Subnets}}{{.Subnet}}{{end}}' "$NET")
echo "== repo network $NET ($SUBNET), uplink podman"
# The sandbox's binds as the real session made them (the repo, pinned git dirs, protected paths
# of a fresh `git init` repo read-only), taken from the captured command and pointed at the
# pair's checkout, where the same placeholders (same kinds) are made once.
SANDBOX_BINDS=()
while read -r kind bind; do
    bind=${bind//$APP/$PAIR_APP}
    src=${bind#type=bind,source=}; src=${src%%,target=*}
    if [ ! -e "$src" ]; then
        if [ "$kind" = d ]; then mkdir -p "$src"; else mkdir -p "$(dirname "$src")"; : > "$src"; fi
    fi
    SANDBOX_BINDS+=("$bind")
done < "$S/capture.types"
echo "== sandbox binds (${#SANDBOX_BINDS[@]}, pointed at the pair's checkout $PAIR_APP):"
printf '   %s\n' "${SANDBOX_BINDS[@]}"

# The pair's layers file, written by hand (the shape of src/config/layers_file.rs): the user
# layer only, as the session above sends it.
digest=$(sha256sum < "$HOME/.airlock/config.toml" | cut -d' ' -f1)
cat > "$S/layers.json" <<JSON
{
  "version": 1,
  "managed": null,
  "user": {
    "kind": "user",
    "name": "~/.airlock/config.toml",
    "digest": "$digest",
    "network": {"mode": null, "allow": ["example.test", "=github.com", "*.githubusercontent.com"],
                "block": [], "allow_private": []},
    "env_pass": [], "mcp": {}, "review_servers": [], "terminal": {"clipboard": null}
  },
  "repo": null,
  "review_servers": []
}
JSON
# airlockd must accept it (the same check the proxy container makes at start).
mkdir -p "$S/check-logs"
"$AIRLOCKD" proxy --layers "$S/layers.json" --listen 127.0.0.1:0 --repo-name app \
    --log-dir "$S/check-logs" --session check --ready-file "$S/check-ready" &
chk=$!
for _ in $(seq 1 100); do [ -e "$S/check-ready" ] && break; sleep 0.05; done
[ -e "$S/check-ready" ] || { echo "airlockd proxy did not accept $S/layers.json" >&2; exit 1; }
kill "$chk"; wait "$chk" 2>/dev/null || true
echo "== hand-written layers file accepted by airlockd proxy"
# The session's environment file has a few dozen lines; the pair's has the proxy variables.
printf 'HTTP_PROXY=http://airlock-proxy:8888\nHTTPS_PROXY=http://airlock-proxy:8888\nhttp_proxy=http://airlock-proxy:8888\nhttps_proxy=http://airlock-proxy:8888\nHOME=/home/agent\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n' \
    > "$S/env"
chmod 600 "$S/env"
mkdir -p "$S/pair-logs"

export AIRLOCK APP NET SUBNET ROUNDS TRACE_RUNS S
printf '%s\n' "${SANDBOX_BINDS[@]}" > "$S/binds"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - <<'PY'
import ipaddress, os, shutil, statistics, subprocess, sys, time

AIRLOCK, APP, NET, S = (os.environ[k] for k in ("AIRLOCK", "APP", "NET", "S"))
ROUNDS, TRACE_RUNS = int(os.environ["ROUNDS"]), int(os.environ["TRACE_RUNS"])
BINDS = [b for b in open(f"{S}/binds").read().split("\n") if b]
hosts = list(ipaddress.ip_network(os.environ["SUBNET"]).hosts())
ip_pool = [str(h) for h in hosts[100:200]]  # the network's own allocations start at .2
PODMAN = "/usr/bin/podman"
quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run(args, **kw):
    r = subprocess.run(args, **{**quiet, **kw})
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(args)}\n{r.stderr.decode(errors='replace')}")
    return r


pair_steps = []


def row_a(i):
    run([AIRLOCK, "exec", "--quiet", "--backend", "podman", "--", "true"], cwd=APP)


def row_b(i):
    # The same steps as src/container/session.rs, by hand: run dir with the layers and env
    # files, proxy container, ready file, sandbox container, stop.
    steps, t = [], time.monotonic()

    def step(name):
        nonlocal t
        now = time.monotonic()
        steps.append((name, (now - t) * 1000))
        t = now

    run_dir = f"{S}/pair-run-{i}"
    os.mkdir(run_dir, 0o700)
    shutil.copyfile(f"{S}/layers.json", f"{run_dir}/layers.json")
    proxy, ip = f"bench-proxy-{i}", ip_pool[i % len(ip_pool)]
    run([PODMAN, "run", "-d", "--rm", "--name", proxy, "--label", f"airlock.session=bench{i}",
         "--network", f"{NET}:ip={ip}", "--network", "podman",
         "--sysctl", "net.ipv4.ip_forward=0", "--cap-drop", "ALL",
         "--security-opt", "no-new-privileges", "--user", "0:0",
         "--mount", f"type=bind,source={run_dir},target=/airlock/run",
         "--mount", f"type=bind,source={S}/pair-logs,target=/airlock/logs",
         "--pull=never", "--entrypoint", "/usr/local/bin/airlockd", "airlock/proxy:latest",
         "proxy", "--repo-name", "app", "--listen", "0.0.0.0:8888",
         "--layers", "/airlock/run/layers.json", "--log-dir", "/airlock/logs",
         "--session", f"bench{i}", "--ready-file", "/airlock/run/ready"])
    step("run dir + run -d (proxy)")
    start, pause = time.monotonic(), 0.002
    while not os.path.exists(f"{run_dir}/ready"):
        if time.monotonic() - start > 20:
            sys.exit(f"{proxy} did not become ready")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    step("ready-file wait")
    args = [PODMAN, "run", "--rm", "-i", "--init", "--name", f"bench-sandbox-{i}", "--network", NET,
            "--dns", "none", "--add-host", f"airlock-proxy:{ip}",
            "--sysctl", "net.ipv6.conf.all.disable_ipv6=1", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--user", "0:0", "--hostname", "app",
            "--workdir", "/app/"]
    for b in BINDS:
        args += ["--mount", b]
    args += ["--tmpfs", "/home/agent:rw,nosuid,nodev,size=1g,mode=0700,U",
             "--env-file", f"{S}/env", "--pull=never", "airlock/base:latest", "true"]
    run(args)
    step("run --rm -i (sandbox)")
    run([PODMAN, "stop", "-t", "7", proxy])
    step("stop -t 7 (proxy)")
    shutil.rmtree(run_dir)
    pair_steps.append(steps)


def row_c(i):
    run([PODMAN, "run", "--rm", "--network", "none", "airlock/base:latest", "true"])


rows = [("a", row_a), ("b", row_b), ("c", row_c)]
ms = {k: [] for k, _ in rows}
print(f"== {ROUNDS} rounds, rotating order; wall ms per row")
print("round  order   a(airlock)  b(pair)   c(bare)   a/b")
for r in range(ROUNDS):
    order = rows[r % 3:] + rows[:r % 3]
    for k, f in order:
        t = time.monotonic()
        f(r)
        ms[k].append((time.monotonic() - t) * 1000)
    print(f"{r:5}  {''.join(k for k, _ in order)}  {ms['a'][-1]:10.1f} {ms['b'][-1]:9.1f} "
          f"{ms['c'][-1]:9.1f}  {ms['a'][-1] / ms['b'][-1]:.3f}", flush=True)
ratios = [a / b for a, b in zip(ms["a"], ms["b"])]
med = {k: statistics.median(v) for k, v in ms.items()}
print("== medians (ms): a airlock exec %.1f | b proxy+sandbox pair %.1f | c bare run %.1f"
      % (med["a"], med["b"], med["c"]))
print("== min (ms):     a %.1f | b %.1f | c %.1f" % tuple(min(ms[k]) for k in "abc"))
print("== median of per-round a/b: %.3f (target <= 1.3); a/b of medians %.3f; "
      "b/c of medians %.2f" % (statistics.median(ratios), med["a"] / med["b"],
                               med["b"] / med["c"]))
print("== the pair's steps (median ms over the rounds): " + "; ".join(
    f"{name} {statistics.median(r[k][1] for r in pair_steps):.1f}"
    for k, (name, _) in enumerate(pair_steps[0])))
print(f"== load after rounds: {' '.join(open('/proc/loadavg').read().split()[:3])}")

# Breakdown: each engine command of TRACE_RUNS sessions, timed by the wrapper.
if TRACE_RUNS:
    per = {}
    totals, engine_sums = [], []
    for n in range(TRACE_RUNS):
        log = f"{S}/trace-{n}.log"
        env = {**os.environ, "AIRLOCK_PODMAN": f"{S}/podman-trace", "PODMAN_TRACE_LOG": log}
        t = time.time()
        run([AIRLOCK, "exec", "--quiet", "--backend", "podman", "--", "true"], cwd=APP, env=env)
        t_end = time.time()
        totals.append((t_end - t) * 1000)
        lines = [l.split(" ", 3) for l in open(log).read().splitlines()]
        s = 0.0
        prev_end = t
        for idx, (t0, t1, rc, cmd) in enumerate(lines):
            words = cmd.split()
            label = " ".join(words[:2]) if words[0] in ("image", "network") else words[0]
            label = {"run": "run -d (proxy)" if words[1] == "-d" else "run --rm -i (sandbox)",
                     "inspect": "inspect (proxy IP)", "stop": "stop -t 7 (proxy)"}.get(label, label)
            key = f"{idx}: {label}"
            d = (float(t1) - float(t0)) * 1000
            gap = (float(t0) - prev_end) * 1000
            per.setdefault(key, []).append((d, gap))
            s += d
            prev_end = float(t1)
        per.setdefault("after last command (sweep, cleanup, exit)", []).append(
            (0.0, (t_end - prev_end) * 1000))
        engine_sums.append(s)
    print(f"== breakdown over {TRACE_RUNS} traced sessions (median ms; 'gap' = airlock's own "
          "time before the command: its setup, the ready-file wait, the wrapper's start)")
    for key, v in per.items():
        print(f"   {key:45} cmd {statistics.median(d for d, _ in v):7.1f}   "
              f"gap before {statistics.median(g for _, g in v):6.1f}")
    print(f"   traced session total {statistics.median(totals):.1f} ms, of it engine commands "
          f"{statistics.median(engine_sums):.1f} ms")
PY
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== containers left: $(podman ps -aq | wc -l)"
