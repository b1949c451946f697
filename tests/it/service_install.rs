//! `airlock service install | uninstall` with a stand-in `systemctl` (these machines have no
//! systemd user manager): the units, every man page and the bash/zsh/fish completions of both
//! binaries are written, and removed again; an install whose service manager does not answer
//! writes nothing, and one that fails after writing takes everything back (a file it replaced
//! gets its old contents). Also `airlock man` and `airlockd completions`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::support::{Run, World, bin, have, in_ci};

/// A `systemctl` that logs its arguments to `<dir>/systemctl.log` and fails (exit 1, with
/// systemctl's own message) when they contain `$FAIL_ON`.
fn fake_systemctl(world: &World) -> PathBuf {
    let dir = world.tmp.path().join("fakebin");
    world.write_executable(
        dir.join("systemctl"),
        &format!(
            "#!/bin/sh\necho \"$*\" >> {log}\n\
             if [ -n \"$FAIL_ON\" ]; then case \"$*\" in *\"$FAIL_ON\"*) \
             echo 'Failed to connect to bus: No medium found' >&2; exit 1;; esac; fi\nexit 0\n",
            log = dir.join("systemctl.log").display()
        ),
    );
    dir
}

fn systemctl_log(fakebin: &Path) -> Vec<String> {
    std::fs::read_to_string(fakebin.join("systemctl.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn service(world: &World, path: &str, args: &[&str], fail_on: &str) -> Run {
    world
        .airlock(world.tmp.path())
        .env("PATH", path)
        .env("FAIL_ON", fail_on)
        .args(["service"])
        .args(args)
        .run()
}

/// Every file below `dir`, relative, sorted.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out
}

/// The man page names every visible command of `cmd` must have, at every depth
/// (`airlock-service-install.1`, like git's).
fn expected_pages(cmd: clap::Command) -> BTreeSet<String> {
    fn walk(cmd: &clap::Command, prefix: &str, out: &mut BTreeSet<String>) {
        out.insert(format!("{prefix}.1"));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            walk(sub, &format!("{prefix}-{}", sub.get_name()), out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&cmd, cmd.get_name(), &mut out);
    out
}

fn all_expected_pages() -> BTreeSet<String> {
    let mut pages = expected_pages(airlock::cli::Cli::command());
    pages.extend(expected_pages(airlock::daemon::cli::DaemonCli::command()));
    pages
}

/// Checks one page's roff: title line naming the page, the NAME section, and (with man-db)
/// that `man -l --warnings` renders it without a single warning.
fn check_page(path: &Path) {
    let roff = std::fs::read_to_string(path).unwrap();
    let name = path.file_stem().unwrap().to_str().unwrap();
    assert!(roff.lines().any(|l| l.starts_with(&format!(".TH {name} 1 "))), "{name}: {roff}");
    assert!(roff.contains(".SH NAME\n"), "{name}");
    assert!(roff.contains(".SH SYNOPSIS\n"), "{name}");
    if have("man") {
        let out = std::process::Command::new("man")
            .args(["--warnings", "-l"])
            .arg(path)
            .env("MANWIDTH", "80")
            .env("MANPAGER", "cat")
            .output()
            .unwrap();
        assert!(out.status.success(), "man -l {}: {:?}", path.display(), out);
        assert!(out.stderr.is_empty(), "{}: {}", name, String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("NAME") && text.contains("SYNOPSIS"), "{name}: {text}");
    } else {
        assert!(!in_ci(), "man (man-db) is a prerequisite (.ci/prereqs)");
    }
}

#[test]
fn man_out_writes_one_page_per_visible_command_and_none_for_hidden_ones() {
    let world = World::new();
    let dir = world.tmp.path().join("pkg/usr/share/man/man1");
    let run = world
        .airlock(world.tmp.path())
        .args(["man".as_ref(), "--out".as_ref(), dir.as_os_str()])
        .run()
        .expect_code(0);
    let written: BTreeSet<String> =
        tree(&dir).iter().map(|p| p.to_string_lossy().into_owned()).collect();
    assert_eq!(written, all_expected_pages(), "{}", run.stdout());
    assert!(written.contains("airlock-service-install.1") && written.contains("airlockd-proxy.1"));
    assert!(!written.iter().any(|p| p.contains("__")), "a hidden command got a page");
    assert_eq!(run.stdout().lines().count(), written.len(), "one path printed per page");
    for page in &written {
        check_page(&dir.join(page));
    }
    // One page on stdout, by its short name; an unknown one lists the pages.
    let one = world.airlock(world.tmp.path()).args(["man", "exec"]).run().expect_code(0);
    assert_eq!(one.stdout(), std::fs::read_to_string(dir.join("airlock-exec.1")).unwrap());
    let bad = world.airlock(world.tmp.path()).args(["man", "nope"]).run().expect_code(2);
    assert!(bad.stderr().contains("no man page \"airlock-nope\""), "{}", bad.stderr());
    assert!(bad.stderr().contains("airlockd-proxy"), "{}", bad.stderr());
}

#[test]
fn completions_of_both_binaries_offer_visible_commands_only() {
    let world = World::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let d = world.airlockd(world.tmp.path()).args(["completions", shell]).run().expect_code(0);
        for word in ["airlockd", "proxy", "review", "admin", "idle-timeout"] {
            assert!(d.stdout().contains(word), "airlockd {shell} lacks {word}");
        }
        let a = world.airlock(world.tmp.path()).args(["completions", shell]).run().expect_code(0);
        for word in ["exec", "service", "man", "quarantine"] {
            assert!(a.stdout().contains(word), "airlock {shell} lacks {word}");
        }
        // `__probe-capture` (and, in test-hooks builds, `__audit-hold`) are hidden commands.
        assert!(!a.stdout().contains("__probe") && !a.stdout().contains("__audit"), "{shell}");
    }
    // bash loads the airlockd script and registers a completion for airlockd.
    let script = world.write(
        world.tmp.path().join("airlockd.bash"),
        &world.airlockd(world.tmp.path()).args(["completions", "bash"]).run().stdout(),
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p airlockd", script.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("airlockd"), "{out:?}");
}

/// The files a full install writes below HOME (no XDG variables set).
fn expected_install(home: &Path) -> BTreeSet<PathBuf> {
    let mut want: BTreeSet<PathBuf> = all_expected_pages()
        .into_iter()
        .map(|p| PathBuf::from(".local/share/man/man1").join(p))
        .collect();
    for name in ["airlock", "airlockd"] {
        want.insert(PathBuf::from(".local/share/bash-completion/completions").join(name));
        want.insert(PathBuf::from(".local/share/zsh/site-functions").join(format!("_{name}")));
        want.insert(PathBuf::from(".config/fish/completions").join(format!("{name}.fish")));
    }
    want.insert(".config/systemd/user/airlock.socket".into());
    want.insert(".config/systemd/user/airlock.service".into());
    let _ = home;
    want
}

#[test]
fn install_writes_units_man_pages_and_completions_and_uninstall_removes_them() {
    let world = World::new();
    let fakebin = fake_systemctl(&world);
    let path = format!("{}:/usr/bin:/bin", fakebin.display());
    let run = service(&world, &path, &["install"], "").expect_code(0);

    assert_eq!(tree(&world.home), expected_install(&world.home), "{}", run.stdout());
    let service_unit =
        std::fs::read_to_string(world.home.join(".config/systemd/user/airlock.service")).unwrap();
    let airlockd = std::fs::canonicalize(bin("airlockd")).unwrap();
    assert!(
        service_unit.lines().any(|l| l == format!("ExecStart={}", airlockd.display())),
        "ExecStart is not rewritten to the airlockd installed for:\n{service_unit}"
    );
    // The pages are exactly what `airlock man --out` writes, and render.
    let man1 = world.home.join(".local/share/man/man1");
    let pkg = world.tmp.path().join("pkg");
    world
        .airlock(world.tmp.path())
        .args(["man".as_ref(), "--out".as_ref(), pkg.as_os_str()])
        .run()
        .expect_code(0);
    for page in tree(&man1) {
        assert_eq!(
            std::fs::read(man1.join(&page)).unwrap(),
            std::fs::read(pkg.join(&page)).unwrap()
        );
    }
    check_page(&man1.join("airlock-service-install.1"));
    check_page(&man1.join("airlockd.1"));
    let bash = world.home.join(".local/share/bash-completion/completions/airlockd");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p airlockd", bash.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // The manager was asked first, then reloaded and the socket enabled.
    assert_eq!(
        systemctl_log(&fakebin),
        ["--user show-environment", "--user daemon-reload", "--user enable --now airlock.socket"]
    );
    // Man pages and completions are listed by path, not dumped.
    assert!(run.stdout().contains(&format!("# writing {}", man1.join("airlock-exec.1").display())));
    assert!(!run.stdout().contains(".SH NAME"), "man page contents printed");

    let run = service(&world, &path, &["uninstall"], "").expect_code(0);
    assert_eq!(tree(&world.home), BTreeSet::new(), "uninstall left files:\n{}", run.stdout());
    assert!(
        systemctl_log(&fakebin)
            .contains(&"--user disable --now airlock.socket airlock.service".into())
    );
}

#[test]
fn install_honours_xdg_data_home_and_config_home() {
    let world = World::new();
    let fakebin = fake_systemctl(&world);
    let data = world.tmp.path().join("data");
    let config = world.tmp.path().join("config");
    world
        .airlock(world.tmp.path())
        .env("PATH", format!("{}:/usr/bin:/bin", fakebin.display()))
        .env("XDG_DATA_HOME", &data)
        .env("XDG_CONFIG_HOME", &config)
        .args(["service", "install"])
        .run()
        .expect_code(0);
    assert!(data.join("man/man1/airlock-exec.1").is_file());
    assert!(data.join("bash-completion/completions/airlock").is_file());
    assert!(data.join("zsh/site-functions/_airlockd").is_file());
    assert!(config.join("fish/completions/airlockd.fish").is_file());
    assert!(config.join("systemd/user/airlock.socket").is_file());
    assert_eq!(tree(&world.home), BTreeSet::new(), "wrote under HOME despite XDG_*_HOME");
}

#[test]
fn install_without_a_user_manager_writes_nothing() {
    // No systemctl on PATH at all.
    let world = World::new();
    let empty = world.tmp.path().join("emptybin");
    std::fs::create_dir_all(&empty).unwrap();
    let run = service(&world, empty.to_str().unwrap(), &["install"], "").expect_code(125);
    assert!(
        run.stderr().contains("cannot run `systemctl --user show-environment`"),
        "{}",
        run.stderr()
    );
    assert!(run.stderr().contains("nothing was written"), "{}", run.stderr());
    assert_eq!(tree(&world.home), BTreeSet::new());
    assert!(!run.stdout().contains("# writing"), "{}", run.stdout());

    // A systemctl that cannot reach a user manager (what a container's says).
    let fakebin = fake_systemctl(&world);
    let path = format!("{}:/usr/bin:/bin", fakebin.display());
    let run = service(&world, &path, &["install"], "show-environment").expect_code(125);
    assert!(run.stderr().contains("Failed to connect to bus"), "{}", run.stderr());
    assert!(run.stderr().contains("no systemd user manager is reachable"), "{}", run.stderr());
    assert_eq!(tree(&world.home), BTreeSet::new());
    assert_eq!(systemctl_log(&fakebin), ["--user show-environment"]);
}

#[test]
fn install_failing_after_writing_takes_every_file_back() {
    let world = World::new();
    let fakebin = fake_systemctl(&world);
    let path = format!("{}:/usr/bin:/bin", fakebin.display());
    // An older install's unit and an unrelated file beside it: the unit gets its old bytes
    // back, the other file and the directories that existed stay.
    let old_unit = world.write(
        world.home.join(".config/systemd/user/airlock.service"),
        "[Service]\nExecStart=/old/airlockd\n",
    );
    let other = world.write(world.home.join(".config/systemd/user/other.service"), "x\n");
    let before = tree(&world.home);

    let run = service(&world, &path, &["install"], "enable").expect_code(125);
    assert!(
        run.stderr().contains("`systemctl --user enable --now airlock.socket` failed"),
        "{}",
        run.stderr()
    );
    assert!(run.stderr().contains("took back the"), "{}", run.stderr());
    assert!(run.stdout().contains("# writing"), "it did write before failing: {}", run.stdout());
    assert_eq!(tree(&world.home), before, "files left behind by a failed install");
    assert_eq!(std::fs::read_to_string(&old_unit).unwrap(), "[Service]\nExecStart=/old/airlockd\n");
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "x\n");
    assert!(!world.home.join(".local").exists(), "a directory the install made is left");
    // The manager is told to forget the units it may have read.
    assert_eq!(systemctl_log(&fakebin).last().map(String::as_str), Some("--user daemon-reload"));

    // A write that fails half-way (a directory where a completion file goes) also undoes.
    std::fs::create_dir_all(world.home.join(".config/fish/completions/airlockd.fish")).unwrap();
    let before = tree(&world.home);
    let run = service(&world, &path, &["install"], "").expect_code(125);
    assert!(run.stderr().contains("airlockd.fish"), "{}", run.stderr());
    assert_eq!(tree(&world.home), before);
    assert_eq!(std::fs::read_to_string(&old_unit).unwrap(), "[Service]\nExecStart=/old/airlockd\n");
}

#[test]
fn install_review_adds_the_personal_review_plane_and_dry_run_writes_nothing() {
    let world = World::new();
    let fakebin = fake_systemctl(&world);
    let path = format!("{}:/usr/bin:/bin", fakebin.display());
    let units = world.home.join(".config/systemd/user");

    // --dry-run prints both review units whole and touches nothing.
    let run = service(&world, &path, &["install", "--review", "--dry-run"], "").expect_code(0);
    assert_eq!(tree(&world.home), BTreeSet::new(), "--dry-run wrote:\n{}", run.stdout());
    assert!(systemctl_log(&fakebin).is_empty(), "--dry-run ran systemctl");
    assert!(run.stdout().contains("ListenStream=127.0.0.44:8443"), "{}", run.stdout());
    assert!(
        run.stdout().contains("# would run: systemctl --user enable --now airlock-review.socket"),
        "{}",
        run.stdout()
    );

    let run = service(&world, &path, &["install", "--review"], "").expect_code(0);
    let mut want = expected_install(&world.home);
    want.insert(".config/systemd/user/airlock-review.socket".into());
    want.insert(".config/systemd/user/airlock-review.service".into());
    assert_eq!(tree(&world.home), want, "{}", run.stdout());
    let socket = std::fs::read_to_string(units.join("airlock-review.socket")).unwrap();
    for key in ["ListenStream=127.0.0.44:8443", "FileDescriptorName=review", "Accept=no"] {
        assert!(socket.lines().any(|l| l == key), "review socket lacks {key}:\n{socket}");
    }
    let service_unit = std::fs::read_to_string(units.join("airlock-review.service")).unwrap();
    let airlockd = std::fs::canonicalize(bin("airlockd")).unwrap();
    let data_dir = world.home.join(".local/share/airlock/review");
    let exec = format!("ExecStart={} review --data-dir {}", airlockd.display(), data_dir.display());
    assert!(service_unit.lines().any(|l| l == exec), "want {exec}:\n{service_unit}");
    assert_eq!(
        systemctl_log(&fakebin),
        [
            "--user show-environment",
            "--user daemon-reload",
            "--user enable --now airlock.socket",
            "--user enable --now airlock-review.socket"
        ]
    );
    // The way on is printed: the store, then the exact login line.
    assert!(
        run.stdout().contains("airlock login --server http://127.0.0.44:8443 --token-stdin"),
        "{}",
        run.stdout()
    );

    let run = service(&world, &path, &["uninstall", "--review"], "").expect_code(0);
    assert_eq!(tree(&world.home), BTreeSet::new(), "uninstall left files:\n{}", run.stdout());
    assert!(
        systemctl_log(&fakebin)
            .contains(&"--user disable --now airlock-review.socket airlock-review.service".into())
    );
}
