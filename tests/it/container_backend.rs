//! The container backend (`airlock exec --backend podman`, docs/backends.md) against a real
//! Podman, and `airlockd proxy --layers FILE` (what its proxy container runs) on its own.
//!
//! Network safety: the engine runs only inside a network namespace the test made, with `lo`
//! alone and no uplink (`tests/containers/sealed.sh` refuses to run the engine otherwise); the
//! upstream server listens in that namespace and names resolve only through the test resolver.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{World, bin, in_ci};

/// `tests/containers/<name>`.
fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/containers").join(name)
}

/// Root with podman, runc and unshare: what the sealed engine needs. Missing in CI fails.
fn engine_ready(engine: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    let missing = missing_tools(&[engine, "runc", "unshare", "ip", "python3"]);
    if root && missing.is_empty() {
        return true;
    }
    // The sealed engine needs root (a network namespace and tmpfs mounts around the engine);
    // .ci/run runs this suite as root and .ci/prereqs installs the engines.
    assert!(
        !in_ci() || !root,
        "CI needs {missing:?} for the container backend suite (.ci/prereqs installs them)"
    );
    eprintln!("SKIP: container backend suite needs root and {missing:?}");
    false
}

/// Those of `tools` in none of the system binary directories.
fn missing_tools<'a>(tools: &[&'a str]) -> Vec<&'a str> {
    tools
        .iter()
        .copied()
        .filter(|t| {
            !["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
                .iter()
                .any(|d| Path::new(d).join(t).exists())
        })
        .collect()
}

/// Runs the exec scenario under `sealed.sh` and returns its `RESULT` lines.
fn scenario(engine: &str) -> (HashMap<String, String>, String) {
    sealed_scenario(engine, "exec-scenario.sh")
}

/// Runs `tests/containers/<name> AIRLOCK AIRLOCKD` under `sealed.sh` with `engine`; returns its
/// `RESULT` lines and everything it printed (for messages).
fn sealed_scenario(engine: &str, name: &str) -> (HashMap<String, String>, String) {
    let world = World::new();
    let work = world.tmp.path().join("engine");
    let out = Command::new(script("sealed.sh"))
        .arg(&work)
        .arg(engine)
        .arg("--")
        .arg(script(name))
        .arg(bin("airlock"))
        .arg(bin("airlockd"))
        .env_remove("AIRLOCK_TEST_RESOLVER")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = format!("{stdout}\n--- stderr ---\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the scenario failed ({}):\n{all}", out.status);
    let results = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    (results, all)
}

#[test]
fn a_podman_session_reaches_only_its_proxy_and_the_walls_hold() {
    if engine_ready("podman") {
        judge("podman");
    }
}

#[test]
fn a_docker_session_reaches_only_its_proxy_and_the_walls_hold() {
    if engine_ready("dockerd") && engine_ready("docker") {
        judge("docker");
    }
}

