#!/usr/bin/env bash
# probe.sh AIRLOCKD_PATH — re-measures the network facts the container backend
# relies on. Run inside sealed.sh:
#   tests/containers/sealed.sh /tmp/airlock-ct podman -- tests/containers/probe.sh target/debug/airlockd
#   tests/containers/sealed.sh /tmp/airlock-ctd docker -- tests/containers/probe.sh target/debug/airlockd
# Prints each command and what it observed; exits 1 if an isolation
# expectation fails (sandbox reaches the engine host / proxy unreachable /
# sandbox can change routes).
set -euo pipefail
[ "${AIRLOCK_TEST_SEALED:-}" = 1 ] || { echo "probe.sh: run inside sealed.sh" >&2; exit 2; }
[ $# -eq 1 ] || { echo "usage: probe.sh AIRLOCKD_PATH" >&2; exit 2; }
E=$SEALED_ENGINE
W=$SEALED_WORKDIR
here=$(dirname "$(realpath "$0")")
fail=0
say() { printf '\n$ %s\n' "$*"; }
expect() { # WHAT GOT WANT
    if [ "$2" = "$3" ]; then echo "ok: $1 = $2"; else echo "FAIL: $1 = $2 (want $3)"; fail=1; fi
}

"$here/images.sh" "$E" "$1" "$W"

NET=airlock-net-t1 UP=airlock-up-t1
"$E" rm -f p1 >/dev/null 2>&1 || true
"$E" network rm "$NET" "$UP" >/dev/null 2>&1 || true

if [ "$E" = podman ]; then
    say podman network create --internal --disable-dns --subnet 10.89.5.0/24 $NET
    podman network create --internal --disable-dns --subnet 10.89.5.0/24 $NET
    podman network create --disable-dns --subnet 10.89.6.0/24 $UP >/dev/null
    say podman network inspect $NET
    podman network inspect --format '{{.NetworkInterface}} internal={{.Internal}} subnets={{.Subnets}}' $NET
    say podman run -d --rm --name p1 --network $NET:ip=10.89.5.2 --network $UP --sysctl net.ipv4.ip_forward=0 ...
    podman run -d --rm --name p1 --network "$NET:ip=10.89.5.2" --network "$UP" \
        --sysctl net.ipv4.ip_forward=0 airlock/base:latest python3 -m http.server 8888 --bind 0.0.0.0
    SBX=(podman run --rm --network "$NET" --dns none)
else
    # inhibit_ipv4: without it the bridge has 10.89.5.1 and the sandbox can
    # reach whatever listens on the engine host's addresses (see README).
    say docker network create --internal -o com.docker.network.bridge.inhibit_ipv4=true --subnet 10.89.5.0/24 $NET
    docker network create --internal -o com.docker.network.bridge.inhibit_ipv4=true \
        --subnet 10.89.5.0/24 $NET
    docker network create --subnet 10.89.6.0/24 $UP >/dev/null
    say docker network inspect $NET
    docker network inspect --format '{{json .IPAM.Config}} internal={{.Internal}} opts={{json .Options}}' $NET
    say "docker run -d --rm --name p1 --network $NET --ip 10.89.5.2 ... ; docker network connect $UP p1"
    docker run -d --rm --name p1 --network "$NET" --ip 10.89.5.2 \
        --sysctl net.ipv4.ip_forward=0 airlock/base:latest python3 -m http.server 8888 --bind 0.0.0.0
    docker network connect "$UP" p1
    SBX=(docker run --rm --network "$NET")
fi
say ip -o -4 addr "(engine netns)"
ip -o -4 addr | awk '{print $2, $4}'
say "$E exec p1 ip -o -4 addr; ip route"
"$E" exec p1 sh -c 'ip -o -4 addr | awk "{print \$2, \$4}"; ip route'

# a service on the engine host side, on every address
python3 -m http.server 9999 --bind 0.0.0.0 >/dev/null 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
sleep 1

SBX+=(--add-host airlock-proxy:10.89.5.2 --sysctl net.ipv6.conf.all.disable_ipv6=1 --cap-drop ALL airlock/base:latest)
say "${SBX[*]} sh -c ..."
out=$("${SBX[@]}" sh -c '
echo "resolv.conf: $(cat /etc/resolv.conf 2>&1 | tr "\n" ";")"
echo "hosts: $(tr "\n" ";" </etc/hosts)"
echo "addrs: $(ip -o addr | awk "{print \$2, \$4}" | tr "\n" ";")"
echo "routes: $(ip route | tr "\n" ";")"
python3 - <<P
import socket
for name, host, port in [("proxy", "airlock-proxy", 8888), ("up_gateway", "10.89.6.1", 9999),
                         ("own_gateway", "10.89.5.1", 9999)]:
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, port)); r = "OK"
    except Exception as e:
        r = "FAIL(%s)" % type(e).__name__
    s.close()
    print("connect_%s=%s" % (name, "OK" if r == "OK" else "no"), r)
P
ip route add 10.0.0.0/8 dev eth0 2>/dev/null && echo "route_add=yes" || echo "route_add=no"
')
echo "$out"
expect "sandbox -> proxy 10.89.5.2:8888" "$(echo "$out" | grep -o 'connect_proxy=[a-zA-Z]*' | cut -d= -f2)" OK
expect "sandbox -> 10.89.6.1:9999 (engine host)" "$(echo "$out" | grep -o 'connect_up_gateway=[a-zA-Z]*' | cut -d= -f2)" no
expect "sandbox -> 10.89.5.1:9999" "$(echo "$out" | grep -o 'connect_own_gateway=[a-zA-Z]*' | cut -d= -f2)" no
expect "sandbox ip route add" "$(echo "$out" | grep -o 'route_add=[a-z]*' | cut -d= -f2)" no

if [ "$E" = podman ]; then
    say podman run --rm --userns=keep-id airlock/base:latest id
    podman run --rm --userns=keep-id airlock/base:latest id 2>&1 || true
fi
say "$E run --rm --user 1000:1000 airlock/base:latest id"
"$E" run --rm --user 1000:1000 airlock/base:latest sh -c 'id; echo HOME=$HOME'

say "5 x ${SBX[*]} true"
for i in 1 2 3 4 5; do
    s=$(date +%s%N)
    "${SBX[@]}" true
    echo "run $i: $(( ($(date +%s%N) - s) / 1000000 )) ms"
done

"$E" rm -f p1 >/dev/null 2>&1 || true
"$E" network rm "$NET" "$UP" >/dev/null 2>&1 || true
exit $fail
