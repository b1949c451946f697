//! The engine command lines a session runs, as pure functions of what they need: the network,
//! the proxy container and the sandbox container. Each hardening flag sits beside the leak it
//! closes; those leaks were measured on Podman 4.3 (netavark, aardvark-dns) and Docker 20.10
//! (docs/backends.md, "What `--internal` leaves open").

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::Engine;
use super::names::{PROXY_HOST, PROXY_PORT};

/// Where the proxy container finds what the host gives it.
pub const PROXY_RUN_DIR: &str = "/airlock/run";
pub const PROXY_LOG_DIR: &str = "/airlock/logs";
/// The `airlockd` inside the proxy image (`contrib/docker/`).
pub const PROXY_AIRLOCKD: &str = "/usr/local/bin/airlockd";
/// The proxy's stop file in its run directory (`airlockd proxy --stop-file`).
pub const STOP_FILE: &str = "stopped";
/// The image names (`airlock/base`, `airlock/proxy`); `[sandbox]`-independent so every
/// machine's images are found the same way. `AIRLOCK_BASE_IMAGE`/`AIRLOCK_PROXY_IMAGE`
/// override them.
pub const BASE_IMAGE: &str = "airlock/base:latest";
pub const PROXY_IMAGE: &str = "airlock/proxy:latest";

/// The images this machine's sessions use: `(base, proxy)`, from `AIRLOCK_BASE_IMAGE` and
/// `AIRLOCK_PROXY_IMAGE` when set, else [`BASE_IMAGE`] and [`PROXY_IMAGE`]. Unchecked: callers
/// pass each through [`check_image_name`] before an engine sees it.
pub fn images(env: &dyn crate::env::Env) -> (String, String) {
    let image = |var: &str, default: &str| {
        env.var(var).filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_owned())
    };
    (image("AIRLOCK_BASE_IMAGE", BASE_IMAGE), image("AIRLOCK_PROXY_IMAGE", PROXY_IMAGE))
}

/// An image name from the environment (`AIRLOCK_BASE_IMAGE`, `AIRLOCK_PROXY_IMAGE`) is a
/// positional argument of `run`: one that starts with `-` would be read as a flag
/// (`--privileged`). Allowed: a reference's characters, starting with a letter or digit.
pub fn check_image_name(image: &str) -> Result<(), String> {
    let ok = image.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && image.chars().all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the image name {image:?} is not an image reference (letters, digits and `._-/:@`, \
             starting with a letter or digit); check AIRLOCK_BASE_IMAGE and AIRLOCK_PROXY_IMAGE"
        ))
    }
}

/// The user the containers run as: the caller, so files written through bind mounts keep the
/// caller's ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// Podman without root: `--userns=keep-id` maps the caller to the same ids inside.
    pub rootless_podman: bool,
}

impl RunAs {
    fn args(&self) -> Vec<OsString> {
        if self.rootless_podman {
            vec!["--userns=keep-id".into()]
        } else {
            vec!["--user".into(), format!("{}:{}", self.uid, self.gid).into()]
        }
    }
}

/// One bind mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub host: PathBuf,
    pub inside: PathBuf,
    pub read_only: bool,
}

/// A path an engine's `--mount` syntax cannot carry (its fields are comma-separated).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} cannot be bind-mounted by a container engine (a comma or a newline in the path); \
     rename it, or use --backend native",
    .0.display()
)]
pub struct UnmountablePath(pub PathBuf);

impl Bind {
    /// `--mount type=bind,...`: unlike `-v`, it never creates a missing host path (Docker would
    /// create it as root) and has no `:` ambiguity.
    fn arg(&self) -> Result<OsString, UnmountablePath> {
        for p in [&self.host, &self.inside] {
            let bytes = p.as_os_str().as_encoded_bytes();
            if bytes.iter().any(|b| matches!(b, b',' | b'\n' | b'\r')) {
                return Err(UnmountablePath(p.clone()));
            }
        }
        let mut s = OsString::from("type=bind,source=");
        s.push(&self.host);
        s.push(",target=");
        s.push(&self.inside);
        if self.read_only {
            s.push(",readonly=true");
        }
        Ok(s)
    }
}