/// One session's results against the walls both engines must keep.
fn judge(engine: &str) {
    let (r, all) = scenario(engine);
    let get = |k: &str| r.get(k).map(String::as_str).unwrap_or_else(|| panic!("no {k}:\n{all}"));
    // The page's contract inside.
    assert_eq!(get("inside_pwd"), "/app", "{all}");
    assert_eq!(get("inside_hostname"), "app", "{all}");
    assert_eq!(get("inside_home"), "/home/agent", "{all}");
    assert_eq!(get("inside_proxy"), "http://airlock-proxy:8888", "{all}");
    assert_eq!(get("exit_code"), "7", "the command's own status: {all}");
    // The allowlist, evaluated by the proxy container from the layers file.
    assert_eq!(get("fetch_allowed"), "upstream-ok", "{all}");
    assert_eq!(get("fetch_denied"), "403", "{all}");
    assert_eq!(get("fetch_managed_block"), "403", "the managed layer binds the proxy: {all}");
    // Every way around the proxy fails.
    assert_ne!(get("direct_gateway"), "connected", "direct TCP to the host side: {all}");
    assert_ne!(get("proxy_other_port"), "connected", "the proxy container's other ports: {all}");
    assert_ne!(get("internal_first"), "connected", "the internal network's first address: {all}");
    assert_ne!(get("dns_udp"), "answered", "DNS to the host side: {all}");
    // No resolver inside: Podman writes none; Docker always points at its embedded resolver
    // (127.0.0.11), which is given a loopback upstream and forwards nothing (checked below).
    let resolver = if engine == "podman" { "absent" } else { "127.0.0.11" };
    assert_eq!(get("resolv_conf"), resolver, "no resolver inside: {all}");
    assert_ne!(get("name_lookup"), "resolved", "names resolve only at the proxy: {all}");
    assert_eq!(get("dns_queries_seen"), "0", "no query reached a resolver outside: {all}");
    assert_eq!(get("ipv6_addresses"), "0", "no IPv6 link-local to the bridge: {all}");
    assert_eq!(get("route_change"), "refused", "no CAP_NET_ADMIN: {all}");
    // The proxy's bind holds its layers and ready files (and the test resolver's log), never
    // the sandbox's environment file with its credentials.
    let proxy_dir = get("proxy_dir");
    assert!(proxy_dir.contains("layers.json") && !proxy_dir.contains("env"), "{all}");
    assert_eq!(get("engine_socket"), "absent", "no engine socket inside: {all}");
    assert_eq!(get("daemon_socket"), "absent", "no airlockd socket inside: {all}");
    assert_eq!(get("host_home"), "absent", "nothing of the host's home inside: {all}");
    // The page's live view: `podman logs -f` / `docker logs -f` of the proxy container.
    assert_eq!(get("live_view"), "1", "{all}");
    // Protected paths are read-only inside; nothing planted reaches the host repo.
    assert_eq!(get("hook_write"), "refused", "{all}");
    assert_eq!(get("envrc_write"), "refused", "{all}");
    assert_eq!(get("hook_after"), "absent", "{all}");
    assert_eq!(get("envrc_after"), "absent", "{all}");
    // Across sessions: a `.git` file planted in a subdirectory, pointing at a git dir whose
    // config runs a command, is quarantined before `exec` returns; the host's git run there
    // afterwards runs nothing.
    assert_eq!(get("plant_gitdir"), "written", "the plant itself worked: {all}");
    assert_eq!(get("gitdir_after"), "absent", "{all}");
    assert_eq!(get("host_git_ran_planted"), "no", "{all}");
    // The audit trail: the session's lines, attributed, in the repo's log directory.
    let allow: Vec<&str> = get("audit_allow").split(',').collect();
    assert_eq!(allow.len(), 3, "an ALLOW line for allowed.test: {all}");
    assert_eq!(allow[0].len(), 8, "{all}");
    assert_eq!((allow[1], allow[2]), ("True", "user"), "user_id and layer: {all}");
    assert!(get("audit_deny").starts_with("not_allowed"), "{all}");
    assert_eq!(get("audit_managed"), "False,managed", "{all}");
    // Registered with airlockd as a native session is: start and end records for the
    // session the lines carry, the command's status and the lines' audit root in the end
    // record; the lines carry the repo's host path and key.
    assert_eq!(get("session_records"), "1,1,True,7,True", "{all}");
    assert_eq!(get("audit_repo_key"), "True,True", "{all}");
    // The proxy serves its own repo's sandboxes only: not another container on the engine's
    // default network (its uplink), not another repo's sandbox (another network).
    assert_ne!(get("neighbour_uplink_ip"), "connected", "{all}");
    assert_ne!(get("other_repo_reach"), "connected", "{all}");
    assert_eq!(get("same_repo_other_proxy"), "refused", "another session's proxy: {all}");
    // SIGTERM to `airlock` alone reaches the command (passed on through the engine CLI, then
    // by the sandbox's init to a command that handles no signal) and the session still leaves
    // nothing behind.
    assert_eq!(get("long_exit"), "143", "{all}");
    assert_eq!(get("long_containers_left"), "0", "{all}");
    assert_eq!(get("other_repo_net_differs"), "yes", "{all}");
    // `[audit] session_budget` of the user layer, enforced in the proxy container: the
    // session stopped with 124 and why, its sandbox killed, the stop line in the log.
    assert_eq!(get("budget_stop"), "124,1", "{all}");
    assert_eq!(get("budget_ran_on"), "no", "the sandbox was killed: {all}");
    assert_eq!(get("budget_line"), "1", "{all}");
    assert_eq!(get("budget_end_reason"), "audit_budget", "the end record says why: {all}");
    // A network of a repo's name that someone else made without the seals is refused.
    assert_eq!(get("planted_network"), "125,1", "{all}");
    // `airlock doctor --backend` says the same: the engine, the images, each network's seal.
    assert_eq!(get("doctor_engine"), "1", "{all}");
    assert_eq!(get("doctor_images"), "2", "{all}");
    assert_eq!(get("doctor_seccomp"), "1", "{all}");
    assert_eq!(get("doctor_proxy_version"), "1", "{all}");
    assert_eq!(get("doctor_sealed"), "1", "{all}");
    assert_eq!(get("doctor_planted"), "1", "{all}");
    // Docker's host-side drop rule for the repo's bridge: put in place by the helper
    // container, reported by doctor, and a wall by itself (an address added to the bridge
    // later is still unreachable from the sandbox).
    if engine == "docker" {
        // Dropped by the rule (a timeout), not refused by a missing route or an RST.
        assert_eq!(get("guard_added_address"), "TimeoutError", "{all}");
        assert_eq!(get("bridge_guard"), "1", "{all}");
    }
    let docker = if engine == "docker" { "1" } else { "0" };
    assert_eq!(get("doctor_guard"), docker, "{all}");
    // `airlock run --backend`: the image's agent, its per-repo home kept between sessions,
    // the transcripts it wrote hashed into the end record.
    assert_eq!(get("agent_home"), "/home/agent", "{all}");
    assert_eq!(get("agent_args"), "--print hello", "{all}");
    assert_eq!(get("agent_runs"), "2", "the home persists between sessions: {all}");
    assert_eq!(get("agent_record"), "claude,1", "{all}");
    // Per repo network kept; per session containers and files gone.
    assert_eq!(get("network_made"), "yes", "{all}");
    assert_eq!(get("containers_left"), "0", "{all}");
    assert_eq!(get("run_dir_left"), "0", "{all}");
}

