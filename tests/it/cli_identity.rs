//! `airlock login --email`, `whoami`, `logout` through the real binary (DESIGN §3).

use std::os::unix::fs::PermissionsExt;

use crate::support::World;

#[test]
fn login_whoami_logout() {
    let world = World::new();
    let cwd = world.tmp.path().to_path_buf();
    let run = world.airlock(&cwd).args(["whoami"]).run().expect_code(1);
    assert!(run.stderr().contains("not logged in"), "{}", run.stderr());

    let run =
        world.airlock(&cwd).args(["login", "--email", "dev@example.com"]).run().expect_code(0);
    assert!(
        run.stdout().starts_with("logged in as dev@example.com (user_id u_"),
        "{}",
        run.stdout()
    );
    let file = world.home.join(".airlock/identity.toml");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let dir = world.home.join(".airlock");
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);

    let who = world.airlock(&cwd).args(["whoami"]).run().expect_code(0).stdout();
    assert!(who.starts_with("email: dev@example.com\nuser_id: u_"), "{who}");
    let id = who.lines().nth(1).unwrap().trim_start_matches("user_id: ").to_owned();
    assert_eq!(id.len(), 18);
    assert!(id[2..].chars().all(|c| c.is_ascii_hexdigit()));

    // Same email: same id. Another email: a new id.
    world.airlock(&cwd).args(["login", "--email", "dev@example.com"]).run().expect_code(0);
    let again = world.airlock(&cwd).args(["whoami"]).run().expect_code(0).stdout();
    assert_eq!(again, who);
    world.airlock(&cwd).args(["login", "--email", "other@example.com"]).run().expect_code(0);
    let other = world.airlock(&cwd).args(["whoami"]).run().expect_code(0).stdout();
    assert!(!other.contains(&id), "{other}");

    let run = world.airlock(&cwd).args(["logout"]).run().expect_code(0);
    assert!(run.stdout().contains("logged out"), "{}", run.stdout());
    assert!(!file.exists());
    world.airlock(&cwd).args(["whoami"]).run().expect_code(1);
    world.airlock(&cwd).args(["logout"]).run().expect_code(0);

    // The id is stable (DESIGN §3): logging back in after logout gives the same one.
    world.airlock(&cwd).args(["login", "--email", "dev@example.com"]).run().expect_code(0);
    let back = world.airlock(&cwd).args(["whoami"]).run().expect_code(0).stdout();
    assert_eq!(back, who);
}

#[test]
fn readable_identity_files_are_refused() {
    let world = World::new();
    let cwd = world.tmp.path().to_path_buf();
    world.airlock(&cwd).args(["login", "--email", "dev@example.com"]).run().expect_code(0);
    let file = world.home.join(".airlock/identity.toml");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = world.airlock(&cwd).args(["whoami"]).run().expect_code(1);
    assert!(run.stderr().contains(&format!("chmod 600 {}", file.display())), "{}", run.stderr());
    // Login refuses to reuse it too, rather than silently overwriting the id.
    let run =
        world.airlock(&cwd).args(["login", "--email", "dev@example.com"]).run().expect_code(1);
    assert!(run.stderr().contains("chmod 600"), "{}", run.stderr());
    // policy check reads the identity (its review server is always blocked): a config error.
    let repo = world.repo("app");
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"a.test\"]\n");
    let run = world.airlock(&repo).args(["policy", "check", "a.test"]).run().expect_code(3);
    assert!(run.stderr().contains("chmod 600"), "{}", run.stderr());
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    world.airlock(&cwd).args(["whoami"]).run().expect_code(0);
}

#[test]
fn bad_email_addresses_are_refused_and_nothing_is_written() {
    let world = World::new();
    let cwd = world.tmp.path().to_path_buf();
    for bad in ["plain", "a@b", "a b@c.com", "@c.com", "a@@c.com"] {
        let run = world.airlock(&cwd).args(["login", "--email", bad]).run().expect_code(1);
        assert!(run.stderr().starts_with("airlock: "), "{}", run.stderr());
        assert!(run.stderr().contains("is not an email address"), "{}", run.stderr());
    }
    assert!(!world.home.join(".airlock/identity.toml").exists());
}

#[test]
fn identity_server_is_a_review_plane_host() {
    let world = World::new();
    let repo = world.repo("app");
    let file = world.write(
        world.home.join(".airlock/identity.toml"),
        "email = \"dev@example.com\"\nuser_id = \"u_0123456789abcdef\"\nserver = \"https://review.corp.test\"\n",
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"corp.test\"]\n");
    let run = world.airlock(&repo).args(["policy", "check", "--json", "review.corp.test"]).run();
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stdout().contains("\"reason\":\"review_plane\""), "{}", run.stdout());
    let who = world.airlock(&repo).args(["whoami", "--offline"]).run().expect_code(0).stdout();
    assert!(who.contains("server: https://review.corp.test"), "{who}");
    // A server identity without its token file (`airlock login --server` writes both):
    // whoami says the token is missing and how to log in again, without any connection.
    let run = world.airlock(&repo).args(["whoami"]).run().expect_code(1);
    assert!(run.stdout().contains("token: missing"), "{}", run.stdout());
    assert!(
        run.stderr().contains("airlock login --server https://review.corp.test"),
        "{}",
        run.stderr()
    );
}
