//! The shipped service files (issue 4 items 8–9): the systemd units pass
//! `systemd-analyze verify` (through `.ci/lint-units`), and the launchd plists — parsed with a
//! small plist reader below — have `SockPathMode` as the integer 384, no `RunAtLoad`/`KeepAlive`,
//! an absolute program path, and the socket key airlockd asks launchd for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use airlock::sys::activation::SOCKET_NAME;

use crate::support::{World, bin, in_ci};

/// A property-list value (the subset launchd plists use).
#[derive(Debug, Clone, PartialEq)]
enum Plist {
    Dict(Vec<(String, Plist)>),
    Array(Vec<Plist>),
    String(String),
    Integer(i64),
    Bool(bool),
}

impl Plist {
    fn get(&self, key: &str) -> Option<&Plist> {
        match self {
            Plist::Dict(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    fn keys(&self) -> Vec<&str> {
        match self {
            Plist::Dict(entries) => entries.iter().map(|(k, _)| k.as_str()).collect(),
            _ => Vec::new(),
        }
    }
}

/// Tokens of the XML: tags (with a self-closing flag) and text.
#[derive(Debug, PartialEq)]
enum Tok {
    Open(String),
    Close(String),
    Empty(String),
    Text(String),
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

fn tokenize(xml: &str) -> Result<Vec<Tok>, String> {
    let mut toks = Vec::new();
    let mut rest = xml;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("<?") {
            rest = &r[r.find("?>").ok_or("unterminated <?")? + 2..];
        } else if let Some(r) = rest.strip_prefix("<!--") {
            rest = &r[r.find("-->").ok_or("unterminated comment")? + 3..];
        } else if let Some(r) = rest.strip_prefix("<!") {
            rest = &r[r.find('>').ok_or("unterminated <!")? + 1..];
        } else if let Some(r) = rest.strip_prefix('<') {
            let end = r.find('>').ok_or("unterminated tag")?;
            let tag = &r[..end];
            rest = &r[end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                toks.push(Tok::Close(name.trim().to_owned()));
            } else if let Some(name) = tag.strip_suffix('/') {
                toks.push(Tok::Empty(name.trim().to_owned()));
            } else {
                let name = tag.split_whitespace().next().ok_or("empty tag")?;
                toks.push(Tok::Open(name.to_owned()));
            }
        } else {
            let end = rest.find('<').unwrap_or(rest.len());
            let text = &rest[..end];
            if !text.trim().is_empty() {
                toks.push(Tok::Text(unescape(text)));
            }
            rest = &rest[end..];
        }
    }
    Ok(toks)
}

fn parse_value(toks: &[Tok], i: &mut usize) -> Result<Plist, String> {
    let tok = toks.get(*i).ok_or("unexpected end")?;
    *i += 1;
    let text_until = |i: &mut usize, name: &str| -> Result<String, String> {
        let mut text = String::new();
        if let Some(Tok::Text(t)) = toks.get(*i) {
            text = t.clone();
            *i += 1;
        }
        match toks.get(*i) {
            Some(Tok::Close(n)) if n == name => {
                *i += 1;
                Ok(text)
            }
            other => Err(format!("expected </{name}>, got {other:?}")),
        }
    };
    match tok {
        Tok::Empty(n) if n == "true" => Ok(Plist::Bool(true)),
        Tok::Empty(n) if n == "false" => Ok(Plist::Bool(false)),
        Tok::Empty(n) if n == "dict" => Ok(Plist::Dict(Vec::new())),
        Tok::Empty(n) if n == "array" => Ok(Plist::Array(Vec::new())),
        Tok::Open(n) if n == "string" => Ok(Plist::String(text_until(i, "string")?)),
        Tok::Open(n) if n == "integer" => {
            let t = text_until(i, "integer")?;
            t.trim().parse().map(Plist::Integer).map_err(|e| format!("bad integer {t:?}: {e}"))
        }
        Tok::Open(n) if n == "array" => {
            let mut items = Vec::new();
            loop {
                if let Some(Tok::Close(c)) = toks.get(*i) {
                    if c != "array" {
                        return Err(format!("unexpected </{c}> in array"));
                    }
                    *i += 1;
                    return Ok(Plist::Array(items));
                }
                items.push(parse_value(toks, i)?);
            }
        }
        Tok::Open(n) if n == "dict" => {
            let mut entries = Vec::new();
            loop {
                match toks.get(*i) {
                    Some(Tok::Close(c)) if c == "dict" => {
                        *i += 1;
                        return Ok(Plist::Dict(entries));
                    }
                    Some(Tok::Open(k)) if k == "key" => {
                        *i += 1;
                        let key = text_until(i, "key")?;
                        if entries.iter().any(|(e, _)| *e == key) {
                            return Err(format!("duplicate key {key}"));
                        }
                        entries.push((key, parse_value(toks, i)?));
                    }
                    other => return Err(format!("expected <key> in dict, got {other:?}")),
                }
            }
        }
        other => Err(format!("unexpected {other:?}")),
    }
}

fn parse_plist(xml: &str) -> Result<Plist, String> {
    let toks = tokenize(xml)?;
    let mut i = 0;
    match toks.first() {
        Some(Tok::Open(n)) if n == "plist" => i += 1,
        other => return Err(format!("expected <plist>, got {other:?}")),
    }
    let v = parse_value(&toks, &mut i)?;
    match toks.get(i) {
        Some(Tok::Close(n)) if n == "plist" && i + 1 == toks.len() => Ok(v),
        other => Err(format!("trailing content: {other:?}")),
    }
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The checks every airlockd LaunchAgent must pass; returns the socket dict.
fn check_agent(plist: &Plist) -> &Plist {
    assert_eq!(plist.get("Label"), Some(&Plist::String(airlock::client::LAUNCHD_LABEL.into())));
    for forbidden in ["RunAtLoad", "KeepAlive"] {
        assert!(plist.get(forbidden).is_none(), "{forbidden} must not be set: airlockd idles out");
    }
    let Some(Plist::Array(args)) = plist.get("ProgramArguments") else {
        panic!("no ProgramArguments")
    };
    let Some(Plist::String(program)) = args.first() else { panic!("empty ProgramArguments") };
    assert!(Path::new(program).is_absolute(), "program path {program} is not absolute");
    let sockets = plist.get("Sockets").expect("no Sockets");
    assert_eq!(
        sockets.keys(),
        vec![SOCKET_NAME],
        "the socket key must be what airlockd asks launchd for"
    );
    let sock = sockets.get(SOCKET_NAME).unwrap();
    assert_eq!(
        sock.get("SockPathMode"),
        Some(&Plist::Integer(384)),
        "SockPathMode must be the integer 384 (0600)"
    );
    sock
}

#[test]
fn the_plist_reader_rejects_what_launchd_would() {
    assert!(parse_plist("<plist><dict><key>a</key></dict></plist>").is_err());
    assert!(parse_plist("<plist><dict><key>a</key><integer>x</integer></dict></plist>").is_err());
    assert!(
        parse_plist("<plist><dict><key>a</key><true/><key>a</key><true/></dict></plist>").is_err()
    );
    let v = parse_plist("<plist version=\"1.0\"><dict><key>k</key><string>a&amp;b</string><key>n</key><integer>384</integer></dict></plist>").unwrap();
    assert_eq!(v.get("k"), Some(&Plist::String("a&b".into())));
    assert_eq!(v.get("n"), Some(&Plist::Integer(384)));
    // The string "384" is not the integer 384.
    let s = parse_plist("<plist><dict><key>n</key><string>384</string></dict></plist>").unwrap();
    assert_ne!(s.get("n"), Some(&Plist::Integer(384)));
}

#[test]
fn fleet_plist_uses_a_secure_socket_exported_as_airlock_socket() {
    let xml =
        std::fs::read_to_string(repo_file("service/launchd/dev.airlock.airlockd.plist")).unwrap();
    let plist = parse_plist(&xml).unwrap();
    let sock = check_agent(&plist);
    assert_eq!(sock.get("SecureSocketWithKey"), Some(&Plist::String("AIRLOCK_SOCKET".into())));
    assert!(sock.get("SockPathName").is_none());
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
    let plist = parse_plist(&out[start..end]).unwrap();
    let s = check_agent(&plist);
    assert_eq!(s.get("SockPathName"), Some(&Plist::String(sock.display().to_string())));
    let Some(Plist::Array(args)) = plist.get("ProgramArguments") else { unreachable!() };
    let Plist::String(program) = &args[0] else { unreachable!() };
    assert!(program.ends_with("/airlockd"));
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