/// The proxy and audit suites (every test built on `proxy_support::ProxyProc`) run again with
/// the proxy in the proxy image, under `sealed.sh`: this test binary, re-run inside the sealed
/// namespace with `AIRLOCK_TEST_PROXY_ENGINE`, starts each proxy as a container on that
/// namespace's network (`--network host`: the namespace the test made, where the loopback
/// upstreams listen).
fn proxy_suites_in(engine: &str) {
    let world = World::new();
    let work = world.tmp.path().join("engine");
    let used = world.tmp.path().join("containers-used");
    let this = std::env::current_exe().unwrap();
    // (audit_volume's other tests are native sessions and the review plane, not the proxy.)
    let suites = "proxy:: proxy_adversarial:: proxy_malformed:: \
                  audit_volume::a_refusal_flood_is_bounded_and_loses_no_count";
    let inner = format!(
        "{images} {engine} {airlockd} {work} >&2 && exec {this} --test-threads 2 {suites} \
         --skip sandbox_proxy",
        images = script("images.sh").display(),
        airlockd = bin("airlockd").display(),
        work = work.display(),
        this = this.display(),
    );
    let out = Command::new(script("sealed.sh"))
        .arg(&work)
        .arg(engine)
        .args(["--", "bash", "-c", &inner])
        .env("AIRLOCK_TEST_PROXY_ENGINE", engine)
        .env("AIRLOCK_TEST_PROXY_ENGINE_LOG", &used)
        .env_remove("AIRLOCK_TEST_RESOLVER")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = format!("{stdout}\n--- stderr ---\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the suites failed against the {engine} proxy container:\n{all}");
    assert!(stdout.contains(" 0 failed") && !stdout.contains("running 0 tests"), "{all}");
    // Not vacuous: the proxies were containers (each one the harness started is listed).
    let started = std::fs::read_to_string(&used).unwrap_or_default().lines().count();
    assert!(started >= 17, "only {started} proxy containers started:\n{all}");
}

#[test]
fn the_proxy_suites_pass_against_the_podman_proxy_container() {
    if engine_ready("podman") && crate::proxy_support::proxy_engine().is_none() {
        proxy_suites_in("podman");
    }
}

#[test]
fn the_proxy_suites_pass_against_the_docker_proxy_container() {
    if engine_ready("dockerd")
        && engine_ready("docker")
        && crate::proxy_support::proxy_engine().is_none()
    {
        proxy_suites_in("docker");
    }
}