/// `network create` for the repo's internal network.
pub fn network_create(
    engine: Engine,
    name: &str,
    repo_key: &str,
    subnet: Option<ipnet::Ipv4Net>,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["network".into(), "create".into()];
    if let Some(net) = subnet {
        a.push("--subnet".into());
        a.push(net.to_string().into());
    }
    // No route off the network (no gateway NAT).
    a.push("--internal".into());
    match engine {
        // Podman with DNS on forwards external names from the internal network (aardvark-dns),
        // and gives the bridge an IPv4 the sandbox can reach; without it, neither. Created
        // through the podman CLI: the Docker-compatible API turns DNS back on.
        Engine::Podman => a.push("--disable-dns".into()),
        // Docker gives an internal bridge an address on the engine host and routes the
        // sandbox to it: every service listening there on 0.0.0.0 was reachable. Without an
        // IPv4 on the bridge, nothing of the host answers.
        Engine::Docker => {
            a.push("-o".into());
            a.push("com.docker.network.bridge.inhibit_ipv4=true".into());
            // A bridge device of a known name, so `airlockd bridge-guard` can drop what the
            // host receives from it (the second wall; `session::guard_bridge`).
            if let Some(bridge) = super::names::bridge_of_network(name) {
                a.push("-o".into());
                a.push(format!("{BRIDGE_NAME_OPTION}={bridge}").into());
            }
        }
    }
    a.push("--label".into());
    a.push(format!("airlock.repo-key={repo_key}").into());
    a.push(name.into());
    a
}

/// A candidate subnet for a Docker network (Docker assigns a static address only on a
/// network whose subnet was given): a /24 in 10.128.0.0/10 from the repo key and the attempt,
/// so a subnet another network holds (Docker says the pool overlaps) is tried again with the
/// next. The bridge has no IPv4 (`inhibit_ipv4`), so the host gets no route to it and a LAN of
/// the same range is not shadowed.
pub fn docker_subnet(repo_key: &str, attempt: u32) -> ipnet::Ipv4Net {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("{repo_key}/{attempt}").as_bytes());
    let addr = std::net::Ipv4Addr::new(10, 128 | (d[0] & 0x3f), d[1], 0);
    // A /24 at a .0 address is always a valid network.
    ipnet::Ipv4Net::new(addr, 24).unwrap_or_default()
}

/// Docker's network option naming the bridge device.
const BRIDGE_NAME_OPTION: &str = "com.docker.network.bridge.name";

/// `network inspect` printing, in one call, what makes a network sealed (`internal` and, for
/// Podman, whether DNS is on; for Docker, the bridge's `inhibit_ipv4` option and its device
/// name) and then its subnets. Fails when there is no such network.
pub fn network_inspect(engine: Engine, name: &str) -> Vec<OsString> {
    let format = match engine {
        Engine::Podman => {
            "{{.Internal}} {{.DNSEnabled}} {{.Driver}} {{range .Subnets}}{{.Subnet}} {{end}}"
        }
        Engine::Docker => {
            // `with … else`: an absent option prints one word, keeping the fields in place.
            "{{.Internal}} \
             {{with index .Options \"com.docker.network.bridge.inhibit_ipv4\"}}{{.}}{{else}}unset{{end}} \
             {{.Driver}} \
             {{with index .Options \"com.docker.network.bridge.name\"}}{{.}}{{else}}unset{{end}} \
             {{range .IPAM.Config}}{{.Subnet}} {{end}}"
        }
    };
    vec!["network".into(), "inspect".into(), "--format".into(), format.into(), name.into()]
}

