//! The review log from the client's side (docs/evidence.md "Clients witness", "Exports"),
//! against a real `airlockd review` on loopback: `airlock login --server` pins the log key
//! (and refuses another one), `airlock publish` witnesses every run, `airlock verify` checks
//! exports (a changed byte, truncation) and checkpoints (a split view). With PostgreSQL, an
//! owner who switches the triggers off and edits or deletes an event row is caught by the next
//! `airlock publish` (exit 125, the event named) and by `airlock verify` on a fresh export.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock::tlog::note::{Checkpoint, NoteSigner};
use serde_json::Value;

use crate::review_support::{PgDb, Server, StoreSel, get, user_with_token};
use crate::support::{Run, World, airlock_stdin};

/// A developer logged in to a review server that keeps a signed log, with a repo `app`.
struct Dev {
    world: World,
    store: StoreSel,
    server: Option<Server>,
    base: String,
    port: u16,
    token: String,
    repo: PathBuf,
}

impl Dev {
    fn new(world: World, store: StoreSel, extra: &[&str]) -> Self {
        let token = user_with_token(&world, &store, "dev@example.test", "member");
        let server = Server::start(&world, &store, extra);
        let repo = world.repo("app");
        let (base, port) = (server.base.clone(), server.port);
        Self { world, store, server: Some(server), base, port, token, repo }
    }

    fn login(&self, extra: &[&str]) -> Run {
        let mut args = vec!["login", "--server", &self.base, "--token-stdin"];
        args.extend_from_slice(extra);
        airlock_stdin(&self.world, self.world.tmp.path(), &args, &format!("{}\n", self.token))
    }

    /// A developer on a fresh PostgreSQL store whose server signs with a new log key (the
    /// database is returned for the owner's edits); `None` when PostgreSQL is not there
    /// outside CI ([`PgDb::create`]).
    fn on_postgres() -> Option<(PgDb, Self)> {
        let db = PgDb::create()?;
        let world = World::new();
        db.migrate(&world);
        let key = world.tmp.path().join("log.key");
        world
            .airlockd(world.tmp.path())
            .args(["review", "log-key", "init", "--out"])
            .args([&key])
            .run()
            .expect_code(0);
        let key_s = key.to_str().unwrap().to_string();
        let dev = Dev::new(world, StoreSel::Pg(db.runtime_url.clone()), &["--log-key", &key_s]);
        Some((db, dev))
    }

    /// Restarts the server on its port and store with other arguments.
    fn restart(&mut self, extra: &[&str]) {
        drop(self.server.take());
        self.server = Some(Server::start_on(&self.world, &self.store, extra, self.port));
    }

    /// Appends audit lines `ids` (hosts `host-<id>.example`) to the repo's log.
    fn audit(&self, ids: &[&str]) {
        let dir = self.world.home.join(".airlock/logs/app");
        std::fs::create_dir_all(&dir).unwrap();
        let canon = std::fs::canonicalize(&self.repo).unwrap();
        std::fs::write(dir.join(".repo-path"), format!("{}\n", canon.display())).unwrap();
        let mut text = String::new();
        for (n, id) in ids.iter().enumerate() {
            text.push_str(&format!(
                "{{\"ts\":\"2026-07-24T18:03:{:02}.905Z\",\"repo\":\"app\",\"host\":\"host-{id}.example\",\"method\":\"CONNECT\",\"allowed\":false,\"id\":\"{id}\",\"session\":\"s\",\"boot\":\"b\",\"seq\":{n},\"reason\":\"not_allowed\"}}\n",
                n % 60
            ));
        }
        use std::io::Write;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("audit-2026-07-24.jsonl"))
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    fn publish(&self) -> Run {
        self.world.airlock(&self.repo).args(["publish", "--json"]).run()
    }

    fn publish_ok(&self) -> Value {
        let run = self.publish();
        assert_eq!(run.code(), 0, "stdout:\n{}\nstderr:\n{}", run.stdout(), run.stderr());
        serde_json::from_str(run.stdout().trim()).unwrap()
    }

    fn api(&self, path: &str) -> Value {
        let r = get(&self.base, &self.token, path, &[]);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        r.json()
    }

