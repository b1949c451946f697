//! Security: the review-plane token never enters a session (issue 16; SECURITY §5). After a
//! real `airlock login --server`, a real `airlock exec` session and an `airlock run` session
//! (a stand-in agent with its agent home) each search everything they can read for the
//! token: every readable regular file under `/` (outside `/proc` and `/sys`), the environment, `/proc/self/{environ,cmdline,maps,mountinfo,status}` and the `environ` and
//! `cmdline` of every process it can see. The token is handed to the search reversed (so it
//! is in no argv, environment or file the test made), and a canary planted in the repo must be
//! found, which shows the search reads what it claims to. On the host, `airlockd` (the
//! session daemon) never holds the token: not in its environment or argv, not in any log.
//! Runs as root and, under `.ci/unprivileged`, as an unprivileged user.

use std::path::Path;

use crate::harness::{Harness, Options};
use crate::review_support::{Server, StoreSel, user_with_token};
use crate::support::{World, bin, have};

/// Runs inside: argv[1] and argv[2] are the token and the canary, reversed. Prints one
/// `HIT <name> <where>` line per place a needle was found, then `SEARCHED <n> files`.
const SEARCH: &str = r#"
import os, subprocess, sys, tempfile
needles = {"token": sys.argv[1][::-1].encode(), "canary": sys.argv[2][::-1].encode()}
hits = []
def check(where, data):
    for name, n in needles.items():
        if n in data:
            hits.append((name, where))
for k, v in os.environb.items():
    check("env:" + k.decode(errors="replace"), k + b"=" + v)
procs = ["/proc/self/" + f for f in ("environ", "cmdline", "maps", "mountinfo", "status")]
for p in os.listdir("/proc"):
    if p.isdigit():
        procs += ["/proc/%s/environ" % p, "/proc/%s/cmdline" % p]
for path in procs:
    try:
        with open(path, "rb") as f:
            check(path, f.read())
    except OSError:
        pass
# Files: grep reads them (fast); the needle file is the one file excluded, by a random name.
d = tempfile.mkdtemp()
name = "needles-" + os.urandom(8).hex()
with open(os.path.join(d, name), "wb") as f:
    f.write(b"\n".join(needles.values()) + b"\n")
tops = [os.path.join("/", e) for e in os.listdir("/")
        if e not in ("proc", "sys") and not os.path.islink(os.path.join("/", e))]
r = subprocess.run(["grep", "-rlsF", "--binary-files=text", "--devices=skip",
                    "--exclude=" + name, "-f", os.path.join(d, name)] + tops,
                   stdout=subprocess.PIPE)
for path in r.stdout.decode(errors="replace").splitlines():
    try:
        with open(path, "rb") as f:
            check(path, f.read())
    except OSError as e:
        hits.append(("unreadable-hit", path + ": " + str(e)))
n = int(subprocess.run("find / \\( -path /proc -o -path /sys \\) -prune -o -type f -print "
                       "2>/dev/null | wc -l", shell=True, stdout=subprocess.PIPE).stdout)
for name, where in hits:
    print("HIT", name, where)
print("SEARCHED", n, "files")
"#;

fn rand_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).unwrap();
    hex::encode(b)
}

fn reversed(s: &str) -> String {
    s.chars().rev().collect()
}

/// Every process on the host running `exe`: its pid.
fn pids_of(exe: &Path) -> Vec<String> {
    let want = std::fs::canonicalize(exe).unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter(|e| std::fs::read_link(e.path().join("exe")).is_ok_and(|p| p == want))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Every regular file under `dir` (recursively) that holds `needle`, except `skip`.
fn files_holding(dir: &Path, needle: &[u8], skip: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            out.extend(files_holding(&p, needle, skip));
        } else if ft.is_file()
            && p != skip
            && std::fs::read(&p).is_ok_and(|d| d.windows(needle.len()).any(|w| w == needle))
        {
            out.push(p.display().to_string());
        }
    }
    out
}

