//! Session audit roots (issue 19, docs/evidence.md): a real `airlock exec` session through the
//! real daemon makes allowed and refused requests to a loopback upstream; its end record
//! carries `audit_root`, the RFC 9162 root over exactly its audit lines (recomputed here
//! independently of the crate), signed with this machine's key; `airlock verify --local`
//! accepts the untouched files and names the session when a line is changed by one byte,
//! removed, or appended by hand. Every connection goes to 127.0.0.2.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::harness::{Harness, Options};
use crate::support::{World, have, http_upstream, wait_until};

/// RFC 9162 §2.1.1 `MTH` over leaf hashes, written here from the RFC, not from the crate.
fn mth(leaves: &[[u8; 32]]) -> [u8; 32] {
    match leaves.len() {
        0 => Sha256::digest([]).into(),
        1 => leaves[0],
        n => {
            let mut k = 1;
            while k * 2 < n {
                k *= 2;
            }
            let mut h = Sha256::new();
            h.update([1u8]);
            h.update(mth(&leaves[..k]));
            h.update(mth(&leaves[k..]));
            h.finalize().into()
        }
    }
}

/// The session's audit lines as written (without newlines), from every audit file.
fn session_lines(dir: &Path, session: &str) -> Vec<(PathBuf, String)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("audit-"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        for l in std::fs::read_to_string(&f).unwrap().lines() {
            let v: Value = serde_json::from_str(l).unwrap();
            if v["session"] == session {
                out.push((f.clone(), l.to_owned()));
            }
        }
    }
    out
}

fn verify(world: &World, repo: &Path) -> (i32, String, String) {
    let run = world.airlock(repo).args(["verify", "--local"]).run();
    (run.code(), run.stdout(), run.stderr())
}

/// Rewrites `file` with `f` applied to its lines.
fn edit(file: &Path, f: impl FnOnce(&mut Vec<String>)) {
    let mut lines: Vec<String> =
        std::fs::read_to_string(file).unwrap().lines().map(str::to_owned).collect();
    f(&mut lines);
    std::fs::write(file, lines.join("\n") + "\n").unwrap();
}

#[test]
fn a_sessions_end_record_roots_its_lines_and_verify_local_names_any_edit() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    let repo = world.repo("rooted");
    let (port, hits) = http_upstream("127.0.0.2", "upstream-ok\n");
    let resolver = world.write(
        world.tmp.path().join("resolver"),
        "allowed.test 127.0.0.2\nrefused.test 127.0.0.2\n",
    );
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"allowed.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n"
        ),
    );
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    let script = format!(
        "echo \"a:$(curl -sS -m 10 http://allowed.test:{port}/)\"\n\
         echo \"b:$(curl -sS -m 10 http://allowed.test:{port}/again)\"\n\
         curl -sS -m 10 -o /dev/null http://refused.test:{port}/; echo \"denied:$?\"\n\
         curl -sS -m 10 -o /dev/null https://refused.test:{port}/ 2>/dev/null; echo \"connect:$?\"\n"
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--", "sh", "-c", &script])
        .run();
    let out = run.stdout();
    assert_eq!(run.code(), 0, "{out}\n{}\n--- airlockd log\n{}", run.stderr(), h.log());
    assert!(out.contains("a:upstream-ok\n") && out.contains("b:upstream-ok\n"), "{out}");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 2, "nothing refused was dialed");

    // The end record's root is the RFC 9162 root of exactly the session's lines, in (boot,
    // seq, leaf hash) order, and its note is signed by this machine's key.
    let dir = world.home.join(".airlock/logs/rooted");
    let records = world.session_records("rooted");
    let end = records.iter().find(|r| r["kind"] == "end").expect("an end record");
    let session = end["session"].as_str().unwrap().to_owned();
    let root = &end["audit_root"];
    assert!(end.get("audit_root_error").is_none(), "{end}");
    let lines = session_lines(&dir, &session);
    assert!(lines.len() >= 4, "two allowed and two refused attempts: {lines:?}");
    let mut leaves: Vec<(String, u64, [u8; 32])> = lines
        .iter()
        .map(|(_, l)| {
            let v: Value = serde_json::from_str(l).unwrap();
            let mut h = Sha256::new();
            h.update([0u8]);
            h.update(l.as_bytes());
            (
                v["boot"].as_str().unwrap().to_owned(),
                v["seq"].as_u64().unwrap(),
                h.finalize().into(),
            )
        })
        .collect();
    leaves.sort();
    let want = mth(&leaves.iter().map(|x| x.2).collect::<Vec<_>>());
    let b64 = base64::engine::general_purpose::STANDARD.encode(want);
    assert_eq!(root["lines"], lines.len() as u64, "{root}");
    assert_eq!(root["hash"], b64.as_str(), "{root}");
    let note = root["note"].as_str().unwrap();
    let text =
        format!("airlock-audit/v1\nsession {session}\nlines {}\nroot {b64}\n\n", lines.len());
    assert!(note.starts_with(&text), "{note:?}");
    let key = airlock::tlog::note::NoteVerifier::parse(root["key"].as_str().unwrap()).unwrap();
    airlock::tlog::note::Note::parse(note).unwrap().verify(&key).unwrap();
    let machine = std::fs::read_to_string(world.home.join(".airlock/keys/machine.key")).unwrap();
    let machine = airlock::tlog::note::NoteSigner::parse(&machine).unwrap();
    assert_eq!(machine.verifier(), key, "signed with this machine's key");

    // Untouched: all good, text and JSON.
    let (code, out, err) = verify(&world, &repo);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(&format!("session {session}: {} lines match", lines.len())), "{out}");
    let json = world.airlock(&repo).args(["verify", "--local", "--json"]).run();
    assert_eq!(json.code(), 0, "{}", json.stderr());
    let report: Value = serde_json::from_str(&json.stdout()).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["machine_key"], root["key"], "{report}");
    assert_eq!(report["dirs"][0]["sessions"][0]["status"], "ok", "{report}");

    let (file, refused) = lines.iter().find(|(_, l)| l.contains("refused.test")).unwrap().clone();
    let pristine = std::fs::read(&file).unwrap();
    let restore = || {
        std::fs::write(&file, &pristine).unwrap();
        assert_eq!(verify(&world, &repo).0, 0, "restored");
    };
    let failed = |what: &str| {
        let (code, out, err) = verify(&world, &repo);
        assert_eq!(code, 1, "{what}: {out}\n{err}");
        assert!(out.contains(&format!("FAILED  rooted: session {session}: ")), "{what}: {out}");
        out
    };

    // One byte of one line changed.
    edit(&file, |ls| {
        let i = ls.iter().position(|l| *l == refused).unwrap();
        ls[i] = ls[i].replacen("refused.test", "refused.tesT", 1);
    });
    let out = failed("one byte changed");
    assert!(out.contains("do not hash to the signed root: a line was changed"), "{out}");
    restore();

    // One line removed: the count differs, and its seq is missing.
    let seq = serde_json::from_str::<Value>(&refused).unwrap()["seq"].as_u64().unwrap();
    edit(&file, |ls| ls.retain(|l| *l != refused));
    let out = failed("a line removed");
    assert!(out.contains("lines were removed"), "{out}");
    let max = leaves.iter().map(|x| x.1).max().unwrap();
    if seq < max {
        assert!(out.contains(&format!("seq {seq} missing")), "{out}");
    }
    restore();

    // A line appended by hand: a copy with the next seq and its own id.
    edit(&file, |ls| {
        let forged = refused
            .replace(&format!("\"seq\":{seq}"), &format!("\"seq\":{}", max + 1))
            .replacen("\"id\":\"", "\"id\":\"x", 1);
        ls.push(forged);
    });
    let out = failed("a line appended");
    assert!(out.contains("lines were added"), "{out}");
    restore();
}

