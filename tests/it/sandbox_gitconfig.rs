//! `git config` inside the sandbox (issue 15, "git config without giving up safety"): ordinary
//! commands work and persist through the allowlisted merge; every code-running key set inside
//! never reaches the host's `.git/config`, is reported and sits in the quarantine; the host's own
//! `git` run afterwards never runs what was planted (two steps, each attack first shown to work
//! when the host itself writes it: a positive control). Runs as root and, through
//! `.ci/unprivileged`, as an unprivileged user.
#![cfg(feature = "test-hooks")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::sandbox::{git, prereqs};
use crate::support::{PtyOutput, Sandbox, World, wait_until};

/// A git repo with one commit on `main` and a remote `origin` that is a bare repo on disk (so a
/// host `git fetch` talks to nothing but a local `git-upload-pack`).
fn repo_with_origin(name: &str) -> (Sandbox, PathBuf) {
    let world = World::new();
    let origin = world.tmp.path().join("origin.git");
    assert!(git(world.tmp.path(), &["init", "-q", "--bare", "origin.git"]).status.success());
    let repo = world.tmp.path().join(name);
    std::fs::create_dir_all(&repo).unwrap();
    assert!(git(&repo, &["init", "-q"]).status.success());
    world.write(repo.join("README"), "hi\n");
    assert!(git(&repo, &["add", "-A"]).status.success());
    assert!(git(&repo, &["commit", "-qm", "init"]).status.success());
    assert!(git(&repo, &["remote", "add", "origin", origin.to_str().unwrap()]).status.success());
    assert!(git(&repo, &["push", "-q", "origin", "main"]).status.success());
    // The developer's own formatting, which the merge must keep.
    let mut cfg = std::fs::OpenOptions::new().append(true).open(repo.join(".git/config")).unwrap();
    cfg.write_all(b"# the developer's comment\n").unwrap();
    (Sandbox::with(world, repo), origin)
}

