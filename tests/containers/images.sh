#!/usr/bin/env bash
# images.sh ENGINE AIRLOCKD_PATH WORKDIR
#
# Builds the two images the container backend needs WITHOUT a registry, from
# files already on this host, and imports them into ENGINE (podman|docker):
#
#   airlock/proxy:latest  airlockd + the shared libraries ldd lists, CA bundle,
#                         minimal /etc/passwd,/etc/group (root, nobody), /tmp.
#                         ENTRYPOINT ["airlockd","proxy"] (same as
#                         contrib/docker/Dockerfile.proxy).
#   airlock/base:latest   the tools the tests' agent commands use (sh=dash, bash,
#                         coreutils subset incl. timeout, grep, sed, hostname,
#                         git (+ /usr/lib/git-core), curl, python3 with its
#                         stdlib, ip, getent) + their ldd libraries; CMD bash.
#                         No HOME in the image: podman/docker derive it from
#                         /etc/passwd (root -> /root, unknown uid -> /), so
#                         `--user 1000:1000` does not get an unwritable /root.
#
# Must run inside tests/containers/sealed.sh (checks AIRLOCK_TEST_SEALED=1).
# Each rootfs is packed into a reproducible tar (sorted, mtime 0, uid/gid 0);
# its sha256 is stored as image label org.airlock.content-sha256. A rerun whose
# tar hashes the same skips the import (import is the slow part).
#
# Names: podman stores `airlock/base:latest` as `localhost/airlock/base:latest`
# and resolves the short name `airlock/base` to it for local images. docker
# stores `docker.io/airlock/base:latest`; we also tag `localhost/airlock/...`
# there so both spellings work with both engines.
set -euo pipefail

die() { echo "images.sh: error: $*" >&2; exit 1; }
log() { echo "images.sh: $*" >&2; }

[ $# -eq 3 ] || { echo "usage: images.sh ENGINE AIRLOCKD_PATH WORKDIR" >&2; exit 2; }
ENGINE=$1
AIRLOCKD=$2
WORKDIR=$3
case $ENGINE in podman|docker) ;; *) die "ENGINE must be podman or docker, got '$ENGINE'" ;; esac
[ "${AIRLOCK_TEST_SEALED:-}" = 1 ] || die "run me inside tests/containers/sealed.sh (AIRLOCK_TEST_SEALED!=1)"
[ -x "$AIRLOCKD" ] || die "airlockd not found or not executable: $AIRLOCKD"
command -v ldd >/dev/null || die "ldd not found"
command -v "$ENGINE" >/dev/null || die "$ENGINE not found"
mkdir -p "$WORKDIR/images"
WORKDIR=$(realpath "$WORKDIR")
AIRLOCKD=$(realpath "$AIRLOCKD")
LABEL=org.airlock.content-sha256

R= # rootfs being built; copy_path/add_bin copy into it

