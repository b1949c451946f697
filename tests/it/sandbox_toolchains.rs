//! Toolchains, caches and the working directory (issue 15): `--mount`/`[sandbox] mounts` put host
//! trees inside read-only (refused with a reason when they reach secrets, sockets or Airlock's
//! own state), mounted `bin` directories join `PATH`, `~/.rustup` becomes `RUSTUP_HOME`,
//! `[sandbox] cache` gives each repo its own writable caches, and the working directory follows
//! the caller's. The builds run for real inside, through the proxy and audited, against
//! loopback registries this test serves under names the test resolver maps to 127.0.0.x.
//!
//! As root the host's own toolchains are used (cargo under `/root/.cargo`, rustup's
//! `/root/.rustup`). As the unprivileged CI user those are unreadable (another user's home), so
//! the cargo build becomes a refusal test of that mount, and the npm and pip builds use the
//! system `node`/`npm`/`python3` in `/usr/bin`, which every user can read.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use crate::harness::{Harness, Options};
use crate::support::{Sandbox, World, have, in_ci};

fn is_root() -> bool {
    nix::unistd::getuid().is_root()
}

/// Root's rustup toolchain, when this user can use it.
fn root_rust() -> Option<(PathBuf, PathBuf)> {
    let bin = PathBuf::from("/root/.cargo/bin");
    let rustup = PathBuf::from("/root/.rustup");
    if is_root() && bin.join("cargo").exists() && rustup.is_dir() {
        return Some((bin, rustup));
    }
    assert!(!(in_ci() && is_root()), "CI runs as root with rustup at /root/.rustup");
    None
}

// ---- mounts, PATH and variables -----------------------------------------------------------

