//! `airlockd review init` and how the embedded store comes to exist: modes of everything it
//! writes (also once the server has written a batch), the printed token, refusals of a second
//! init and of data dirs that hold no store, and `init-tls --force` replacing a key.
//!
//! Every binary here runs under umask 000 (through `sh -c 'umask 000; exec …'`), so a mode
//! left to the umask or to SQLite's default (0644) shows up instead of being hidden by a
//! strict umask in the test environment.

use crate::review_support::{StoreSel, egress, get, post_events, token_for, write_file};
use crate::support::{TestCommand, World, bin};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `airlockd ARGS` with the World's environment and umask 000.
fn airlockd_umask0(world: &World) -> TestCommand {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "umask 000 && exec \"$0\" \"$@\""])
        .arg(bin("airlockd"))
        .current_dir(world.tmp.path())
        .env_clear()
        .env("HOME", &world.home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::null());
    TestCommand { cmd }
}

fn init(world: &World, dir: &Path, admin: &str) -> crate::support::Run {
    airlockd_umask0(world)
        .args(["review", "init", "--admin", admin, "--data-dir"])
        .args([dir])
        .run()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Every entry under `dir` (recursively) with its mode, sorted by path.
fn modes_under(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        out.push((p.clone(), mode(&p)));
        if p.is_dir() {
            out.extend(modes_under(&p));
        }
    }
    out.sort();
    out
}

fn assert_private(dir: &Path) {
    assert_eq!(mode(dir), 0o700, "data dir {}", dir.display());
    for (p, m) in modes_under(dir) {
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(m, want, "{} is {m:o}", p.display());
    }
}

/// A server on `dir` started under umask 000; killed on drop.
fn serve(world: &World, dir: &Path) -> crate::review_support::Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = world.tmp.path().join(format!("review-{port}.log"));
    let mut child = airlockd_umask0(world)
        .args(["review", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .args([dir])
        .cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("server exited {status}: {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    crate::review_support::Server { child, port, base: format!("http://127.0.0.1:{port}"), log }
}

/// Regression (issue 13, point 8): the trial store was created 0644/0755.
#[test]
fn trial_store_is_created_0700_and_0600_and_stays_so_when_served() {
    let world = World::new();
    let dir = world.tmp.path().join("store");
    let run = init(&world, &dir, "ana@example.test").expect_code(0);
    let token = run.stdout().trim().to_string();
    assert!(token.starts_with("alk_"), "stdout is the token alone: {:?}", run.stdout());
    assert_eq!(run.stdout().lines().count(), 1, "{}", run.stdout());
    assert!(!run.stderr().contains(&token), "the secret must not appear on stderr");
    assert!(run.stderr().contains("shown once"), "{}", run.stderr());
    assert!(dir.join("review.db").is_file());
    assert_private(&dir);

    // The token works: the admin posts a batch and it is stored under their name.
    let server = serve(&world, &dir);
    let batch = write_file(
        world.tmp.path(),
        "b.ndjson",
        format!("{}\n", egress("e1", "pastebin.com", false)).as_bytes(),
    );
    let r = post_events(&server.base, &token, &batch, "application/x-ndjson", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let me = get(&server.base, &token, "/api/v1/me", &[]);
    assert_eq!(me.status, 200, "{}", me.body);
    assert_eq!(me.json()["email"], "ana@example.test", "{}", me.body);
    assert_eq!(me.json()["role"], "admin", "{}", me.body);

    // While the server holds the store open in WAL mode, its -wal and -shm files exist.
    let names: Vec<String> = modes_under(&dir)
        .iter()
        .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"review.db-wal".to_string()), "{names:?}");
    assert!(names.contains(&"review.db-shm".to_string()), "{names:?}");
    assert_private(&dir);
    // An admin command on the live store creates nothing looser either.
    token_for(&world, &StoreSel::Embedded(dir.clone()), "ana@example.test");
    assert_private(&dir);
    drop(server);
    assert_private(&dir);
}

#[test]
fn second_init_refuses_and_leaves_the_store_alone() {
    let world = World::new();
    let dir = world.tmp.path().join("store");
    init(&world, &dir, "ana@example.test").expect_code(0);
    let before = std::fs::read(dir.join("review.db")).unwrap();
    let listing = modes_under(&dir);

    let again = init(&world, &dir, "mallory@example.test");
    assert_eq!(again.code(), 1, "{}", again.stderr());
    assert!(again.stdout().is_empty(), "no token for a refused init: {}", again.stdout());
    assert!(again.stderr().contains("already holds a review store"), "{}", again.stderr());
    assert!(again.stderr().contains(&dir.display().to_string()), "{}", again.stderr());
    assert_eq!(std::fs::read(dir.join("review.db")).unwrap(), before);
    assert_eq!(modes_under(&dir), listing);
    let users = world
        .airlockd(world.tmp.path())
        .args(["admin", "user", "list", "--data-dir"])
        .args([&dir])
        .run()
        .expect_code(0);
    assert!(!users.stdout().contains("mallory"), "{}", users.stdout());

    // A directory holding anything else is not taken over either.
    let other = world.tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    let run = init(&world, &other, "ana@example.test");
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("is not empty"), "{}", run.stderr());
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 1);

    // An existing empty directory (a service manager's StateDirectory) is initialized, and
    // made 0700.
    let empty = world.tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).unwrap();
    init(&world, &empty, "ana@example.test").expect_code(0);
    assert_private(&empty);
}