/// Whether [`network_inspect`]'s output shows a sealed network; `Err` says what is missing. A
/// network of the same name made by someone else (by hand, an older Airlock, another user of
/// the engine) must not be used as it is. A Docker network must also name its bridge device
/// as Airlock does for `name` ([`super::names::bridge_of_network`]), or the host-side drop
/// rule would guard another device.
pub fn judge_seal(engine: Engine, name: &str, output: &str) -> Result<(), String> {
    let mut words = output.split_whitespace();
    let internal = words.next() == Some("true");
    let second = words.next().unwrap_or("");
    // A macvlan or ipvlan network puts its containers on the host's own link: only a bridge
    // is the private segment these flags describe.
    let bridge = words.next() == Some("bridge");
    let mut missing = Vec::new();
    if !internal {
        missing.push("it is not --internal");
    }
    if !bridge {
        missing.push("its driver is not bridge");
    }
    match engine {
        Engine::Podman if second != "false" => missing.push("its DNS is on (no --disable-dns)"),
        Engine::Docker if second != "true" => {
            missing.push("its bridge has an IPv4 address (no inhibit_ipv4)")
        }
        _ => {}
    }
    if engine == Engine::Docker {
        let device = words.next().unwrap_or("");
        if super::names::bridge_of_network(name).as_deref() != Some(device) {
            missing.push("its bridge device is not named alk-<key8> (no bridge guard)");
        }
    }
    if missing.is_empty() { Ok(()) } else { Err(missing.join(", ")) }
}

/// `image inspect` of `images`, to see whether they are all there (both engines have it; it
/// fails when one is missing).
pub fn images_exist(images: &[&str]) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["image".into(), "inspect".into(), "--format".into()];
    a.push("{{.Id}}".into());
    a.extend(images.iter().map(OsString::from));
    a
}

/// What the proxy container needs.
#[derive(Debug, Clone)]
pub struct ProxySpec {
    pub name: String,
    pub image: String,
    pub network: String,
    /// Its address on `network`, where alone it listens: the engine's other networks (the
    /// uplink's other containers) cannot use it as their proxy.
    pub ip: std::net::Ipv4Addr,
    /// The session's sandbox's address: the only peer it serves.
    pub sandbox_ip: std::net::Ipv4Addr,
    pub uplink: String,
    pub run_as: RunAs,
    pub repo_name: String,
    /// The repo's host path: the lines carry it and its repo key, as a native session's do.
    pub repo_path: PathBuf,
    pub session: String,
    pub user_id: Option<String>,
    pub phase: Option<String>,
    /// Host directory with the layers file, bound read-write at [`PROXY_RUN_DIR`] (the proxy
    /// writes its ready file there).
    pub run_dir: PathBuf,
    /// The repo's audit log directory, bound at [`PROXY_LOG_DIR`].
    pub log_dir: PathBuf,
    /// Extra `-e NAME=VALUE` (test builds only: the test resolver).
    pub env: Vec<(String, String)>,
    /// Extra read-only binds (test builds only: the test resolver's file).
    pub binds: Vec<Bind>,
}

/// `run -d` for the session's proxy container.
pub fn proxy_run(engine: Engine, p: &ProxySpec) -> Result<Vec<OsString>, UnmountablePath> {
    // No `--rm`: a proxy that exits at start keeps its words for `logs`; the session removes it.
    let mut a: Vec<OsString> = vec!["run".into(), "-d".into()];
    a.extend(["--name".into(), p.name.clone().into()]);
    a.extend(["--label".into(), format!("airlock.session={}", p.session).into()]);
    // Its only way out, and the only container on two networks. The Docker CLI takes one
    // network at `run`; the uplink is joined with [`network_connect`] before any sandbox
    // starts.
    match engine {
        Engine::Podman => {
            a.extend(["--network".into(), format!("{}:ip={}", p.network, p.ip).into()]);
            a.extend(["--network".into(), p.uplink.clone().into()]);
        }
        Engine::Docker => {
            a.extend(["--network".into(), p.network.clone().into()]);
            a.extend(["--ip".into(), p.ip.to_string().into()]);
        }
    }
    // Not a router between the two networks, whatever a sandbox sends it.
    a.extend(["--sysctl".into(), "net.ipv4.ip_forward=0".into()]);
    a.extend(["--cap-drop".into(), "ALL".into()]);
    a.extend(["--security-opt".into(), "no-new-privileges".into()]);
    a.extend(p.run_as.args());
    for (k, v) in &p.env {
        a.extend(["--env".into(), format!("{k}={v}").into()]);
    }
    let mut binds = vec![
        Bind { host: p.run_dir.clone(), inside: PROXY_RUN_DIR.into(), read_only: false },
        Bind { host: p.log_dir.clone(), inside: PROXY_LOG_DIR.into(), read_only: false },
    ];
    binds.extend(p.binds.iter().cloned());
    for b in &binds {
        a.extend(["--mount".into(), b.arg()?]);
    }
    // The images are built locally (contrib/docker/); never fetch one by that name.
    a.push("--pull=never".into());
    a.extend(["--entrypoint".into(), PROXY_AIRLOCKD.into()]);
    a.push(p.image.clone().into());
    let run = Path::new(PROXY_RUN_DIR);
    a.push("proxy".into());
    a.extend(["--repo-name".into(), p.repo_name.clone().into()]);
    a.extend(["--repo-path".into(), p.repo_path.clone().into()]);
    a.extend(["--listen".into(), format!("{}:{PROXY_PORT}", p.ip).into()]);
    a.extend(["--layers".into(), run.join("layers.json").into()]);
    a.extend(["--log-dir".into(), PROXY_LOG_DIR.into()]);
    a.extend(["--session".into(), p.session.clone().into()]);
    a.extend(["--ready-file".into(), run.join("ready").into()]);
    // How the session learns that the `[audit]` bounds stopped it (it then ends the sandbox).
    a.extend(["--stop-file".into(), run.join(STOP_FILE).into()]);
    // Its session's sandbox alone: the repo's network also holds its other sessions.
    a.extend(["--allow-peer".into(), p.sandbox_ip.to_string().into()]);
    if let Some(u) = &p.user_id {
        a.extend(["--user-id".into(), u.clone().into()]);
    }
    if let Some(ph) = &p.phase {
        a.extend(["--phase".into(), ph.clone().into()]);
    }
    Ok(a)
}