#[test]
fn a_mounted_bin_dir_joins_path_read_only_at_the_mounts_root() {
    let sb = Sandbox::new("tools");
    let tool = sb.world.write_executable(
        sb.home().join(".local/bin/hello-tool"),
        "#!/bin/sh\necho hello-from-tool\n",
    );
    let run = sb
        .world
        .airlock(&sb.repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args(["exec", "--mount", "~/.local/bin", "--", "sh", "-c"])
        .args(["hello-tool; echo \"path=$PATH\"; echo planted > \"$(dirname \"$(command -v hello-tool)\")/x\" \
             && echo wrote || echo read-only"])
        .run()
        .expect_code(0);
    let out = run.stdout();
    let home = std::fs::canonicalize(sb.home()).unwrap();
    let inside =
        Path::new("/opt/airlock/mounts").join(home.strip_prefix("/").unwrap()).join(".local/bin");
    assert!(out.contains("hello-from-tool\n"), "{out}\n{}", run.stderr());
    assert!(out.contains(&format!("path={}:", inside.display())), "{out}");
    assert!(out.contains("read-only\n"), "{out}");
    assert!(!tool.with_file_name("x").exists());
}

#[test]
fn rustup_becomes_rustup_home_and_cargo_runs_inside() {
    let Some((bin, rustup)) = root_rust() else {
        // As another user root's toolchain is another user's home: the mount is refused.
        let sb = Sandbox::new("rustyref");
        refused(&sb, "/root/.cargo/bin", "/root");
        return;
    };
    let sb = Sandbox::new("rusty");
    let run = sb
        .world
        .airlock(&sb.repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args([
            "exec",
            "--mount",
            &format!("{}:ro", bin.display()),
            "--mount",
            &rustup.display().to_string(),
        ])
        .args([
            "--",
            "sh",
            "-c",
            "echo \"rh=$RUSTUP_HOME ch=$CARGO_HOME\"; cargo --version; rustc --version",
        ])
        .run()
        .expect_code(0);
    let out = run.stdout();
    assert!(out.contains("rh=/opt/airlock/mounts/root/.rustup ch=/home/agent/.cargo\n"), "{out}");
    assert!(out.contains("cargo 1."), "{out}\n{}", run.stderr());
    assert!(out.contains("rustc 1."), "{out}");
}

// ---- refusals -------------------------------------------------------------------------------

/// `--mount X -- touch marker` with the hold bridge: exit 125, the reason on stderr, nothing run.
fn refused(sb: &Sandbox, mount: &str, reason: &str) {
    let marker = sb.repo.join("ran");
    let run = sb
        .world
        .airlock(&sb.repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args(["exec", "--mount", mount, "--", "touch", "ran"])
        .run();
    assert_eq!(run.code(), 125, "{mount}: {}", run.stderr());
    assert!(run.stderr().contains(reason), "{mount}: want {reason:?} in {}", run.stderr());
    assert!(!marker.exists(), "{mount}: the command ran");
}

#[test]
fn secrets_sockets_browser_profiles_and_airlock_state_are_refused_with_the_reason() {
    let sb = Sandbox::new("refusals");
    let home = sb.home().to_path_buf();
    for d in
        [".ssh", ".aws", ".config/gh", ".mozilla/firefox", ".config/chromium/Default", "tools/bin"]
    {
        std::fs::create_dir_all(home.join(d)).unwrap();
    }
    sb.world.write(home.join(".ssh/id_ed25519"), "secret\n");
    refused(&sb, "~/.ssh", "is a credential store");
    refused(&sb, "~/.aws:ro", "is a credential store");
    refused(&sb, "~/.config", "contains a credential store");
    refused(&sb, "~/.mozilla/firefox", "lies under a browser profile");
    refused(&sb, "~/.config/chromium", "is a browser profile");
    refused(&sb, "~", "your home directory");
    refused(&sb, "~/.airlock", "Airlock's state");
    refused(&sb, "/etc", "a host system tree");
    refused(&sb, "/proc", "a host system tree");
    refused(&sb, "~/nope", "cannot be resolved");
    refused(&sb, "tools", "must be absolute or start with ~/");
    refused(&sb, "~/tools:/home/agent/tools", "which the sandbox itself provides");
    // A symlink to a store is judged by its target.
    std::os::unix::fs::symlink(home.join(".ssh"), home.join("innocent")).unwrap();
    refused(&sb, "~/innocent", "is a credential store");
    // A tree holding a unix socket, however deep: a read-only bind still allows connect().
    let deep = home.join("tools/share/run");
    std::fs::create_dir_all(&deep).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(deep.join("agent.sock")).unwrap();
    refused(&sb, "~/tools", "holds a unix socket");
    refused(&sb, "~/tools", "tools/share/run/agent.sock");
    // Another repo's cache and agent homes are Airlock's state too.
    std::fs::create_dir_all(home.join(".airlock/cache/other-12345678/cargo")).unwrap();
    refused(&sb, "~/.airlock/cache/other-12345678/cargo", "another repo's cache");
    std::fs::create_dir_all(home.join(".airlock/agent/claude/other-12345678")).unwrap();
    refused(&sb, "~/.airlock/agent/claude/other-12345678", "an agent home");
    if !is_root() {
        // As another user, root's toolchain is another user's home.
        refused(&sb, "/root/.cargo/bin", "/root");
    }
}

#[test]
fn rw_from_configuration_is_refused_at_its_location_and_the_command_line_warns() {
    let sb = Sandbox::new("rwcfg");
    std::fs::create_dir_all(sb.home().join("tools")).unwrap();
    let cfg = sb.home().join(".airlock/config.toml");
    sb.world.write(
        &cfg,
        "[network]\nallow = [\"example.test\"]\n[sandbox]\nmounts = [\"~/tools:rw\"]\n",
    );
    let run = sb.sh("touch ran");
    assert_eq!(run.code(), 125, "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("config.toml:4:11: [sandbox] mounts \"~/tools:rw\" refused"), "{err}");
    assert!(err.contains(":rw is never taken from configuration"), "{err}");
    assert!(!sb.repo.join("ran").exists());
    // From the command line it is the person's choice, with a warning.
    sb.world.write(&cfg, "[network]\nallow = [\"example.test\"]\n");
    let run = sb
        .world
        .airlock(&sb.repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args([
            "exec",
            "--mount",
            "~/tools:/opt/tools:rw",
            "--",
            "sh",
            "-c",
            "echo hi > /opt/tools/f",
        ])
        .run()
        .expect_code(0);
    assert!(run.stderr().contains("the tree becomes agent-written"), "{}", run.stderr());
    assert_eq!(std::fs::read_to_string(sb.home().join("tools/f")).unwrap(), "hi\n");
}

#[test]
fn repo_layer_mounts_apply_only_after_trust_and_are_called_out() {
    let sb = Sandbox::new("repomount");
    sb.world
        .write_executable(sb.repo.join("../shared-tools/bin/st"), "#!/bin/sh\necho shared-tool\n");
    let tools = std::fs::canonicalize(sb.repo.join("../shared-tools")).unwrap();
    sb.world.write(
        sb.repo.join(".airlock.toml"),
        &format!("[sandbox]\nmounts = [\"{}\"]\n", tools.display()),
    );
    // Untrusted, non-interactive: refused, nothing mounted or run.
    let run = sb.sh("st");
    assert_eq!(run.code(), 125, "{}", run.stderr());
    assert!(run.stderr().contains("not trusted"), "{}", run.stderr());
    sb.trust();
    let run = sb.sh("st").expect_code(0);
    assert_eq!(run.stdout(), "shared-tool\n", "{}", run.stderr());
}

// ---- working directory ------------------------------------------------------------------------

#[test]
fn the_working_directory_follows_the_callers_and_workdir_chooses() {
    let sb = Sandbox::new("wd");
    std::fs::create_dir_all(sb.repo.join("sub/deep")).unwrap();
    let exec = |cwd: &Path, extra: &[&str], script: &str| {
        sb.world
            .airlock(cwd)
            .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
            .args(["exec", "--repo", sb.repo.to_str().unwrap()])
            .args(extra)
            .args(["--", "sh", "-c", script])
            .run()
    };
    let run = exec(&sb.repo.join("sub"), &[], "pwd; touch made-here").expect_code(0);
    assert_eq!(run.stdout(), "/wd/sub\n", "{}", run.stderr());
    assert!(sb.repo.join("sub/made-here").exists());
    let run = exec(&sb.repo, &["-w", "sub/deep"], "pwd").expect_code(0);
    assert_eq!(run.stdout(), "/wd/sub/deep\n");
    let run = exec(&sb.repo.join("sub"), &["--workdir", ".."], "pwd").expect_code(0);
    assert_eq!(run.stdout(), "/wd\n");
    // Outside the repo: the current directory falls back to the root; -w is refused.
    let run = exec(sb.home(), &[], "pwd").expect_code(0);
    assert_eq!(run.stdout(), "/wd\n");
    let run = exec(&sb.repo, &["-w", sb.home().to_str().unwrap()], "touch ran");
    assert_eq!(run.code(), 125);
    assert!(run.stderr().contains("is outside the repo"), "{}", run.stderr());
    let run = exec(&sb.repo, &["-w", "missing"], "true");
    assert_eq!(run.code(), 125);
    assert!(
        run.stderr().contains("pass an existing directory inside the repo"),
        "{}",
        run.stderr()
    );
}

// ---- caches -----------------------------------------------------------------------------------

#[test]
fn each_repo_gets_its_own_writable_cache_and_never_sees_anothers() {
    let world = World::new();
    let a = world.repo("cache-a");
    let b = world.repo("cache-b");
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n[sandbox]\ncache = [\"npm\", \"pip\", \"cargo\"]\n",
    );
    let exec = |repo: &Path, script: &str| {
        world
            .airlock(repo)
            .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
            .args(["exec", "--", "sh", "-c", script])
            .run()
            .expect_code(0)
    };
    let run = exec(
        &a,
        "echo \"$npm_config_cache $PIP_CACHE_DIR $CARGO_HOME\"; echo from-a > $npm_config_cache/mark",
    );
    assert_eq!(
        run.stdout(),
        "/opt/airlock/cache/npm /opt/airlock/cache/pip /opt/airlock/cache/cargo\n",
        "{}",
        run.stderr()
    );
    let run = exec(&a, "cat $npm_config_cache/mark");
    assert_eq!(run.stdout(), "from-a\n", "kept across sessions of one repo");
    let run = exec(&b, "cat $npm_config_cache/mark 2>&1 || echo absent; ls /opt/airlock/cache");
    assert!(
        run.stdout().starts_with("cat: ") || run.stdout().contains("absent"),
        "{}",
        run.stdout()
    );
    assert!(!run.stdout().contains("from-a"), "{}", run.stdout());
    let caches: Vec<String> = std::fs::read_dir(world.home.join(".airlock/cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(caches.len(), 2, "{caches:?}");
    assert!(
        caches.iter().any(|c| c.starts_with("cache-a-"))
            && caches.iter().any(|c| c.starts_with("cache-b-"))
    );
}

/// Two steps: a session plants cargo configuration in its cargo cache (its `CARGO_HOME`); the
/// host's own `cargo`, run afterwards in the repo, never reads it.
#[test]
fn cargo_config_planted_in_the_cache_is_not_read_by_the_host_cargo() {
    let Some((bin, rustup)) = root_rust() else {
        eprintln!("SKIP: root's rustup toolchain is not usable by this user");
        return;
    };
    let world = World::new();
    let repo = world.repo("plant");
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n[sandbox]\ncache = [\"cargo\"]\n",
    );
    world
        .airlock(&repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args(["exec", "--", "sh", "-c"])
        .args(["printf '[alias]\\nplanted = \"version\"\\n[build]\\nrustc-wrapper = \"/bin/false\"\\n' > $CARGO_HOME/config.toml"])
        .run()
        .expect_code(0);
    // The host's cargo, as the developer runs it: their HOME, their rustup.
    let host_cargo = std::process::Command::new(bin.join("cargo"))
        .current_dir(&repo)
        .env_clear()
        .env("HOME", &world.home)
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("RUSTUP_HOME", &rustup)
        .arg("planted")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&host_cargo.stderr);
    assert!(!host_cargo.status.success(), "the host cargo ran the planted alias");
    assert!(err.contains("no such command"), "{err}");
    // It stays where the session wrote it: this repo's cargo cache.
    let planted: Vec<PathBuf> = std::fs::read_dir(world.home.join(".airlock/cache"))
        .unwrap()
        .map(|e| e.unwrap().path().join("cargo/config.toml"))
        .collect();
    assert!(planted.len() == 1 && planted[0].exists(), "{planted:?}");
}

/// Two steps for the caches every user can drive: a session plants an `.npmrc` and a `pip.conf`
/// in its npm and pip caches; the host's `npm` and `pip`, run afterwards in the repo, never
/// read them (the registry and index stay the defaults).
#[test]
fn npm_and_pip_config_planted_in_the_caches_is_not_read_by_the_host_tools() {
    if !have("npm") || !have("python3") {
        return;
    }
    let world = World::new();
    let repo = world.repo("plant2");
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n[sandbox]\ncache = [\"npm\", \"pip\"]\n",
    );
    world
        .airlock(&repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args(["exec", "--", "sh", "-c"])
        .args([
            "echo registry=http://planted.test/ > $npm_config_cache/.npmrc; \
             echo registry=http://planted.test/ > $npm_config_cache/npmrc; \
             printf '[global]\\nindex-url = http://planted.test/simple\\n' > $PIP_CACHE_DIR/pip.conf",
        ])
        .run()
        .expect_code(0);
    let host_tool = |cmd: &str, args: &[&str]| {
        let out = std::process::Command::new(cmd)
            .args(args)
            .current_dir(&repo)
            .env_clear()
            .env("HOME", &world.home)
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let npm = host_tool("/usr/bin/npm", &["config", "get", "registry"]);
    assert!(!npm.contains("planted.test"), "the host npm read the planted config: {npm}");
    assert!(npm.contains("registry.npmjs.org"), "{npm}");
    let pip = host_tool("/usr/bin/python3", &["-m", "pip", "config", "list"]);
    assert!(!pip.contains("planted.test"), "the host pip read the planted config: {pip}");
    let cache = std::fs::read_dir(world.home.join(".airlock/cache"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(cache.join("npm/.npmrc").exists() && cache.join("pip/pip.conf").exists());
}

#[test]
fn doctor_prints_the_exact_mounts_line_for_toolchains_under_the_home() {
    let world = World::new();
    let repo = world.repo("doc");
    for d in [".cargo/bin", ".rustup", ".local/bin"] {
        std::fs::create_dir_all(world.home.join(d)).unwrap();
    }
    let path = format!(
        "{}:{}:/usr/bin:/bin",
        world.home.join(".cargo/bin").display(),
        world.home.join(".local/bin").display()
    );
    let run = world.airlock(&repo).env("PATH", &path).args(["doctor"]).run();
    let out = run.stdout();
    assert!(
        out.contains(r#"mounts = ["~/.cargo/bin:ro", "~/.rustup:ro"] and, for faster builds, cache = ["cargo"]"#),
        "{out}"
    );
    assert!(out.contains(r#"mounts = ["~/.local/bin:ro"]"#), "{out}");
    assert!(out.contains(r#"all of them at once: [sandbox] mounts = ["~/.cargo/bin:ro", "~/.rustup:ro", "~/.local/bin:ro"]"#), "{out}");
    // Once configured, the toolchain is reported as mounted, and the line works.
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n[sandbox]\nmounts = [\"~/.local/bin:ro\"]\n",
    );
    let out = world.airlock(&repo).env("PATH", &path).args(["doctor"]).run().stdout();
    assert!(out.contains("tools (~/.local/bin) is mounted"), "{out}");
    world.write_executable(world.home.join(".local/bin/mytool"), "#!/bin/sh\necho mytool-ran\n");
    let run = world
        .airlock(&repo)
        .hook("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
        .args(["exec", "--", "mytool"])
        .run()
        .expect_code(0);
    assert_eq!(run.stdout(), "mytool-ran\n");
}

// ---- real builds through the proxy ------------------------------------------------------------

/// A static file server on `ip` for `root`: GET of absolute-form (proxied) or origin-form
/// targets; 404 otherwise.
fn file_server(ip: &str, root: PathBuf) -> u16 {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let root = root.clone();
            std::thread::spawn(move || {
                let mut req = Vec::new();
                let mut buf = [0u8; 8192];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let req = String::from_utf8_lossy(&req).into_owned();
                let target = req.split(' ').nth(1).unwrap_or("/");
                let path = target
                    .split_once("://")
                    .map_or(target, |(_, rest)| rest.find('/').map_or("/", |i| &rest[i..]));
                let path = path.split('?').next().unwrap_or("/");
                let mut file = root.join(path.trim_start_matches('/'));
                if file.is_dir() {
                    file = file.join("index.html");
                }
                match (path.contains(".."), std::fs::read(&file)) {
                    (false, Ok(body)) => {
                        // PEP 503 pages must say they are HTML; everything else is bytes.
                        // Cacheable, so pip's HTTP cache keeps what it fetched.
                        let kind = if file.extension().is_some_and(|e| e == "html") {
                            "text/html"
                        } else {
                            "application/octet-stream"
                        };
                        let _ = write!(
                            c,
                            "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                             Cache-Control: max-age=600\r\nConnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = c.write_all(&body);
                    }
                    _ => {
                        let _ = c.write_all(
                            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                    }
                }
            });
        }
    });
    port
}

fn host(cmd: &str, args: &[&str], cwd: &Path) -> String {
    let out = std::process::Command::new(cmd).args(args).current_dir(cwd).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A world with the daemon harness, `registry.test` mapped to 127.0.0.2 and allowed on the
/// served port only.
struct Registry {
    world: World,
    repo: PathBuf,
    served: PathBuf,
    port: u16,
    harness: Harness,
}

fn registry(name: &str, cache: &str) -> Registry {
    let world = World::new();
    let repo = world.repo(name);
    let served = world.tmp.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let port = file_server("127.0.0.2", served.clone());
    let resolver = world.write(world.tmp.path().join("resolver"), "registry.test 127.0.0.2\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"registry.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n\
             [sandbox]\ncache = [\"{cache}\"]\n"
        ),
    );
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let harness = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    Registry { world, repo, served, port, harness }
}

impl Registry {
    fn exec(&self, extra: &[String], script: &str) -> crate::support::Run {
        let run = self
            .world
            .airlock(&self.repo)
            .env("AIRLOCK_SOCKET", self.harness.socket())
            .args(["exec"])
            .args(extra)
            .args(["--", "sh", "-c", script])
            .run();
        if run.code() != 0 {
            eprintln!("--- airlockd log\n{}", self.harness.log());
        }
        run
    }

    /// The session's audit lines: every one allowed, for the registry, and at least one.
    fn assert_audited(&self, repo: &str) {
        let lines = self.world.audit_lines(repo);
        assert!(!lines.is_empty(), "no audit lines");
        for l in &lines {
            assert_eq!(l["host"], "registry.test", "{l}");
            assert_eq!(l["allowed"], true, "{l}");
        }
    }

    fn cache_dir(&self, kind: &str) -> PathBuf {
        let entries: Vec<PathBuf> = std::fs::read_dir(self.world.home.join(".airlock/cache"))
            .unwrap()
            .map(|e| e.unwrap().path().join(kind))
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        entries[0].clone()
    }
}

fn py_digest(file: &Path, how: &str) -> String {
    let code = match how {
        "sha256" => {
            "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())"
        }
        _ => {
            "import hashlib,base64,sys; print('sha512-'+base64.b64encode(hashlib.sha512(open(sys.argv[1],'rb').read()).digest()).decode())"
        }
    };
    host("python3", &["-c", code, file.to_str().unwrap()], Path::new("/")).trim().to_string()
}

#[test]
fn npm_ci_installs_from_a_loopback_registry_through_the_proxy_into_the_npm_cache() {
    if !have("node") || !have("npm") || !have("tar") || !have("python3") {
        return;
    }
    let r = registry("npmapp", "npm");
    // The package: a tarball of package/, its packument, and a lockfile naming it.
    let pkg = r.world.tmp.path().join("pkg/package");
    r.world.write(
        pkg.join("package.json"),
        "{\"name\":\"tiny\",\"version\":\"1.0.0\",\"main\":\"index.js\"}\n",
    );
    r.world.write(pkg.join("index.js"), "module.exports = 'tiny-from-loopback';\n");
    std::fs::create_dir_all(r.served.join("tiny/-")).unwrap();
    let tgz = r.served.join("tiny/-/tiny-1.0.0.tgz");
    host("tar", &["czf", tgz.to_str().unwrap(), "package"], pkg.parent().unwrap());
    let integrity = py_digest(&tgz, "sha512");
    let url = format!("http://registry.test:{}/tiny/-/tiny-1.0.0.tgz", r.port);
    r.world.write(
        r.served.join("tiny/index.html"),
        &format!(
            "{{\"name\":\"tiny\",\"dist-tags\":{{\"latest\":\"1.0.0\"}},\"versions\":{{\"1.0.0\":{{\"name\":\"tiny\",\"version\":\"1.0.0\",\"dist\":{{\"tarball\":\"{url}\",\"integrity\":\"{integrity}\"}}}}}}}}\n"
        ),
    );
    r.world.write(
        r.repo.join("package.json"),
        "{\"name\":\"app\",\"version\":\"1.0.0\",\"dependencies\":{\"tiny\":\"1.0.0\"}}\n",
    );
    r.world.write(
        r.repo.join("package-lock.json"),
        &format!(
            "{{\"name\":\"app\",\"version\":\"1.0.0\",\"lockfileVersion\":3,\"requires\":true,\"packages\":{{\
             \"\":{{\"name\":\"app\",\"version\":\"1.0.0\",\"dependencies\":{{\"tiny\":\"1.0.0\"}}}},\
             \"node_modules/tiny\":{{\"version\":\"1.0.0\",\"resolved\":\"{url}\",\"integrity\":\"{integrity}\"}}}}}}\n"
        ),
    );
    r.world.write(
        r.repo.join(".npmrc"),
        &format!(
            "registry=http://registry.test:{}/\naudit=false\nfund=false\nupdate-notifier=false\n",
            r.port
        ),
    );
    let run = r.exec(&[], "npm ci --no-progress && node -e \"console.log(require('tiny'))\"");
    assert_eq!(run.code(), 0, "{}\n{}", run.stdout(), run.stderr());
    assert!(run.stdout().contains("tiny-from-loopback"), "{}", run.stdout());
    assert!(r.repo.join("node_modules/tiny/index.js").exists());
    // The download landed in this repo's npm cache (the host's ~/.npm was never touched).
    let cache = r.cache_dir("npm");
    assert!(cache.join("_cacache").is_dir(), "{}", cache.display());
    assert!(!r.world.home.join(".npm").exists());
    r.assert_audited("npmapp");
}

#[test]
fn pip_installs_from_a_loopback_simple_index_through_the_proxy_into_the_pip_cache() {
    if !have("python3") {
        return;
    }
    let pip =
        std::process::Command::new("/usr/bin/python3").args(["-m", "pip", "--version"]).output();
    if !pip.is_ok_and(|o| o.status.success()) {
        assert!(!in_ci(), "prerequisite: /usr/bin/python3 -m pip (python3-pip) missing in CI");
        eprintln!("SKIP: /usr/bin/python3 has no pip");
        return;
    }
    let r = registry("pipapp", "pip");
    // A pure-Python wheel made here, with a correct RECORD.
    let files = r.served.join("files");
    std::fs::create_dir_all(&files).unwrap();
    let wheel = files.join("tinyp-1.0-py3-none-any.whl");
    let make = "import sys,zipfile,hashlib,base64\n\
        out=sys.argv[1]\n\
        items={'tinyp/__init__.py':b\"WORD='tinyp-from-loopback'\\n\",\n\
         'tinyp-1.0.dist-info/METADATA':b'Metadata-Version: 2.1\\nName: tinyp\\nVersion: 1.0\\n',\n\
         'tinyp-1.0.dist-info/WHEEL':b'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'}\n\
        rec=''.join('%s,sha256=%s,%d\\n'%(n,base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode(),len(d)) for n,d in items.items())\n\
        rec+='tinyp-1.0.dist-info/RECORD,,\\n'\n\
        z=zipfile.ZipFile(out,'w')\n\
        [z.writestr(n,d) for n,d in items.items()]\n\
        z.writestr('tinyp-1.0.dist-info/RECORD',rec)\n\
        z.close()\n";
    host("python3", &["-c", make, wheel.to_str().unwrap()], Path::new("/"));
    let sha = py_digest(&wheel, "sha256");
    r.world.write(
        r.served.join("simple/tinyp/index.html"),
        &format!(
            "<!DOCTYPE html><html><body><a href=\"http://registry.test:{}/files/tinyp-1.0-py3-none-any.whl#sha256={sha}\">tinyp-1.0-py3-none-any.whl</a></body></html>\n",
            r.port
        ),
    );
    let script = format!(
        "/usr/bin/python3 -m pip install --no-input --disable-pip-version-check \
         --index-url http://registry.test:{port}/simple/ --trusted-host registry.test \
         --target vendor tinyp && PYTHONPATH=vendor /usr/bin/python3 -c 'import tinyp; print(tinyp.WORD)'",
        port = r.port
    );
    let run = r.exec(&[], &script);
    assert_eq!(run.code(), 0, "{}\n{}", run.stdout(), run.stderr());
    assert!(run.stdout().contains("tinyp-from-loopback"), "{}", run.stdout());
    let cache = r.cache_dir("pip");
    assert!(
        std::fs::read_dir(&cache).unwrap().next().is_some(),
        "pip cache empty: {}",
        cache.display()
    );
    r.assert_audited("pipapp");
}

#[test]
fn cargo_builds_a_crate_with_a_dependency_from_a_loopback_sparse_registry() {
    let Some((bin, rustup)) = root_rust() else {
        // As another user root's toolchain is another user's home: the mount is refused.
        let sb = Sandbox::new("cargoref");
        refused(&sb, "/root/.rustup", "/root");
        return;
    };
    let r = registry("cargoapp", "cargo");
    // The dependency, packaged by the host's cargo.
    let dep = r.world.tmp.path().join("dep");
    r.world.write(
        dep.join("Cargo.toml"),
        "[package]\nname = \"dep\"\nversion = \"0.1.0\"\nedition = \"2021\"\ndescription = \"t\"\nlicense = \"MIT\"\n",
    );
    r.world
        .write(dep.join("src/lib.rs"), "pub fn word() -> &'static str { \"dep-from-loopback\" }\n");
    let out = std::process::Command::new(bin.join("cargo"))
        .args(["package", "--no-verify", "--allow-dirty", "--quiet"])
        .current_dir(&dep)
        .env("RUSTUP_HOME", &rustup)
        .env("CARGO_HOME", r.world.tmp.path().join("host-cargo-home"))
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo package: {}", String::from_utf8_lossy(&out.stderr));
    let krate = dep.join("target/package/dep-0.1.0.crate");
    let cksum = py_digest(&krate, "sha256");
    std::fs::create_dir_all(r.served.join("dl")).unwrap();
    std::fs::copy(&krate, r.served.join("dl/dep-0.1.0.crate")).unwrap();
    // The sparse index (Cargo book, "Registry Index"): config.json and 3/d/dep.
    r.world.write(
        r.served.join("config.json"),
        &format!("{{\"dl\":\"http://registry.test:{}/dl/{{crate}}-{{version}}.crate\"}}\n", r.port),
    );
    r.world.write(
        r.served.join("3/d/dep"),
        &format!(
            "{{\"name\":\"dep\",\"vers\":\"0.1.0\",\"deps\":[],\"cksum\":\"{cksum}\",\"features\":{{}},\"yanked\":false}}\n"
        ),
    );
    r.world.write(
        r.repo.join("Cargo.toml"),
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\ndep = \"0.1\"\n",
    );
    r.world.write(r.repo.join("src/main.rs"), "fn main() { println!(\"{}\", dep::word()); }\n");
    r.world.write(
        r.repo.join(".cargo/config.toml"),
        &format!(
            "[source.crates-io]\nreplace-with = \"loopback\"\n[source.loopback]\nregistry = \"sparse+http://registry.test:{}/\"\n",
            r.port
        ),
    );
    let mounts = vec![
        "--mount".to_string(),
        format!("{}:ro", bin.display()),
        "--mount".to_string(),
        format!("{}:ro", rustup.display()),
    ];
    let run = r.exec(&mounts, "cargo run --quiet");
    assert_eq!(run.code(), 0, "{}\n{}", run.stdout(), run.stderr());
    assert_eq!(run.stdout(), "dep-from-loopback\n");
    // Downloads went to this repo's cargo cache (CARGO_HOME inside), not the host's.
    let cache = r.cache_dir("cargo");
    assert!(cache.join("registry").is_dir(), "{}", cache.display());
    assert!(r.repo.join("target").is_dir());
    r.assert_audited("cargoapp");
}