/// Regression (issue 13, point 8): a misspelled `--data-dir` silently created an empty store.
#[test]
fn misspelled_data_dir_is_refused_and_nothing_is_created() {
    let world = World::new();
    let dir = world.tmp.path().join("store");
    init(&world, &dir, "ana@example.test").expect_code(0);
    let typo = world.tmp.path().join("stroe");
    let empty = world.tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).unwrap();
    let empty_mode = mode(&empty);

    for target in [&typo, &empty] {
        let commands: [&[&str]; 4] = [
            &["admin", "user", "add", "--email", "bob@example.test", "--role", "member"],
            &["admin", "user", "list"],
            &["admin", "token", "create", "--user", "ana@example.test"],
            &["review", "migrate"],
        ];
        for args in commands {
            let run = airlockd_umask0(&world).args(args).args(["--data-dir"]).args([target]).run();
            assert_eq!(run.code(), 1, "{args:?} on {}: {}", target.display(), run.stderr());
            assert!(
                run.stderr().contains(&target.display().to_string())
                    && run.stderr().contains("airlockd review init"),
                "{args:?}: the error names the dir and the way out: {}",
                run.stderr()
            );
            assert!(run.stdout().is_empty(), "{args:?}: {}", run.stdout());
        }
        // The server refuses with 64 (no restart loop under systemd) before listening.
        let run = airlockd_umask0(&world)
            .args(["review", "--listen", "127.0.0.1:0", "--data-dir"])
            .args([target])
            .run();
        assert_eq!(run.code(), 64, "{}", run.stderr());
        assert!(run.stderr().contains("airlockd review init"), "{}", run.stderr());
    }
    assert!(!typo.exists(), "a misspelled data dir was created");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "the empty dir was filled");

    // A review.db that is not a store (here: empty) is refused too, and left as it was.
    std::fs::write(empty.join("review.db"), "").unwrap();
    let run =
        airlockd_umask0(&world).args(["admin", "user", "list", "--data-dir"]).args([&empty]).run();
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("not a review store"), "{}", run.stderr());
    assert_eq!(std::fs::metadata(empty.join("review.db")).unwrap().len(), 0);
    assert_eq!(mode(&empty), empty_mode, "a dir that holds no store is left as it was");

    // Without --data-dir the default location is not conjured up either.
    let run = airlockd_umask0(&world).args(["admin", "user", "list"]).run();
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("airlockd review init"), "{}", run.stderr());
    assert!(!world.home.join(".local/share/airlock").exists());
}

/// Regression (issue 13, point 8): `init-tls --force` left an old world-readable key.
#[test]
fn init_tls_force_leaves_no_world_readable_key() {
    let world = World::new();
    let tls = world.tmp.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    let key = tls.join("key.pem");
    let cert = tls.join("cert.pem");
    std::fs::write(&key, "old key\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&cert, "old cert\n").unwrap();
    let tls_args = |force: bool| {
        let mut a = vec!["review".to_string(), "init-tls".into(), "--cert".into()];
        a.push(cert.display().to_string());
        a.push("--key".into());
        a.push(key.display().to_string());
        if force {
            a.push("--force".into());
        }
        a
    };

    let run = airlockd_umask0(&world).args(tls_args(false)).run();
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("--force"), "{}", run.stderr());
    assert_eq!(std::fs::read_to_string(&key).unwrap(), "old key\n");

    airlockd_umask0(&world).args(tls_args(true)).run().expect_code(0);
    let new_key = std::fs::read_to_string(&key).unwrap();
    assert!(new_key.contains("PRIVATE KEY"), "{new_key}");
    assert!(std::fs::read_to_string(&cert).unwrap().contains("BEGIN CERTIFICATE"));
    // Only the two files remain (no temporary copy), and every file holding a key is 0600.
    let listing = modes_under(&tls);
    assert_eq!(listing.len(), 2, "{listing:?}");
    for (p, m) in listing {
        if std::fs::read_to_string(&p).unwrap().contains("PRIVATE KEY") {
            assert_eq!(m, 0o600, "{} is {m:o}", p.display());
        }
    }
    assert_eq!(mode(&key), 0o600);

    // A fresh pair under umask 000 gets a 0600 key as well.
    let fresh = world.tmp.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    airlockd_umask0(&world)
        .args(["review", "init-tls", "--cert"])
        .args([fresh.join("c.pem")])
        .args(["--key"])
        .args([fresh.join("k.pem")])
        .run()
        .expect_code(0);
    assert_eq!(mode(&fresh.join("k.pem")), 0o600);
}

/// A store made by an older version (0755 dir, 0644 database) is tightened when opened.
#[test]
fn a_loose_store_from_before_init_is_tightened_on_open() {
    let world = World::new();
    let dir = world.tmp.path().join("store");
    init(&world, &dir, "ana@example.test").expect_code(0);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir.join("review.db"), std::fs::Permissions::from_mode(0o644))
        .unwrap();
    let run = airlockd_umask0(&world)
        .args(["admin", "user", "list", "--data-dir"])
        .args([&dir])
        .run()
        .expect_code(0);
    assert!(run.stdout().contains("ana@example.test"), "{}", run.stdout());
    assert!(run.stderr().contains("readable by others"), "{}", run.stderr());
    assert_private(&dir);
}

#[test]
fn init_with_a_bad_admin_email_creates_nothing() {
    let world = World::new();
    let dir = world.tmp.path().join("store");
    let run = init(&world, &dir, "not-an-email");
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("not an email address"), "{}", run.stderr());
    assert!(run.stdout().is_empty(), "{}", run.stdout());
    assert!(!dir.exists(), "a refused init created {}", dir.display());
}