/// A listener on `ip` that accepts connections and holds them open without a byte either way:
/// its port.
fn silent_upstream(ip: &str) -> u16 {
    let l = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming().flatten() {
            held.push(c);
        }
    });
    port
}

/// A tunnel still open when the session's command exits (its upstream never answers nor
/// closes) gets its line when the proxy's drain closes it; the end record's root waits for
/// that line and covers it, so the local check agrees.
#[test]
fn a_tunnel_still_open_at_the_sessions_end_is_in_its_root() {
    if !have("python3") {
        return;
    }
    let world = World::new();
    let repo = world.repo("draining");
    let port = silent_upstream("127.0.0.2");
    let resolver = world.write(world.tmp.path().join("resolver"), "slow.test 127.0.0.2\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!("[network]\nallow = [\"slow.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n"),
    );
    let h = Harness::start(
        &world,
        Options {
            args: ["--idle-timeout", "30s", "--shutdown-grace", "1s"].map(String::from).to_vec(),
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    // The proxy's port explicit in the rule: no SNI check, so a plain TCP tunnel is allowed.
    let script = format!(
        "import os, socket\n\
         proxy = os.environ['HTTP_PROXY'].split('//')[1].strip('/').split(':')\n\
         s = socket.create_connection((proxy[0], int(proxy[1])), timeout=10)\n\
         s.sendall(b'CONNECT slow.test:{port} HTTP/1.1\\r\\nHost: slow.test:{port}\\r\\n\\r\\n')\n\
         print('tunnel:' + s.recv(100).decode().split('\\r\\n')[0])\n\
         s.sendall(b'hello')\n"
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--", "python3", "-c", &script])
        .run();
    let out = run.stdout();
    assert_eq!(run.code(), 0, "{out}\n{}\n--- airlockd log\n{}", run.stderr(), h.log());
    assert!(out.contains("tunnel:HTTP/1.1 200"), "{out}");
    let records = world.session_records("draining");
    let end = records.iter().find(|r| r["kind"] == "end").expect("an end record");
    let session = end["session"].as_str().unwrap();
    // (The line is there when `airlock exec` returns; waiting for it here lets a build that
    // roots too early fail on the root, below, rather than here.)
    let dir = world.home.join(".airlock/logs/draining");
    let tunnel = |ls: &[(PathBuf, String)]| {
        ls.iter().any(|(_, l)| l.contains("\"method\":\"CONNECT\",\"allowed\":true"))
    };
    wait_until(std::time::Duration::from_secs(10), || tunnel(&session_lines(&dir, session)));
    let lines = session_lines(&dir, session);
    assert!(tunnel(&lines), "the tunnel's line: {lines:?}");
    assert_eq!(end["audit_root"]["lines"], lines.len() as u64, "{end}\n{lines:?}");
    let (code, out, err) = verify(&world, &repo);
    assert_eq!(code, 0, "{out}\n{err}");
}