/// `run --rm` of the Docker backend's helper: `airlockd bridge-guard` on the engine host's
/// network with CAP_NET_ADMIN alone, as root in the container (a capability is no use to a
/// non-root user there), installing — or with `check`, looking for — the drop rule of each
/// bridge ([`crate::sys::bridge_guard`]).
pub fn bridge_guard_run(image: &str, bridges: &[String], check: bool) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["run".into(), "--rm".into()];
    a.extend(["--network".into(), "host".into()]);
    a.extend(["--cap-drop".into(), "ALL".into(), "--cap-add".into(), "NET_ADMIN".into()]);
    a.extend(["--security-opt".into(), "no-new-privileges".into()]);
    a.extend(["--user".into(), "0:0".into()]);
    a.push("--read-only".into());
    a.push("--pull=never".into());
    a.extend(["--entrypoint".into(), PROXY_AIRLOCKD.into()]);
    a.push(image.into());
    a.push("bridge-guard".into());
    for b in bridges {
        a.extend(["--bridge".into(), b.into()]);
    }
    if check {
        a.push("--check".into());
    }
    a
}

/// `run --rm --init` of the proxy image's `airlockd --version`, with no network: what
/// `airlock doctor` compares with this build, started as the sandbox is (`--init`), so an
/// engine without its init binary fails here.
pub fn image_version_run(image: &str) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["run".into(), "--rm".into(), "--init".into()];
    a.extend(["--network".into(), "none".into(), "--pull=never".into()]);
    a.extend(["--entrypoint".into(), PROXY_AIRLOCKD.into(), image.into(), "--version".into()]);
    a
}

/// `kill` (SIGKILL, both engines' default) of the container `name`.
pub fn kill(name: &str) -> Vec<OsString> {
    vec!["kill".into(), name.into()]
}

/// `network connect`: the proxy container joins its uplink (Docker).
pub fn network_connect(network: &str, container: &str) -> Vec<OsString> {
    vec!["network".into(), "connect".into(), network.into(), container.into()]
}

/// What the sandbox container needs.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub name: String,
    pub image: String,
    pub network: String,
    pub proxy_ip: String,
    /// Its own static address on `network`: the only peer its proxy serves.
    pub ip: std::net::Ipv4Addr,
    pub run_as: RunAs,
    pub hostname: String,
    pub workdir: PathBuf,
    /// The repo (read-write), then protected paths (read-only) and pinned directories.
    pub binds: Vec<Bind>,
    /// The home directory: a tmpfs (`exec`) or a bind of the per-repo agent home (`run`).
    pub home: Home,
    /// The `--env-file` with the session's environment (0600, host side).
    pub env_file: PathBuf,
    pub tty: bool,
    pub argv: Vec<OsString>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Home {
    Tmpfs { path: PathBuf },
    Bind(Bind),
}