/// Rootless Podman, run by an unprivileged user (`airlock-ci`, as `.ci/unprivileged` makes
/// it): `--userns=keep-id`, the repo network inside Podman's rootless network namespace, the
/// proxy's way out through slirp4netns. The root part (user, subordinate ids, images, an
/// upstream on a veth pair that goes nowhere) is done by the script inside `sealed.sh`.
#[test]
fn a_rootless_podman_session_of_an_unprivileged_user_holds_the_contract() {
    if !engine_ready("podman") {
        return;
    }
    let missing = missing_tools(&["setpriv", "slirp4netns", "newuidmap", "useradd"]);
    if !missing.is_empty() {
        assert!(!in_ci(), "CI needs {missing:?} for rootless Podman (.ci/prereqs installs them)");
        eprintln!("SKIP: rootless Podman needs {missing:?}");
        return;
    }
    let (results, all) = sealed_scenario("podman", "rootless-scenario.sh");
    let get =
        |k: &str| results.get(k).map(String::as_str).unwrap_or_else(|| panic!("no {k}:\n{all}"));
    assert_eq!(get("rootless"), "true", "Podman ran rootless: {all}");
    let user = get("user");
    // keep-id: the user's own ids inside, and what the command made is theirs on the host.
    assert_eq!(get("inside_user"), user, "{all}");
    assert_eq!(get("made_owner"), user, "{all}");
    assert_eq!(get("exit_code"), "5", "{all}");
    assert_eq!(get("fetch_allowed"), "upstream-ok", "{all}");
    assert_eq!(get("fetch_denied"), "403", "{all}");
    // Not through the proxy: refused by the network; a plain container reaches the upstream.
    assert_ne!(get("direct"), "connected", "{all}");
    assert_eq!(get("control_direct"), "connected", "the control: {all}");
    // Across sessions, as the unprivileged user: the planted `.git` file is quarantined, the
    // user's own git runs nothing there, and the next session starts and sees no plant.
    assert_eq!(get("plant_gitdir"), "written", "the plant itself worked: {all}");
    assert_eq!(get("gitdir_after"), "absent", "{all}");
    assert_eq!(get("host_git_ran_planted"), "no", "{all}");
    assert_eq!(get("next_session"), "0", "{all}");
    assert_eq!(get("audit"), "1,1", "{all}");
    assert_eq!(get("end_records"), "2", "{all}");
    assert_eq!(get("containers_left"), "0", "{all}");
}

#[test]
fn a_backend_typo_and_a_missing_engine_are_clear_errors() {
    let world = World::new();
    let repo = world.repo("app");
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"x.test\"]\n");
    let run = world.airlock(&repo).args(["exec", "--backend", "dokcer", "--", "true"]).run();
    // A usage error, like every other bad flag (exit 125: Airlock did not run anything).
    assert_eq!(run.code(), 125, "{}", run.stderr());
    assert!(
        run.stderr().contains("unknown backend \"dokcer\"; use one of native, docker, podman"),
        "{}",
        run.stderr()
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_PODMAN", world.tmp.path().join("no-such-podman"))
        .args(["exec", "--backend", "podman", "--", "true"])
        .run();
    assert_eq!(run.code(), 125, "{}", run.stderr());
    assert!(
        run.stderr().contains("podman is not installed")
            && run.stderr().contains("--backend native"),
        "{}",
        run.stderr()
    );
    // `run` with a container backend runs the image's agent: the host is not searched for it
    // (no `claude` here), so the complaint is the engine's absence; a host path is refused.
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_PODMAN", world.tmp.path().join("no-such-podman"))
        .args(["run", "--backend", "podman", "claude"])
        .run();
    assert_eq!(run.code(), 125, "{}", run.stderr());
    assert!(run.stderr().contains("podman is not installed"), "{}", run.stderr());
    let run = world.airlock(&repo).args(["run", "--backend", "podman", "/opt/x/claude"]).run();
    assert_eq!(run.code(), 125, "{}", run.stderr());
    assert!(run.stderr().contains("not a host path"), "{}", run.stderr());
    // Nothing of the session is left: no placeholder, no run directory.
    assert!(!repo.join(".envrc").exists());
    assert!(
        !world.home.join(".airlock/run").exists()
            || std::fs::read_dir(world.home.join(".airlock/run")).unwrap().next().is_none()
    );
}

#[test]
fn a_repo_file_cannot_choose_the_backend() {
    let world = World::new();
    let repo = world.repo("app");
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"x.test\"]\n");
    world.write(repo.join(".airlock.toml"), "[sandbox]\nbackend = \"docker\"\n");
    let run = world.airlock(&repo).args(["policy", "test"]).run();
    assert_eq!(run.code(), 3, "a configuration error: {}", run.stdout());
    let text = run.stdout() + &run.stderr();
    assert!(text.contains("sandbox.backend is not allowed in the repo layer"), "{text}");
}