    /// Waits until the server's checkpoint covers `n` leaves; its answer.
    fn covered(&self, n: u64) -> Value {
        let until = Instant::now() + Duration::from_secs(90);
        loop {
            let r = get(&self.base, &self.token, "/api/v1/log/checkpoint", &[]);
            if r.status == 200 && r.json()["tree_size"].as_u64().unwrap_or(0) >= n {
                return r.json();
            }
            assert!(Instant::now() < until, "the log never covered {n} leaves: {}", r.body);
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A fresh export of the caller's history, saved to a file.
    fn export(&self, name: &str) -> PathBuf {
        let r = get(&self.base, &self.token, "/api/v1/export", &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        let p = self.world.tmp.path().join(name);
        std::fs::write(&p, r.body.as_bytes()).unwrap();
        p
    }

    fn verify(&self, args: &[&str]) -> Run {
        self.world.airlock(self.world.tmp.path()).args(["verify"]).args(args).run()
    }

    fn held(&self) -> Option<String> {
        std::fs::read_to_string(self.world.home.join(".airlock/publish/log-checkpoint")).ok()
    }
}

fn out(run: &Run) -> String {
    format!("code {}\nstdout:\n{}\nstderr:\n{}", run.code(), run.stdout(), run.stderr())
}

/// A checkpoint of `size` with `root`, signed with the server's own key file (what a server
/// showing one client another tree would sign).
fn forged_note(key_file: &Path, size: u64, root: [u8; 32], time: u64) -> String {
    let signer = NoteSigner::parse(&std::fs::read_to_string(key_file).unwrap()).unwrap();
    let cp = Checkpoint {
        origin: signer.name().to_string(),
        size,
        root,
        extensions: vec![format!("time {time}")],
    };
    signer.sign_note(&cp.body()).unwrap()
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

#[test]
fn the_log_key_is_pinned_publish_witnesses_and_verify_checks_exports_and_checkpoints() {
    let world = World::new();
    let store_dir = world.tmp.path().join("store");
    let mut dev = Dev::new(world, StoreSel::Embedded(store_dir.clone()), &[]);
    let key_file = store_dir.join("log.key");

    // Login pins the key the server serves.
    let run = dev.login(&[]);
    assert_eq!(run.code(), 0, "{}", out(&run));
    let served = dev.api("/api/v1/log/key")["key"].as_str().unwrap().to_string();
    assert!(run.stdout().contains(&format!("review-log key pinned: {served}")), "{}", out(&run));
    let who = dev.world.airlock(dev.world.tmp.path()).args(["whoami", "--offline"]).run();
    assert!(who.stdout().contains(&format!("log key: {served}")), "{}", out(&who));

    // Publish witnesses: receipts written, the checkpoint held, own events re-fetched.
    let ids = ["e1", "e2", "e3", "e4", "e5"];
    dev.audit(&ids);
    let r = dev.publish_ok();
    assert_eq!(r["created"], 5, "{r}");
    let log = &r["log"];
    assert_eq!(log["events_checked"], 5, "{r}");
    assert_eq!(
        log["inclusion_checked"].as_u64().unwrap() + log["not_yet_covered"].as_u64().unwrap(),
        5,
        "{r}"
    );
    assert!(dev.held().is_some());
    let receipts = std::fs::read_dir(dev.world.home.join(".airlock/publish/receipts"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect::<String>();
    assert_eq!(receipts.lines().count(), 5, "{receipts}");
    let first: Value = serde_json::from_str(receipts.lines().next().unwrap()).unwrap();
    assert!(first["leaf_index"].is_u64() && first["payload_sha256"].is_string(), "{first}");

    // The next run (nothing new to send) still checks the log, from the held checkpoint.
    dev.covered(5);
    let r = dev.publish_ok();
    assert!(r["log"]["from_size"].is_u64(), "{r}");
    assert_eq!(r["log"]["inclusion_checked"], 5, "{r}");
    assert!(r["log"]["witnesses"].as_u64().unwrap() >= 1, "{r}");

    // A fresh export verifies offline.
    let held_size: u64 = dev.held().unwrap().lines().nth(1).unwrap().parse().unwrap();
    let export = dev.export("export.jsonl");
    let run = dev.verify(&[export.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{}", out(&run));
    assert!(run.stdout().starts_with("verified:"), "{}", out(&run));
    let run = dev.verify(&["--json", export.to_str().unwrap()]);
    let v: Value = serde_json::from_str(run.stdout().trim()).unwrap();
    // Our five events, and the record of the export itself once covered.
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["verified"].as_u64().unwrap() >= 5, "{v}");

    // One byte changed in e3's payload: named by id and leaf.
    let text = std::fs::read_to_string(&export).unwrap();
    let changed = dev.world.tmp.path().join("changed.jsonl");
    std::fs::write(&changed, text.replace("host-e3.example", "host-e3.exampla")).unwrap();
    let run = dev.verify(&[changed.to_str().unwrap()]);
    assert_eq!(run.code(), 1, "{}", out(&run));
    assert!(run.stderr().contains("egress/e3 at leaf"), "{}", out(&run));
    // Truncated: the end line is gone.
    let cut = dev.world.tmp.path().join("cut.jsonl");
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&cut, lines[..lines.len() - 1].join("\n") + "\n").unwrap();
    let run = dev.verify(&[cut.to_str().unwrap()]);
    assert_eq!(run.code(), 1, "{}", out(&run));
    assert!(run.stderr().contains("export truncated"), "{}", out(&run));
    // Not an export, or no key: cannot check.
    let run = dev.verify(&[key_file.to_str().unwrap()]);
    assert_eq!(run.code(), 125, "{}", out(&run));

    // A colleague's checkpoint: the server's current one agrees with ours.
    let cp_file = dev.world.tmp.path().join("colleague.checkpoint");
    let current = dev.api("/api/v1/log/checkpoint");
    std::fs::write(&cp_file, current["checkpoint"].as_str().unwrap()).unwrap();
    let run = dev.verify(&["--checkpoint", cp_file.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{}", out(&run));
    // A split view: a tree of the held size with another root, signed with the server's key.
    std::fs::write(&cp_file, forged_note(&key_file, held_size, [7; 32], now())).unwrap();
    let run = dev.verify(&["--checkpoint", cp_file.to_str().unwrap()]);
    assert_eq!(run.code(), 1, "{}", out(&run));
    assert!(run.stderr().contains("SPLIT VIEW"), "{}", out(&run));
    assert!(run.stderr().contains("held:") && run.stderr().contains("other:"), "{}", out(&run));
    // A larger forked tree: the server cannot prove it consistent with ours.
    std::fs::write(&cp_file, forged_note(&key_file, held_size + 3, [9; 32], now())).unwrap();
    let run = dev.verify(&["--checkpoint", cp_file.to_str().unwrap()]);
    assert_eq!(run.code(), 1, "{}", out(&run));
    assert!(run.stderr().contains("SPLIT VIEW"), "{}", out(&run));
    // Signed by another key: forged.
    let other = dev.world.tmp.path().join("other.key");
    dev.world
        .airlockd(dev.world.tmp.path())
        .args(["review", "log-key", "init", "--out"])
        .args([&other])
        .run()
        .expect_code(0);
    std::fs::write(&cp_file, forged_note(&other, held_size, [7; 32], now())).unwrap();
    let run = dev.verify(&["--checkpoint", cp_file.to_str().unwrap()]);
    assert_eq!(run.code(), 1, "{}", out(&run));
    assert!(run.stderr().contains("does not verify"), "{}", out(&run));

    // The server comes back with another log key: the login is refused until accepted.
    let other_s = other.to_str().unwrap().to_string();
    dev.restart(&["--log-key", &other_s]);
    let run = dev.login(&[]);
    assert_eq!(run.code(), 1, "{}", out(&run));
    assert!(run.stderr().contains("--accept-new-log-key"), "{}", out(&run));
    let who = dev.world.airlock(dev.world.tmp.path()).args(["whoami", "--offline"]).run();
    assert!(who.stdout().contains(&served), "the old pin stays: {}", out(&who));
    // Publish keeps checking against the old pin: once the server signs with its new key (the
    // next batch), its checkpoint does not verify.
    dev.audit(&["e6"]);
    let run = dev.publish();
    assert_eq!(run.code(), 125, "{}", out(&run));
    assert!(run.stderr().contains("does not verify with the pinned log key"), "{}", out(&run));
    let run = dev.login(&["--accept-new-log-key"]);
    assert_eq!(run.code(), 0, "{}", out(&run));
    assert!(dev.world.home.join(".airlock/publish/retired").is_dir());
    assert!(dev.held().is_none());
    dev.publish_ok();
    assert!(dev.held().is_some());
}

#[test]
fn an_owner_who_edits_or_deletes_an_event_row_is_caught_by_publish_and_verify() {
    let Some((db, dev)) = Dev::on_postgres() else { return };
    dev.login(&[]).expect_code(0);
    let ids = ["e1", "e2", "e3", "e4", "e5"];
    dev.audit(&ids);
    dev.publish_ok();
    dev.covered(5);
    // Pending receipts are resolved and proven.
    let r = dev.publish_ok();
    assert_eq!(
        (r["log"]["inclusion_checked"].as_u64(), r["log"]["events_checked"].as_u64()),
        (Some(5), Some(5)),
        "{r}"
    );
    let held_before = dev.held().unwrap();

    // The owner switches the triggers off and edits e3's payload in place.
    db.owner_sql(
        "SET session_replication_role = replica; \
         UPDATE events SET payload = replace(payload, 'host-e3.example', 'host-e3.exampla') \
         WHERE id = 'e3'",
    )
    .unwrap();
    let run = dev.publish();
    assert_eq!(run.code(), 125, "{}", out(&run));
    assert!(run.stderr().contains("THE REVIEW SERVER'S LOG IS INCONSISTENT"), "{}", out(&run));
    assert!(run.stderr().contains("egress/e3"), "{}", out(&run));
    assert!(
        run.stderr().contains("payload on the server is not what this client sent"),
        "{}",
        out(&run)
    );
    assert_eq!(dev.held().unwrap(), held_before, "the held checkpoint is not advanced");
    let evidence = dev.world.home.join(".airlock/publish/evidence");
    let dirs: Vec<_> = std::fs::read_dir(&evidence).unwrap().collect();
    assert_eq!(dirs.len(), 1);
    let dir = dirs[0].as_ref().unwrap().path();
    for f in ["held-checkpoint", "server-checkpoint", "answers.jsonl", "report.txt"] {
        assert!(dir.join(f).exists(), "{f} missing in {}", dir.display());
    }
    // A fresh export names it too.
    let export = dev.export("edited.jsonl");
    let run = dev.verify(&[export.to_str().unwrap()]);
    assert_eq!(run.code(), 1, "{}", out(&run));
    assert!(run.stderr().contains("egress/e3 at leaf"), "{}", out(&run));

    // Put back, then the owner deletes e4's row.
    db.owner_sql(
        "SET session_replication_role = replica; \
         UPDATE events SET payload = replace(payload, 'host-e3.exampla', 'host-e3.example') \
         WHERE id = 'e3'",
    )
    .unwrap();
    dev.publish_ok();
    db.owner_sql("SET session_replication_role = replica; DELETE FROM events WHERE id = 'e4'")
        .unwrap();
    let run = dev.publish();
    assert_eq!(run.code(), 125, "{}", out(&run));
    assert!(run.stderr().contains("egress/e4"), "{}", out(&run));
    assert!(run.stderr().contains("is gone"), "{}", out(&run));
    let export = dev.export("deleted.jsonl");
    let run = dev.verify(&[export.to_str().unwrap()]);
    assert_eq!(run.code(), 1, "{}", out(&run));
    assert!(run.stderr().contains("egress/e4"), "{}", out(&run));
    assert!(run.stderr().contains("is in the log but not in the store"), "{}", out(&run));
}

#[test]
fn an_owner_who_rolls_the_log_back_is_caught_as_truncation_and_a_replayed_head() {
    let Some((db, dev)) = Dev::on_postgres() else { return };
    dev.login(&[]).expect_code(0);
    dev.audit(&["e1", "e2", "e3"]);
    dev.publish_ok();
    let three = dev.covered(3)["checkpoint"].as_str().unwrap().to_string();
    dev.audit(&["e4", "e5"]);
    dev.publish_ok();
    dev.covered(5);
    dev.publish_ok();
    let held = dev.held().unwrap();
    assert!(held.contains("\n5\n"), "the client verified the tree of 5: {held}");

    // The owner rolls the log back to the head of 3: the two newest events, their leaves and
    // every later head are deleted with the triggers off. The server now serves the old head
    // of 3, signed with its own key and still perfectly valid on its own.
    db.owner_sql(
        "SET session_replication_role = replica; \
         DELETE FROM events WHERE id IN ('e4', 'e5'); \
         DELETE FROM log_leaves WHERE idx >= 3; \
         DELETE FROM log_checkpoints WHERE size > 3",
    )
    .unwrap();
    let served = dev.api("/api/v1/log/checkpoint");
    assert_eq!(served["tree_size"], 3, "{served}");
    let run = dev.publish();
    assert_eq!(run.code(), 125, "{}", out(&run));
    assert!(run.stderr().contains("THE REVIEW SERVER'S LOG IS INCONSISTENT"), "{}", out(&run));
    assert!(run.stderr().contains("smaller"), "{}", out(&run));
    assert_eq!(dev.held().unwrap(), held, "the held checkpoint is not moved back");

    // A colleague who only ever saw the old head compares it with ours: it is an earlier
    // head of the same log, which the server can no longer prove consistent with ours.
    let file = dev.world.tmp.path().join("colleague.note");
    std::fs::write(&file, &three).unwrap();
    let run = dev.verify(&["--checkpoint", file.to_str().unwrap()]);
    assert_eq!(run.code(), 1, "a split view, not 'cannot check': {}", out(&run));
    assert!(run.stderr().contains("SPLIT VIEW"), "{}", out(&run));
    assert!(run.stderr().contains("tree size 3"), "{}", out(&run));
}