/// `run` (attached) for the session's sandbox container.
pub fn sandbox_run(engine: Engine, s: &SandboxSpec) -> Result<Vec<OsString>, UnmountablePath> {
    let mut a: Vec<OsString> = vec!["run".into(), "--rm".into(), "-i".into()];
    if s.tty {
        a.push("-t".into());
    }
    a.extend(["--name".into(), s.name.clone().into()]);
    // A small init as PID 1 (catatonit, docker-init): it passes SIGTERM on to the command and
    // reaps its orphans. The command as PID 1 would ignore every signal it has no handler for,
    // so `airlock` passing on a SIGTERM would not stop it.
    a.push("--init".into());
    match engine {
        Engine::Podman => {
            a.extend(["--network".into(), format!("{}:ip={}", s.network, s.ip).into()])
        }
        Engine::Docker => {
            a.extend(["--network".into(), s.network.clone().into()]);
            a.extend(["--ip".into(), s.ip.to_string().into()]);
        }
    }
    // No resolver: an internal network still forwards names (aardvark-dns; Docker's embedded
    // 127.0.0.11), which is a channel out. Names resolve at the proxy.
    match engine {
        Engine::Podman => a.extend(["--dns".into(), "none".into()]),
        // The Docker CLI has no `none`: a loopback address nothing listens on.
        Engine::Docker => a.extend(["--dns".into(), "127.0.0.1".into()]),
    }
    a.extend(["--add-host".into(), format!("{PROXY_HOST}:{}", s.proxy_ip).into()]);
    // The bridge's IPv6 link-local address answers otherwise.
    a.extend(["--sysctl".into(), "net.ipv6.conf.all.disable_ipv6=1".into()]);
    // No CAP_NET_ADMIN (routes), CAP_NET_RAW (raw packets), nor any other.
    a.extend(["--cap-drop".into(), "ALL".into()]);
    a.extend(["--security-opt".into(), "no-new-privileges".into()]);
    a.extend(s.run_as.args());
    a.extend(["--hostname".into(), s.hostname.clone().into()]);
    a.extend(["--workdir".into(), s.workdir.clone().into()]);
    for b in &s.binds {
        a.extend(["--mount".into(), b.arg()?]);
    }
    match &s.home {
        Home::Tmpfs { path } => {
            let mut t = OsString::from(path);
            t.push(":rw,nosuid,nodev,size=1g,mode=0700,");
            // Owned by the caller inside: Podman's `U` chowns it to the container user (it
            // refuses tmpfs's own uid=/gid=); Docker passes uid=/gid= to the kernel.
            match engine {
                Engine::Podman => t.push("U"),
                Engine::Docker => t.push(format!("uid={},gid={}", s.run_as.uid, s.run_as.gid)),
            }
            a.extend(["--tmpfs".into(), t]);
        }
        Home::Bind(b) => a.extend(["--mount".into(), b.arg()?]),
    }
    a.extend(["--env-file".into(), s.env_file.clone().into()]);
    a.push("--pull=never".into());
    a.push(s.image.clone().into());
    a.extend(s.argv.iter().cloned());
    Ok(a)
}

/// The first IPv4 subnet in [`network_inspect`]'s output.
pub fn first_v4_subnet(text: &str) -> Option<ipnet::Ipv4Net> {
    text.split_whitespace().find_map(|w| w.parse::<ipnet::Ipv4Net>().ok())
}

/// A host address of `net` for the proxy, from `random`: never the network or broadcast
/// address, nor the first host (Docker's gateway, unused but reserved). `None` when the
/// subnet has no room (smaller than a /29).
pub fn proxy_address(net: ipnet::Ipv4Net, random: u32) -> Option<std::net::Ipv4Addr> {
    let hosts = net.hosts().count() as u32;
    if hosts < 4 {
        return None;
    }
    // Hosts 2..=hosts-1 (1-based): skip the first, keep clear of the broadcast.
    let offset = 2 + random % (hosts - 2);
    Some(std::net::Ipv4Addr::from(u32::from(net.network()) + offset))
}

