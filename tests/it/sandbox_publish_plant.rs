//! Across sessions (SECURITY §5, issue 16): what an agent leaves in its agent home reaches the
//! host's `airlock publish` only as data. Two steps, both real: a real `airlock run` session
//! (a stand-in `claude` running the test's script) plants, in the transcript directory, a
//! symlink to a host file, a symlinked directory holding a transcript-shaped host file, and a
//! FIFO named like a transcript; then the host's own `airlock publish` runs. It must publish the
//! agent's real transcript line, name each planted entry as not published, never hang on the
//! FIFO, and send no byte of the host files. Runs as root and, under `.ci/unprivileged`
//! (filter `sandbox`), as an unprivileged user.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::harness::{Harness, Options};
use crate::review_support::{Server, StoreSel, all_events, user_with_token};
use crate::support::{Run, World, airlock_stdin};

#[test]
fn what_an_agent_plants_in_its_home_is_never_followed_by_the_next_publish() {
    let world = World::new();
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    let store = StoreSel::Embedded(world.tmp.path().join("store"));
    let token = user_with_token(&world, &store, "dev@example.test", "member");
    let server = Server::start(&world, &store, &[]);
    airlock_stdin(
        &world,
        world.tmp.path(),
        &["login", "--server", &server.base, "--token-stdin"],
        &format!("{token}\n"),
    )
    .expect_code(0);

    // Host files shaped like transcripts, which publishing would accept if it followed a link.
    let marker = "HOST-SECRET-4b1d-never-published";
    let secret = world.write(
        world.home.join(".ssh/notes.jsonl"),
        &format!("{{\"type\":\"user\",\"uuid\":\"host-1\",\"message\":\"{marker}\"}}\n"),
    );
    let outside = world.tmp.path().join("outside");
    world.write(
        outside.join("host.jsonl"),
        &format!("{{\"type\":\"user\",\"uuid\":\"host-2\",\"message\":\"{marker}\"}}\n"),
    );

    // Step 1: the agent plants, inside a real session.
    let fakebin = world.home.join(".local/bin");
    world.write_executable(fakebin.join("claude"), "#!/bin/sh\nexec /bin/sh -c \"$1\"\n");
    let repo = world.repo("app");
    let h = Harness::start(&world, Options::default());
    let plant = format!(
        "mkdir -p ~/.claude/projects/-app && cd ~/.claude/projects/-app && \
         printf '%s\\n' '{{\"type\":\"user\",\"uuid\":\"agent-1\",\"message\":\"hello\"}}' > real.jsonl && \
         ln -s {s} evil.jsonl && ln -s {d} linkdir && mkfifo fifo.jsonl && echo planted",
        s = secret.display(),
        d = outside.display()
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .env("PATH", format!("{}:/usr/local/bin:/usr/bin:/bin", fakebin.display()))
        .args(["run", "claude", "--", plant.as_str()])
        .run()
        .expect_code(0);
    assert!(run.stdout().contains("planted"), "{}\n{}", run.stdout(), run.stderr());

    // Step 2: the host publishes. A FIFO opened for reading without O_NONBLOCK would block
    // forever: the run is bounded here so that shows as a failure, not a hung suite.
    let mut cmd = world.airlock(&repo).args(["publish"]).cmd;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            panic!("airlock publish hung on what the agent planted (the FIFO?)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let run = Run { output: child.wait_with_output().unwrap() };
    assert_eq!(run.code(), 0, "{}\n{}", run.stdout(), run.stderr());
    let err = run.stderr();
    assert!(err.contains("evil.jsonl: a symlink, never followed"), "{err}");
    assert!(err.contains("linkdir: a symlink, never followed"), "{err}");
    assert!(err.contains("fifo.jsonl: not a regular file, not published"), "{err}");

    let events = all_events(&server.base, &token, "");
    let ids: Vec<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
    assert!(ids.contains(&"agent-1"), "the agent's own transcript line was not published: {ids:?}");
    let dump = serde_json::to_string(&events).unwrap();
    assert!(!dump.contains(marker), "a host file reached the server through a planted link");
    assert!(!ids.contains(&"host-1") && !ids.contains(&"host-2"), "{ids:?}");
}