#[test]
fn the_token_is_nowhere_a_session_can_read() {
    if !have("python3") || !have("grep") || !have("find") {
        return;
    }
    let world = World::new();
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let token = user_with_token(&world, &store, "dev@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    let mut child = std::process::Command::new(bin("airlock"))
        .current_dir(world.tmp.path())
        .env_clear()
        .env("HOME", &world.home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["login", "--server", &server.base, "--token-stdin"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), format!("{token}\n").as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "login failed");
    let token_file = world.home.join(".airlock/token");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim_end(), token);

    let repo = world.repo("app");
    let canary = format!("canary-{}", rand_hex(16));
    world.write(repo.join("notes/canary.txt"), &format!("{canary}\n"));
    // A stand-in `claude` (runs its argument as a script), for an `airlock run` session with
    // an agent home and the shared agent store.
    let fakebin = world.home.join(".local/bin");
    world.write_executable(fakebin.join("claude"), "#!/bin/sh\nexec /bin/sh -c \"$1\"\n");
    let h = Harness::start(&world, Options::default());
    // A background process, so the session sees more than the search's own processes.
    let script = format!(
        // The search's status is the session's (a slow search outliving the sleep made
        // `kill` fail the session once).
        "sleep 600 & python3 -c '{}' {} {}; rc=$?; kill $! 2>/dev/null; exit $rc",
        SEARCH.replace('\'', "'\\''"),
        reversed(&token),
        reversed(&canary)
    );
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", fakebin.display());
    for (what, args) in [
        ("airlock exec", vec!["exec", "--", "sh", "-c", script.as_str()]),
        ("airlock run claude", vec!["run", "claude", "--", script.as_str()]),
    ] {
        let run = world
            .airlock(&repo)
            .env("AIRLOCK_SOCKET", h.socket())
            .env("PATH", &path)
            .args(&args)
            .run();
        assert_eq!(run.code(), 0, "{what}: {}\n{}\n{}", run.stdout(), run.stderr(), h.log());
        let out = run.stdout();
        eprintln!("{what}:\n{out}");
        let hits: Vec<&str> = out.lines().filter(|l| l.starts_with("HIT ")).collect();
        // The search works: it finds the canary in the repo.
        assert!(
            hits.iter().any(|l| l.starts_with("HIT canary ") && l.ends_with("/notes/canary.txt")),
            "{what}: the canary was not found, so the search proves nothing:\n{out}"
        );
        let searched: usize = out
            .lines()
            .find_map(|l| l.strip_prefix("SEARCHED ")?.strip_suffix(" files")?.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no SEARCHED line:\n{out}\n{}", run.stderr()));
        assert!(searched > 100, "{what}: only {searched} files visible?\n{out}");
        let leaks: Vec<&&str> = hits.iter().filter(|l| !l.starts_with("HIT canary ")).collect();
        assert!(leaks.is_empty(), "{what}: the token is readable inside the session: {leaks:#?}");
    }

    // On the host: the session daemon never holds the token (environment, argv), and no file
    // under ~/.airlock but the token file (logs, session records, daemon log) holds it.
    let pids = pids_of(&bin("airlockd"));
    assert!(!pids.is_empty(), "no airlockd process found");
    for pid in pids {
        for f in ["environ", "cmdline"] {
            let data = std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
            let found = data.windows(token.len()).any(|w| w == token.as_bytes());
            assert!(!found, "airlockd (pid {pid}) has the token in its {f}");
        }
    }
    let holding = files_holding(&world.home.join(".airlock"), token.as_bytes(), &token_file);
    assert!(holding.is_empty(), "files on the host holding the token: {holding:?}");
    let holding = files_holding(h.dir.path(), token.as_bytes(), &token_file);
    assert!(holding.is_empty(), "harness files holding the token: {holding:?}");
}