/// Stopping the proxy with its drain grace (SIGTERM, then SIGKILL after `grace_secs`) and
/// removing it: one `rm -f -t` for Podman; Docker's `rm -f` kills at once, so `stop -t` first
/// and then [`remove`].
pub fn stop_and_remove(engine: Engine, name: &str, grace_secs: u32) -> Vec<Vec<OsString>> {
    let grace: OsString = grace_secs.to_string().into();
    match engine {
        Engine::Podman => vec![vec!["rm".into(), "-f".into(), "-t".into(), grace, name.into()]],
        Engine::Docker => {
            vec![vec!["stop".into(), "-t".into(), grace, name.into()], remove(name)]
        }
    }
}

/// `rm -f`, for a container that must go whatever its state.
pub fn remove(name: &str) -> Vec<OsString> {
    vec!["rm".into(), "-f".into(), name.into()]
}

/// `logs`, for the proxy's own words when it did not come up.
pub fn logs(name: &str) -> Vec<OsString> {
    vec!["logs".into(), name.into()]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn has_pair(a: &[OsString], flag: &str, value: &str) -> bool {
        a.windows(2).any(|w| w[0] == flag && w[1] == value)
    }

    fn run_as() -> RunAs {
        RunAs { uid: 1000, gid: 1000, rootless_podman: false }
    }

    fn sandbox(engine: Engine) -> Vec<OsString> {
        let spec = SandboxSpec {
            name: "airlock-sandbox-app-1-2".into(),
            image: BASE_IMAGE.into(),
            network: "airlock-net-12345678".into(),
            proxy_ip: "10.89.0.2".into(),
            ip: "10.89.0.9".parse().unwrap(),
            run_as: run_as(),
            hostname: "app".into(),
            workdir: "/app".into(),
            binds: vec![Bind { host: "/h/app".into(), inside: "/app".into(), read_only: false }],
            home: Home::Tmpfs { path: "/home/agent".into() },
            env_file: "/run/env".into(),
            tty: false,
            argv: vec!["true".into()],
        };
        sandbox_run(engine, &spec).unwrap()
    }

    #[test]
    fn the_sandbox_container_carries_every_measured_seal() {
        for engine in [Engine::Podman, Engine::Docker] {
            let a = sandbox(engine);
            let dns = if engine == Engine::Podman { "none" } else { "127.0.0.1" };
            assert!(has_pair(&a, "--dns", dns), "{engine}: {a:?}");
            assert!(has_pair(&a, "--sysctl", "net.ipv6.conf.all.disable_ipv6=1"));
            assert!(has_pair(&a, "--cap-drop", "ALL"));
            assert!(has_pair(&a, "--security-opt", "no-new-privileges"));
            assert!(has_pair(&a, "--add-host", "airlock-proxy:10.89.0.2"));
            assert!(a.iter().any(|x| x == "--init"), "the command is not PID 1");
            let net = if engine == Engine::Podman {
                "airlock-net-12345678:ip=10.89.0.9"
            } else {
                assert!(has_pair(&a, "--ip", "10.89.0.9"));
                "airlock-net-12345678"
            };
            assert!(has_pair(&a, "--network", net), "{engine}: {a:?}");
            assert_eq!(a.iter().filter(|x| *x == "--network").count(), 1, "one network only");
            assert!(has_pair(&a, "--user", "1000:1000"));
            assert!(has_pair(&a, "--mount", "type=bind,source=/h/app,target=/app"));
            assert!(!a.iter().any(|x| x == "--privileged" || x == "-t"));
            assert_eq!(a.last().unwrap(), "true");
        }
    }

    #[test]
    fn the_proxy_is_no_router_and_reads_only_its_layers_file() {
        let p = ProxySpec {
            name: "airlock-proxy-app-1-2".into(),
            image: PROXY_IMAGE.into(),
            network: "airlock-net-12345678".into(),
            ip: "10.89.0.7".parse().unwrap(),
            sandbox_ip: "10.89.0.9".parse().unwrap(),
            uplink: "podman".into(),
            run_as: RunAs { rootless_podman: true, ..run_as() },
            repo_name: "app".into(),
            repo_path: "/h/app".into(),
            session: "s1".into(),
            user_id: Some("u1".into()),
            phase: None,
            run_dir: "/h/.airlock/run/s1".into(),
            log_dir: "/h/.airlock/logs/app".into(),
            env: vec![],
            binds: vec![],
        };
        let a = proxy_run(Engine::Podman, &p).unwrap();
        assert!(has_pair(&a, "--sysctl", "net.ipv4.ip_forward=0"));
        assert!(has_pair(&a, "--cap-drop", "ALL"));
        assert!(a.iter().any(|x| x == "--userns=keep-id"));
        assert!(has_pair(&a, "--layers", "/airlock/run/layers.json"));
        assert!(has_pair(&a, "--session", "s1"));
        assert!(has_pair(&a, "--user-id", "u1"));
        assert!(!a.iter().any(|x| x == "--config"));
        assert!(has_pair(
            &a,
            "--mount",
            "type=bind,source=/h/.airlock/logs/app,target=/airlock/logs"
        ));
        assert_eq!(a.iter().filter(|x| *x == "--network").count(), 2);
        assert!(has_pair(&a, "--network", "airlock-net-12345678:ip=10.89.0.7"));
        assert!(has_pair(&a, "--listen", "10.89.0.7:8888"), "never 0.0.0.0: {a:?}");
        assert!(has_pair(&a, "--allow-peer", "10.89.0.9"), "its sandbox alone: {a:?}");
        assert!(has_pair(&a, "--stop-file", "/airlock/run/stopped"));
        let d = proxy_run(Engine::Docker, &p).unwrap();
        assert!(has_pair(&d, "--network", "airlock-net-12345678"));
        assert_eq!(d.iter().filter(|x| *x == "--network").count(), 1, "docker: connect later");
        assert!(has_pair(&d, "--ip", "10.89.0.7"));
    }

    #[test]
    fn podman_networks_are_internal_without_dns_and_docker_ones_internal() {
        let a = network_create(Engine::Podman, "airlock-net-0123abcd", "app-1", None);
        assert!(a.iter().any(|x| x == "--internal") && a.iter().any(|x| x == "--disable-dns"));
        let d = network_create(
            Engine::Docker,
            "airlock-net-0123abcd",
            "app-1",
            Some(docker_subnet("app-1", 0)),
        );
        assert!(d.iter().any(|x| x == "--internal"));
        assert!(!d.iter().any(|x| x == "--disable-dns"), "docker has no such flag");
        assert!(has_pair(&d, "-o", "com.docker.network.bridge.inhibit_ipv4=true"));
        assert!(has_pair(&d, "-o", "com.docker.network.bridge.name=alk-0123abcd"));
        assert!(d.iter().any(|x| x == "--subnet"));
        let (s0, s1) = (docker_subnet("app-1", 0), docker_subnet("app-1", 1));
        assert_ne!(s0, s1, "each attempt another subnet");
        assert!("10.128.0.0/10".parse::<ipnet::Ipv4Net>().unwrap().contains(&s0));
        assert_eq!(s0.prefix_len(), 24);
    }

    #[test]
    fn the_proxy_address_is_a_host_of_the_subnet_and_never_the_gateway_or_broadcast() {
        let net = first_v4_subnet("true false bridge fd00::/64 10.89.3.0/24 ").unwrap();
        assert_eq!(net.to_string(), "10.89.3.0/24");
        for r in [0, 1, 252, 253, u32::MAX, 12345] {
            let ip = proxy_address(net, r).unwrap();
            let last = ip.octets()[3];
            assert!((2..=254).contains(&last), "{ip}");
            assert!(net.contains(&ip));
        }
        assert_eq!(proxy_address("10.0.0.0/30".parse().unwrap(), 7), None);
        assert_eq!(first_v4_subnet("fd00::/64"), None);
    }

    #[test]
    fn the_proxy_is_stopped_with_its_drain_grace_before_it_is_removed() {
        let p = stop_and_remove(Engine::Podman, "px", 7);
        assert_eq!(p, vec![vec!["rm", "-f", "-t", "7", "px"]]);
        // Docker's `rm -f` would SIGKILL at once: the drain needs `stop -t` first.
        let d = stop_and_remove(Engine::Docker, "px", 7);
        assert_eq!(d, vec![vec!["stop", "-t", "7", "px"], vec!["rm", "-f", "px"]]);
    }

    #[test]
    fn an_image_name_that_an_engine_would_read_as_a_flag_is_refused() {
        for ok in
            [BASE_IMAGE, "localhost/airlock-test/agent:latest", "r.example:5000/a/b@sha256:00"]
        {
            assert_eq!(check_image_name(ok), Ok(()), "{ok}");
        }
        for bad in ["--privileged", "-v", "", "a b", "img;rm", "/abs"] {
            assert!(check_image_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_a_network_made_sealed_is_judged_sealed() {
        let (p, n) = (Engine::Podman, "airlock-net-0123abcd");
        assert_eq!(judge_seal(p, n, "true false bridge 10.89.0.0/24 \n"), Ok(()));
        assert!(judge_seal(p, n, "true true bridge").unwrap_err().contains("DNS"));
        let e = judge_seal(p, n, "false false bridge").unwrap_err();
        assert!(e.contains("--internal"), "{e}");
        assert!(judge_seal(p, n, "true false macvlan").unwrap_err().contains("driver"));
        assert!(judge_seal(p, n, "").is_err());
        let d = Engine::Docker;
        assert_eq!(judge_seal(d, n, "true true bridge alk-0123abcd 10.128.1.0/24"), Ok(()));
        let e = judge_seal(d, n, "true unset bridge alk-0123abcd").unwrap_err();
        assert!(e.contains("inhibit"), "{e}");
        assert!(judge_seal(d, n, "true true ipvlan alk-0123abcd").unwrap_err().contains("driver"));
        // Made by an older Airlock or by hand: the guard would not know its device.
        for device in ["unset", "docker0", "alk-99999999", ""] {
            let e = judge_seal(d, n, &format!("true true bridge {device} 10.1.0.0/24"));
            assert!(e.unwrap_err().contains("bridge device"), "{device}");
        }
    }

    #[test]
    fn doctors_version_probe_runs_as_the_sandbox_starts_with_no_network() {
        let a = image_version_run("airlock/proxy:latest");
        assert!(a.iter().any(|x| x == "--init") && has_pair(&a, "--network", "none"));
        assert!(a.iter().any(|x| x == "--pull=never"));
        assert_eq!(a.last().unwrap(), "--version");
    }

    #[test]
    fn the_bridge_guard_runs_on_the_host_network_with_net_admin_alone() {
        let a = bridge_guard_run("airlock/proxy:latest", &["alk-0123abcd".into()], false);
        assert!(has_pair(&a, "--network", "host"));
        assert!(has_pair(&a, "--cap-drop", "ALL") && has_pair(&a, "--cap-add", "NET_ADMIN"));
        assert!(has_pair(&a, "--user", "0:0"), "capabilities need root in the container");
        assert!(a.iter().any(|x| x == "--rm") && a.iter().any(|x| x == "--pull=never"));
        let tail: Vec<_> = a
            .iter()
            .map(|x| x.to_string_lossy().into_owned())
            .skip_while(|x| x != "airlock/proxy:latest")
            .collect();
        assert_eq!(tail, ["airlock/proxy:latest", "bridge-guard", "--bridge", "alk-0123abcd"]);
        let c = bridge_guard_run("i", &["alk-1".into(), "alk-2".into()], true);
        assert_eq!(c.iter().filter(|x| *x == "--bridge").count(), 2);
        assert!(c.iter().any(|x| x == "--check"));
    }

    #[test]
    fn read_only_binds_say_so_and_paths_an_engine_cannot_carry_are_refused() {
        let b =
            Bind { host: "/r/.git/hooks".into(), inside: "/r/.git/hooks".into(), read_only: true };
        assert_eq!(
            b.arg().unwrap(),
            "type=bind,source=/r/.git/hooks,target=/r/.git/hooks,readonly=true"
        );
        let bad = Bind { host: "/r/a,b".into(), inside: "/x".into(), read_only: false };
        let e = bad.arg().unwrap_err().to_string();
        assert!(e.contains("/r/a,b") && e.contains("--backend native"), "{e}");
    }
}