# copy_path P: replicate host path P into $R, keeping symlinks as symlinks
# (and following them so their targets exist too). Parents are replicated the
# same way, so Debian's merged-/usr links (/lib -> usr/lib, /bin -> usr/bin)
# appear in the image exactly as on the host and ldd's paths stay valid.
copy_path() {
    local p=$1 parent t next
    [ -e "$R$p" ] || [ -L "$R$p" ] && return 0
    [ -e "$p" ] || [ -L "$p" ] || die "missing on host: $p"
    parent=$(dirname "$p")
    [ "$parent" = / ] || copy_path "$parent"
    if [ -L "$p" ]; then
        t=$(readlink "$p")
        ln -s "$t" "$R$p"
        case $t in
            /*) next=$t ;;
            # resolve the link's directory physically so "../" is right
            *) next=$(realpath -m "$(realpath "$parent")/$(dirname "$t")")/$(basename "$t") ;;
        esac
        copy_path "$next"
    elif [ -d "$p" ]; then
        mkdir "$R$p"
        chmod --reference="$p" "$R$p"
    else
        cp -a "$p" "$R$p"
    fi
}

# copy_tree DIR [tar --exclude args...]: copy a whole directory (hardlinks kept,
# which matters for git-core where ~140 entries are the same binary).
copy_tree() {
    local d=$1; shift
    copy_path "$(dirname "$d")"
    tar -C / -cf - "$@" "${d#/}" | tar -C "$R" -xf -
}

# add_libs FILE...: the shared libraries ldd lists for each ELF file (+ the
# dynamic loader). Non-ELF files (scripts) are skipped.
add_libs() {
    local f lib
    for f in "$@"; do
        head -c 4 "$f" 2>/dev/null | grep -q 'ELF' || continue
        # "libx.so => /path (0x..)" and "/lib64/ld-linux-x86-64.so.2 (0x..)"
        for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
            copy_path "$lib"
        done
    done
}

add_bin() {
    local b
    for b in "$@"; do
        copy_path "$b"
        add_libs "$(realpath "$b")"
    done
}

new_root() {
    R=$WORKDIR/images/$1.rootfs
    rm -rf "$R"
    mkdir -p "$R"
    mkdir -p "$R/proc" "$R/sys" "$R/dev" "$R/etc" "$R/root" "$R/home"
    install -d -m 1777 "$R/tmp"
    install -d -m 1777 "$R/var/tmp"
    chmod 0700 "$R/root"
}

write_users() {
    cat >"$R/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
    cat >"$R/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
}

add_certs() {
    # Debian's CA bundle + the OpenSSL default-path links (/usr/lib/ssl/*).
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        copy_path /etc/ssl/certs/ca-certificates.crt
        [ -e /usr/lib/ssl/cert.pem ] && copy_path /usr/lib/ssl/cert.pem
        [ -e /usr/lib/ssl/certs ] && copy_path /usr/lib/ssl/certs
        [ -e /etc/ssl/openssl.cnf ] && copy_path /usr/lib/ssl/openssl.cnf
    fi
    return 0
}

build_proxy() {
    new_root proxy
    copy_path /usr/local/bin 2>/dev/null || mkdir -p "$R/usr/local/bin"
    cp "$AIRLOCKD" "$R/usr/local/bin/airlockd"
    chmod 0755 "$R/usr/local/bin/airlockd"
    add_libs "$AIRLOCKD"
    write_users
    add_certs
}

build_base() {
    new_root base
    # /bin/sh is dash on Debian; env is needed for "#!/usr/bin/env" scripts.
    add_bin /bin/sh /usr/bin/dash /usr/bin/bash \
        /usr/bin/cat /usr/bin/ls /usr/bin/id /usr/bin/env /usr/bin/echo \
        /usr/bin/true /usr/bin/false /usr/bin/sleep /usr/bin/mkdir /usr/bin/rm \
        /usr/bin/touch /usr/bin/grep /usr/bin/head /usr/bin/tail /usr/bin/wc \
        /usr/bin/hostname /usr/bin/getent /usr/bin/curl /usr/bin/git \
        /usr/bin/python3 /usr/sbin/ip \
        /usr/bin/timeout /usr/bin/cp /usr/bin/mv /usr/bin/chmod /usr/bin/sed \
        /usr/bin/cut /usr/bin/tr /usr/bin/sort /usr/bin/uname /usr/bin/pwd \
        /usr/bin/dirname /usr/bin/basename /usr/bin/stat /usr/bin/awk
    [ -e /bin/bash ] && copy_path /bin/bash
    # git runs helpers (git-remote-http, ...) from its exec path, and wants
    # templates for `git init`.
    copy_tree /usr/lib/git-core
    add_libs "$R"/usr/lib/git-core/*
    [ -d /usr/share/git-core/templates ] && copy_tree /usr/share/git-core/templates
    # python3 stdlib minus the big parts nobody runs in a sandbox test.
    local py=/usr/lib/python3.11
    [ -d "$py" ] || py=$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
    copy_tree "$py" --exclude="${py#/}/test" --exclude="${py#/}/idlelib" \
        --exclude="${py#/}/tkinter" --exclude="${py#/}/turtledemo" \
        --exclude="${py#/}/ensurepip" --exclude="${py#/}/lib2to3/tests"
    add_libs "$R$py"/lib-dynload/*.so
    [ -d /etc/iproute2 ] && copy_tree /etc/iproute2
    write_users
    cp /etc/nsswitch.conf "$R/etc/nsswitch.conf" 2>/dev/null ||
        printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$R/etc/nsswitch.conf"
    add_certs
}

# pack NAME -> prints the tar's sha256. Reproducible: same files, same hash.
pack() {
    local name=$1 tar=$WORKDIR/images/$1.tar
    tar -C "$WORKDIR/images/$name.rootfs" --sort=name --mtime=@0 --owner=0 --group=0 \
        --numeric-owner --format=gnu -cf "$tar" .
    sha256sum "$tar" | cut -d' ' -f1
}

current_label() {
    local img=$1
    if [ "$ENGINE" = podman ]; then
        podman image inspect --format "{{ index .Labels \"$LABEL\" }}" "$img" 2>/dev/null || true
    else
        docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$img" 2>/dev/null || true
    fi
}

# import NAME SHA CHANGE... : import WORKDIR/images/NAME.tar as airlock/NAME:latest
import_image() {
    local name=$1 sha=$2; shift 2
    local ref=airlock/$name:latest have start end
    have=$(current_label "$ref")
    if [ "$have" = "$sha" ]; then
        log "$ref up to date (sha256 $sha), import skipped"
    else
        local args=(--change "LABEL $LABEL=$sha")
        local c
        for c in "$@"; do args+=(--change "$c"); done
        start=$(date +%s.%N)
        if [ "$ENGINE" = podman ]; then
            podman import -q "${args[@]}" "$WORKDIR/images/$name.tar" "$ref" >/dev/null
        else
            docker import "${args[@]}" "$WORKDIR/images/$name.tar" "$ref" >/dev/null
        fi
        end=$(date +%s.%N)
        log "$ref imported in $(echo "$end - $start" | bc 2>/dev/null || echo "$start..$end") s" \
            "($(du -h "$WORKDIR/images/$name.tar" | cut -f1) tar, sha256 $sha)"
    fi
    # both spellings must resolve, whatever the engine
    if [ "$ENGINE" = podman ]; then
        podman image exists "localhost/$ref" || podman tag "$ref" "localhost/$ref"
        podman image exists "$ref" || die "podman does not resolve $ref after import"
    else
        docker tag "$ref" "localhost/$ref"
    fi
}

PATH_ENV="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Fast pre-check: the tar hash is exact but needs the rootfs rebuilt (~6 s
# with python's stdlib). A stamp WORKDIR/images/NAME.stamp holds
# "INPUT_KEY TAR_SHA"; if the inputs key still matches and the engine's image
# carries TAR_SHA as its label, nothing is rebuilt or imported.
#   proxy inputs: this script + sha256 of airlockd + its ldd output
#   base inputs:  this script + the dpkg database (any package change) + /etc
#                 files copied
self_sha=$(sha256sum "$0" | cut -d' ' -f1)
proxy_key=$( { echo "$self_sha"; sha256sum <"$AIRLOCKD"; ldd "$AIRLOCKD" 2>&1 | sed 's/ (0x.*//'; } | sha256sum | cut -d' ' -f1)
base_key=$( { echo "$self_sha"; stat -c '%Y %s' /var/lib/dpkg/status;
    cat /etc/nsswitch.conf /etc/ssl/certs/ca-certificates.crt 2>/dev/null; } | sha256sum | cut -d' ' -f1)

up_to_date() { # NAME KEY
    local stamp=$WORKDIR/images/$1.stamp key sha
    [ -f "$stamp" ] || return 1
    read -r key sha <"$stamp" || return 1
    [ "$key" = "$2" ] && [ -n "$sha" ] && [ "$(current_label "airlock/$1:latest")" = "$sha" ]
}

t0=$(date +%s.%N)
for name in proxy base; do
    key_var=${name}_key
    if up_to_date "$name" "${!key_var}"; then
        log "airlock/$name:latest up to date (inputs key ${!key_var}), nothing to do"
        continue
    fi
    "build_$name"
    sha=$(pack "$name")
    if [ "$name" = proxy ]; then
        import_image proxy "$sha" "ENV $PATH_ENV" 'ENTRYPOINT ["airlockd","proxy"]'
    else
        import_image base "$sha" "ENV $PATH_ENV" 'CMD ["/bin/bash"]'
    fi
    echo "${!key_var} $sha" >"$WORKDIR/images/$name.stamp"
    # the replaced image is now dangling in our private store; drop it
    "$ENGINE" image prune -f >/dev/null 2>&1 || true
    # the tree and tar are only needed to import; keep WORKDIR small
    rm -rf "$WORKDIR/images/$name.rootfs" "$WORKDIR/images/$name.tar"
done
# podman normalises; make sure both spellings resolve even on the skip path
for name in proxy base; do
    if [ "$ENGINE" = podman ]; then
        podman image exists "localhost/airlock/$name:latest" ||
            podman tag "airlock/$name:latest" "localhost/airlock/$name:latest"
    else
        docker tag "airlock/$name:latest" "localhost/airlock/$name:latest"
    fi
done
log "images ready in $(echo "$(date +%s.%N) - $t0" | bc) s"
