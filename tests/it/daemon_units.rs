//! The shipped service files (issue 4 items 8–9): the systemd units pass
//! `systemd-analyze verify` (through `.ci/lint-units`), and the launchd plists — read with the
//! `plist` crate — have `SockPathMode` as the integer 384, no `RunAtLoad`/`KeepAlive`, an
//! absolute program path, and the socket key airlockd asks launchd for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use airlock::sys::activation::SOCKET_NAME;
use plist::{Dictionary, Value};

use crate::support::{World, bin, in_ci};

fn parse_plist(xml: &str) -> Dictionary {
    Value::from_reader_xml(xml.as_bytes())
        .unwrap_or_else(|e| panic!("not a property list ({e}):\n{xml}"))
        .into_dictionary()
        .expect("the top level is not a dict")
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The checks every airlockd LaunchAgent must pass; returns the socket dict.
fn check_agent(agent: &Dictionary) -> Result<&Dictionary, String> {
    if agent.get("Label").and_then(Value::as_string) != Some(airlock::client::LAUNCHD_LABEL) {
        return Err(format!("Label is {:?}", agent.get("Label")));
    }
    for forbidden in ["RunAtLoad", "KeepAlive"] {
        if agent.contains_key(forbidden) {
            return Err(format!("{forbidden} must not be set: airlockd idles out"));
        }
    }
    let program = agent
        .get("ProgramArguments")
        .and_then(Value::as_array)
        .and_then(|args| args.first())
        .and_then(Value::as_string)
        .ok_or("no ProgramArguments, or its first item is not a string")?;
    if !Path::new(program).is_absolute() {
        return Err(format!("program path {program} is not absolute"));
    }
    let sockets = agent.get("Sockets").and_then(Value::as_dictionary).ok_or("no Sockets dict")?;
    let keys: Vec<&str> = sockets.keys().map(String::as_str).collect();
    if keys != [SOCKET_NAME] {
        return Err(format!("socket keys {keys:?}: must be only what airlockd asks launchd for"));
    }
    let sock = sockets[SOCKET_NAME].as_dictionary().ok_or("the socket is not a dict")?;
    // An integer, not the string "384" (launchd ignores a mode of the wrong type).
    if !matches!(sock.get("SockPathMode"), Some(Value::Integer(n)) if n.as_signed() == Some(384)) {
        return Err(format!(
            "SockPathMode must be the integer 384 (0600), is {:?}",
            sock.get("SockPathMode")
        ));
    }
    Ok(sock)
}

#[test]
fn the_agent_checks_refuse_what_airlockd_cannot_use() {
    let xml =
        std::fs::read_to_string(repo_file("service/launchd/dev.airlock.airlockd.plist")).unwrap();
    let good = parse_plist(&xml);
    check_agent(&good).unwrap();
    type Mutation = fn(&mut Dictionary);
    let mutations: [(&str, Mutation); 5] = [
        ("RunAtLoad", |d| {
            d.insert("RunAtLoad".into(), Value::Boolean(true));
        }),
        ("not absolute", |d| {
            d.insert(
                "ProgramArguments".into(),
                Value::Array(vec![Value::String("airlockd".into())]),
            );
        }),
        ("socket keys", |d| {
            let sockets = d.get_mut("Sockets").unwrap().as_dictionary_mut().unwrap();
            let sock = sockets.remove(SOCKET_NAME).unwrap();
            sockets.insert("other".into(), sock);
        }),
        ("integer 384", |d| {
            let sockets = d.get_mut("Sockets").unwrap().as_dictionary_mut().unwrap();
            let sock = sockets.get_mut(SOCKET_NAME).unwrap().as_dictionary_mut().unwrap();
            sock.insert("SockPathMode".into(), Value::String("384".into()));
        }),
        ("Label", |d| {
            d.insert("Label".into(), Value::String("com.example.other".into()));
        }),
    ];
    for (what, mutate) in mutations {
        let mut bad = good.clone();
        mutate(&mut bad);
        let err = check_agent(&bad).unwrap_err();
        assert!(err.contains(what), "{what}: {err}");
    }
}

#[test]
fn fleet_plist_uses_a_secure_socket_exported_as_airlock_socket() {
    let xml =
        std::fs::read_to_string(repo_file("service/launchd/dev.airlock.airlockd.plist")).unwrap();
    let agent = parse_plist(&xml);
    let sock = check_agent(&agent).unwrap();
    assert_eq!(sock.get("SecureSocketWithKey").and_then(Value::as_string), Some("AIRLOCK_SOCKET"));
    assert!(!sock.contains_key("SockPathName"));
}

#[test]
fn per_user_plist_from_service_install_dry_run() {
    let world = World::new();
    let sock = world.tmp.path().join("s/airlock.sock");
    let run = world
        .airlock(world.tmp.path())
        .args(["service", "install", "--manager", "launchd", "--dry-run"])
        .env("AIRLOCK_SOCKET", &sock)
        .run()
        .expect_code(0);
    let out = run.stdout();
    let start = out.find("<?xml").expect("no plist printed");
    let end = out.find("</plist>").expect("unterminated plist") + "</plist>".len();
    let agent = parse_plist(&out[start..end]);
    let s = check_agent(&agent).unwrap();
    assert_eq!(
        s.get("SockPathName").and_then(Value::as_string),
        Some(sock.display().to_string().as_str())
    );
    let program = agent["ProgramArguments"].as_array().unwrap()[0].as_string().unwrap();
    assert!(program.ends_with("/airlockd"), "{program}");
    assert!(out.contains("# would run: launchctl bootstrap gui/"), "{out}");
    assert!(!world.home.join("Library").exists(), "--dry-run wrote files");
}

#[test]
fn systemd_install_dry_run_prints_units_and_writes_nothing() {
    let world = World::new();
    let run = world
        .airlock(world.tmp.path())
        .args(["service", "install", "--manager", "systemd", "--dry-run"])
        .run()
        .expect_code(0);
    let out = run.stdout();
    assert!(
        out.contains(&format!(
            "# would write {}",
            world.home.join(".config/systemd/user/airlock.socket").display()
        )),
        "{out}"
    );
    assert!(out.contains("ListenStream=%t/airlock/airlock.sock"));
    assert!(out.contains("# would run: systemctl --user enable --now airlock.socket"));
    let exec = out.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
    assert!(Path::new(exec.trim_start_matches("ExecStart=")).is_absolute());
    assert!(!world.home.join(".config").exists(), "--dry-run wrote files");
    // Uninstall and status in dry-run touch nothing either.
    world
        .airlock(world.tmp.path())
        .args(["service", "uninstall", "--dry-run"])
        .run()
        .expect_code(0);
    let st = world
        .airlock(world.tmp.path())
        .args(["service", "status", "--dry-run"])
        .run()
        .expect_code(0);
    assert!(st.stdout().contains("airlock.socket: absent"), "{}", st.stdout());
}

#[test]
fn systemd_units_verify_clean() {
    if std::process::Command::new("systemd-analyze").arg("--version").output().is_err() {
        assert!(!in_ci(), "systemd-analyze is a prerequisite (.ci/prereqs)");
        return;
    }
    let out = std::process::Command::new("bash")
        .arg(repo_file(".ci/lint-units"))
        .arg(bin("airlockd"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