/// A host `git` in `dir` with a clean environment (no user or system config), as a shell
/// prompt or an editor would run it.
fn host_git(sb: &Sandbox, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .current_dir(&sb.repo)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", sb.home())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.test"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn host_config(sb: &Sandbox) -> String {
    std::fs::read_to_string(sb.repo.join(".git/config")).unwrap()
}

/// `git config --get-all KEY` read on the host from the host file only.
fn get_all(sb: &Sandbox, key: &str) -> Vec<String> {
    let out = host_git(sb, &["config", "--file", ".git/config", "--get-all", key]);
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// The one session that has a quarantine.
fn only_session(sb: &Sandbox) -> String {
    let dir = sb.home().join(".airlock/quarantine");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].clone()
}

fn manifest(sb: &Sandbox, session: &str) -> serde_json::Value {
    let path = sb.home().join(".airlock/quarantine").join(session).join("manifest.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every held git config key in the session's manifest (lower-cased).
fn held_keys(sb: &Sandbox, session: &str) -> Vec<String> {
    manifest(sb, session)["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["git_config"] == true)
        .flat_map(|i| i["keys"].as_array().cloned().unwrap_or_default())
        .map(|k| k["key"].as_str().unwrap().to_ascii_lowercase())
        .collect()
}

#[test]
fn ordinary_git_config_commands_work_inside_and_persist_on_the_host() {
    if !prereqs(&["git"]) {
        return;
    }
    let (sb, _origin) = repo_with_origin("gc-ordinary");
    let script = "set -e; cd $AIRLOCK_REPO; \
        git config user.name 'Inside Name'; git config user.email in@example.test; \
        git config core.autocrlf input; \
        git remote add upstream https://example.test/up.git; \
        git update-ref refs/remotes/upstream/main HEAD; \
        git branch --set-upstream-to=upstream/main; \
        git remote add scratch https://example.test/s.git; git remote remove scratch; \
        git config user.name; echo done";
    let run = sb.sh(script).expect_code(0);
    assert!(run.stdout().contains("Inside Name\ndone"), "{}\n{}", run.stdout(), run.stderr());
    let err = run.stderr();
    assert!(!err.contains("resource busy"), "{err}");
    assert!(err.contains("merged the session's git config changes"), "{err}");
    assert_eq!(get_all(&sb, "user.name"), ["Inside Name"]);
    assert_eq!(get_all(&sb, "user.email"), ["in@example.test"]);
    assert_eq!(get_all(&sb, "core.autocrlf"), ["input"]);
    assert_eq!(get_all(&sb, "remote.upstream.url"), ["https://example.test/up.git"]);
    assert_eq!(get_all(&sb, "remote.upstream.fetch"), ["+refs/heads/*:refs/remotes/upstream/*"]);
    assert_eq!(get_all(&sb, "branch.main.remote"), ["upstream"]);
    assert_eq!(get_all(&sb, "branch.main.merge"), ["refs/heads/main"]);
    assert!(get_all(&sb, "remote.scratch.url").is_empty());
    let cfg = host_config(&sb);
    assert!(cfg.contains("# the developer's comment\n"), "{cfg}");
    // The host's own git reads it: the upstream is the one set inside.
    let st = host_git(&sb, &["rev-parse", "--abbrev-ref", "main@{upstream}"]);
    assert_eq!(String::from_utf8_lossy(&st.stdout).trim(), "upstream/main");
    // Nothing was quarantined, and the private copy is gone with the session.
    assert!(!err.contains("held back"), "{err}");
    let left: Vec<_> = std::fs::read_dir(sb.home().join(".airlock/quarantine"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");

    // Removing what the allowlist covers works too.
    let run =
        sb.sh("set -e; cd $AIRLOCK_REPO; git branch --unset-upstream; echo ok").expect_code(0);
    assert!(run.stdout().contains("ok"), "{}", run.stderr());
    assert!(get_all(&sb, "branch.main.remote").is_empty(), "{}", host_config(&sb));
    assert!(get_all(&sb, "branch.main.merge").is_empty());
    assert_eq!(get_all(&sb, "user.name"), ["Inside Name"]);
}

/// Each dangerous key as `git config` arguments, and the marker-making command it carries.
fn dangerous(marker: &Path, hooks_dir: &Path) -> Vec<(String, String)> {
    let touch = format!("touch {}", marker.display());
    let include = hooks_dir.join("included.cfg");
    vec![
        ("core.fsmonitor".into(), touch.clone()),
        ("core.hooksPath".into(), hooks_dir.display().to_string()),
        ("core.sshCommand".into(), touch.clone()),
        ("core.pager".into(), touch.clone()),
        ("core.editor".into(), touch.clone()),
        ("alias.x".into(), format!("!{touch}")),
        ("include.path".into(), include.display().to_string()),
        ("includeIf.gitdir:/.path".into(), include.display().to_string()),
        ("url.ext::sh -c touch% /x.insteadOf".into(), "https://example.test/".into()),
        ("filter.x.clean".into(), touch.clone()),
        ("diff.x.textconv".into(), touch.clone()),
        ("merge.x.driver".into(), touch.clone()),
        ("remote.origin.uploadpack".into(), touch.clone()),
        ("remote.origin.receivepack".into(), touch.clone()),
        ("remote.origin.proxy".into(), "http://127.0.0.1:9/".into()),
        ("credential.helper".into(), format!("!{touch}")),
        ("gpg.program".into(), touch.clone()),
        ("sequence.editor".into(), touch.clone()),
        ("protocol.ext.allow".into(), "always".into()),
        ("submodule.x.update".into(), format!("!{touch}")),
        ("uploadpack.packObjectsHook".into(), touch),
    ]
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[test]
fn code_running_keys_set_inside_never_reach_the_host_and_host_git_runs_nothing() {
    if !prereqs(&["git"]) {
        return;
    }
    let (sb, origin) = repo_with_origin("gc-danger");
    let tmp = sb.world.tmp.path().to_path_buf();
    let marker = tmp.join("PLANTED-RAN");
    let hooks = tmp.join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    sb.world.write_executable(
        hooks.join("pre-commit"),
        &format!("#!/bin/sh\ntouch {}\n", marker.display()),
    );
    sb.world.write(
        hooks.join("included.cfg"),
        &format!("[core]\n\tfsmonitor = touch {}\n", marker.display()),
    );

    // Positive control: the same keys written by the host into a scratch clone do run the
    // marker through `git status`, `git fetch` and `git x`.
    let control = tmp.join("control");
    assert!(git(&tmp, &["clone", "-q", origin.to_str().unwrap(), "control"]).status.success());
    for (key, value) in [
        ("core.fsmonitor", format!("touch {}", marker.display())),
        ("remote.origin.uploadpack", format!("touch {}; git-upload-pack", marker.display())),
        ("alias.x", format!("!touch {}", marker.display())),
    ] {
        assert!(git(&control, &["config", key, &value]).status.success());
        let cmd: &[&str] = match key {
            "core.fsmonitor" => &["status"],
            "remote.origin.uploadpack" => &["fetch", "-q", "origin"],
            _ => &["x"],
        };
        let _ = Command::new("git").current_dir(&control).args(cmd).output().unwrap();
        assert!(
            marker.exists(),
            "control attack via {key} did not run; the test would prove nothing"
        );
        std::fs::remove_file(&marker).unwrap();
        assert!(git(&control, &["config", "--unset-all", key]).status.success());
    }

    // Step 1, inside: every dangerous key, plus an ext:: remote, next to one ordinary change.
    let mut script = String::from("cd $AIRLOCK_REPO; git config user.name Kept; ");
    for (key, value) in dangerous(&marker, &hooks) {
        script.push_str(&format!(
            "git config {} {} || echo FAILED {key}; ",
            sh_quote(&key),
            sh_quote(&value)
        ));
    }
    script.push_str(&format!(
        "git remote add evil {} || echo FAILED ext; echo planted",
        sh_quote(&format!("ext::sh -c touch% {}", marker.display()))
    ));
    let run = sb.sh(&script).expect_code(0);
    let (out, err) = (run.stdout(), run.stderr());
    assert!(out.contains("planted") && !out.contains("FAILED"), "{out}\n{err}");

    // Nothing of it is in the host file; the ordinary change is.
    let cfg = host_config(&sb).to_ascii_lowercase();
    for (key, _) in dangerous(&marker, &hooks) {
        let name = key.rsplit('.').next().unwrap().to_ascii_lowercase();
        assert!(!cfg.contains(&format!("{name} =")), "{key} reached the host file:\n{cfg}");
    }
    assert!(!cfg.contains("ext::") && !cfg.contains("[remote \"evil\"]"), "{cfg}");
    assert!(!cfg.contains("planted-ran"), "{cfg}");
    assert_eq!(get_all(&sb, "user.name"), ["Kept"]);

    // Reported, and every one of them is in the quarantine.
    assert!(err.contains("held back"), "{err}");
    assert!(err.contains("core.fsmonitor") && err.contains("remote.evil.url"), "{err}");
    let session = only_session(&sb);
    let held = held_keys(&sb, &session);
    for (key, _) in dangerous(&marker, &hooks) {
        assert!(held.contains(&key.to_ascii_lowercase()), "{key} not in the quarantine: {held:?}");
    }
    assert!(held.contains(&"remote.evil.url".to_owned()), "{held:?}");

    // Step 2: the host's own git, in the repo the session left.
    for args in [
        &["status"][..],
        &["fetch", "-q", "origin"],
        &["x"],
        &["log", "-1"],
        &["fetch", "-q", "evil"],
    ] {
        let _ = host_git(&sb, args);
    }
    std::fs::write(sb.repo.join("README"), "changed\n").unwrap();
    let _ = host_git(&sb, &["commit", "-qam", "host commit"]);
    assert!(!marker.exists(), "the host's git ran code a session planted");

    // Restore gives one back on request (the user's choice).
    let restore = sb
        .world
        .airlock(&sb.repo)
        .args(["quarantine", "restore", &session, "git-config:alias.x"])
        .run()
        .expect_code(0);
    assert!(restore.stdout().contains("alias.x"), "{}", restore.stdout());
    assert_eq!(get_all(&sb, "alias.x"), [format!("!touch {}", marker.display())]);
    assert!(get_all(&sb, "core.fsmonitor").is_empty());
}

#[test]
fn a_changed_url_of_an_existing_remote_is_held_without_a_terminal_and_restore_applies_it() {
    if !prereqs(&["git"]) {
        return;
    }
    let (sb, origin) = repo_with_origin("gc-url");
    let run = sb
        .sh("set -e; cd $AIRLOCK_REPO; git remote set-url origin https://example.test/evil.git; \
             git remote set-url --add --push origin https://example.test/push.git; echo ok")
        .expect_code(0);
    let err = run.stderr();
    assert!(run.stdout().contains("ok"), "{err}");
    assert_eq!(get_all(&sb, "remote.origin.url"), [origin.display().to_string()]);
    assert!(get_all(&sb, "remote.origin.pushurl").is_empty(), "{}", host_config(&sb));
    assert!(err.contains("not confirmed on a terminal"), "{err}");
    let session = only_session(&sb);
    // The report names the exact command that applies it.
    let apply = format!("airlock quarantine restore {session} git-config:remote.origin.url");
    assert!(err.contains(&apply), "{err}");
    let held = held_keys(&sb, &session);
    assert!(held.contains(&"remote.origin.url".into()), "{held:?}");
    // `show` previews the replacement, and restoring it replaces the url: still exactly one.
    let show = sb
        .world
        .airlock(&sb.repo)
        .args(["quarantine", "show", &session, "git-config:remote.origin.url"])
        .run()
        .expect_code(0);
    let preview = show.stdout();
    let origin_line = format!("url = {}", origin.display());
    assert!(preview.lines().any(|l| l.starts_with('-') && l.contains(&origin_line)), "{preview}");
    assert!(preview.lines().any(|l| l.starts_with('+') && l.contains("evil.git")), "{preview}");
    sb.world
        .airlock(&sb.repo)
        .args(["quarantine", "restore", &session, "git-config:remote.origin.url"])
        .run()
        .expect_code(0);
    assert_eq!(get_all(&sb, "remote.origin.url"), ["https://example.test/evil.git"]);
}

#[test]
fn a_changed_url_of_an_existing_remote_is_applied_once_confirmed_on_the_terminal() {
    if !prereqs(&["git"]) {
        return;
    }
    for (answer, applied) in [(&b"y\n"[..], true), (&b"n\n"[..], false)] {
        let (sb, origin) = repo_with_origin("gc-confirm");
        let pty = nix::pty::openpty(None, None).unwrap();
        let mut cmd = sb
            .exec(&[
                "sh",
                "-c",
                "cd $AIRLOCK_REPO && git remote set-url origin https://example.test/new.git",
            ])
            .cmd;
        let slave = std::fs::File::from(pty.slave);
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        let mut child = cmd.spawn().unwrap();
        drop(cmd);
        let mut master = std::fs::File::from(pty.master);
        let mut terminal = PtyOutput::read(&master);
        terminal.wait_for(b"Apply? [y/N] ");
        master.write_all(answer).unwrap();
        assert!(wait_until(Duration::from_secs(20), || child.try_wait().unwrap().is_some()));
        let seen = String::from_utf8_lossy(&terminal.until_closed()).into_owned();
        assert_eq!(child.wait().unwrap().code(), Some(0), "{seen}");
        let urls = get_all(&sb, "remote.origin.url");
        if applied {
            assert_eq!(urls, ["https://example.test/new.git"], "{seen}");
        } else {
            assert_eq!(urls, [origin.display().to_string()], "{seen}");
            assert!(seen.contains("not confirmed on a terminal"), "{seen}");
        }
    }
}

#[test]
fn a_host_file_changed_during_the_session_holds_the_whole_change() {
    if !prereqs(&["git"]) {
        return;
    }
    let (sb, _origin) = repo_with_origin("gc-race");
    let mut cmd = sb
        .exec(&[
            "sh",
            "-c",
            "cd $AIRLOCK_REPO && git config user.name Inside && touch ready && \
                 while [ ! -e go ]; do sleep 0.1; done",
        ])
        .cmd;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    assert!(wait_until(Duration::from_secs(30), || sb.repo.join("ready").exists()));
    assert!(host_git(&sb, &["config", "core.abbrev", "12"]).status.success());
    std::fs::write(sb.repo.join("go"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(get_all(&sb, "core.abbrev"), ["12"], "the host's own change was lost");
    assert!(get_all(&sb, "user.name").is_empty(), "{}", host_config(&sb));
    assert!(err.contains("changed during the session"), "{err}");
    assert!(err.contains("nothing of the session's git config was merged"), "{err}");
    let held = held_keys(&sb, &only_session(&sb));
    assert_eq!(held, ["user.name"]);
}

#[test]
fn the_private_copy_cannot_be_swapped_for_a_link_to_a_host_file() {
    if !prereqs(&["git"]) {
        return;
    }
    let (sb, _origin) = repo_with_origin("gc-swap");
    let before = host_config(&sb);
    // The agent replaces its copy with a symlink to a host path (here the repo's README, which
    // it fills with an allowlisted key) and cannot move the cover: the host side must not read
    // through the link.
    let script = format!(
        "cd $AIRLOCK_REPO; t=$(readlink .git/config); \
         mv .git/config .git/config.x 2>/dev/null && echo MOVED; \
         printf '[user]\\n\\tname = Swapped\\n' > README; rm -f $t; ln -s {} $t; echo swapped",
        sb.repo.join("README").display()
    );
    let run = sb.sh(&script).expect_code(0);
    assert!(
        run.stdout().contains("swapped") && !run.stdout().contains("MOVED"),
        "{}",
        run.stderr()
    );
    assert_eq!(host_config(&sb), before);
    assert!(run.stderr().contains("unreadable"), "{}", run.stderr());
}
