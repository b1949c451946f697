//! The terminal relay (SECURITY §4 "Terminal", §7; issue 11): escape sequences that make the
//! caller's terminal answer with data or act on the host never reach it, what TUIs need does,
//! `[terminal] clipboard` comes from the user and managed layers only, and input left on the
//! caller's terminal is discarded when the session ends. Every test drives the real binary
//! with its stdout on a pty the test owns: the master side reads exactly what the caller's
//! terminal would. Runs as root and, through `.ci/unprivileged` (filter `sandbox`), as an
//! unprivileged user; the `hold` bridge means nothing is sent anywhere.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::support::{PtyOutput, Sandbox, wait_until};

/// `printf` for each piece, with a pause between them so that each arrives at the relay as a
/// read of its own: a sequence split across pieces is split across reads.
fn printf_pieces(pieces: &[&[u8]]) -> String {
    let printf = |piece: &[u8]| {
        let mut fmt = String::new();
        for &b in piece {
            match b {
                b'%' | b'\\' | b'\'' => fmt.push_str(&format!("\\{b:03o}")),
                0x20..=0x7e => fmt.push(char::from(b)),
                _ => fmt.push_str(&format!("\\{b:03o}")),
            }
        }
        format!("printf '{fmt}'")
    };
    pieces.iter().map(|p| printf(p)).collect::<Vec<_>>().join("; sleep 0.1; ")
}

/// `sh -c SCRIPT` in the sandbox with stdout on a fresh pty (stdin and stderr are pipes):
/// the exit code and every byte the terminal received.
fn on_a_terminal(sb: &Sandbox, script: &str) -> (i32, Vec<u8>) {
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut cmd = sb.exec(&["sh", "-c", script]).cmd;
    cmd.stdin(Stdio::piped()).stdout(Stdio::from(pty.slave)).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // The command holds the parent's copy of the slave: without it, the child's exit closes
    // the terminal.
    drop(cmd);
    drop(child.stdin.take());
    let master = std::fs::File::from(pty.master);
    let terminal = PtyOutput::read(&master);
    let output = child.wait_with_output().unwrap();
    let seen = terminal.until_closed();
    let code = output.status.code().unwrap_or(-1);
    assert_eq!(code, 0, "{}\n{}", String::from_utf8_lossy(&output.stderr), seen.escape_ascii());
    (code, seen)
}

#[track_caller]
fn assert_bytes(seen: &[u8], expected: &[u8]) {
    assert_eq!(
        seen.escape_ascii().to_string(),
        expected.escape_ascii().to_string(),
        "what reached the terminal"
    );
}

#[test]
fn dangerous_escapes_split_across_writes_never_reach_the_terminal() {
    let sb = Sandbox::new("termfilter");
    let pieces: &[&[u8]] = &[
        // OSC 52 write, split inside its payload; then an OSC 52 read split inside its number.
        b"<1>\x1b]52;c;",
        b"U0VDUkVU\x07<2>\x1b]5",
        // CSI 21 t split inside its parameter; CSI 20 t; DECRQSS split after `$`.
        b"2;c;?\x07<3>\x1b[2",
        b"1t<4>\x1b[20t<5>\x1bP$",
        // OSC 50 font query; OSC 1337 (iTerm2 file download) split inside its payload.
        b"qm\x1b\\<6>\x1b]50;?\x07<7>\x1b]1337;File=name=cG9j:",
        // The UTF-8 C1 and raw 8-bit C1 spellings.
        b"aGk=\x07<8>\xc2\x9b21t\xc2\x9d52;c;?\xc2\x9c\x9b20t<9>",
        // DA and OSC 11 (background colour) queries pass: TUIs depend on them.
        b"\x1b[c<10>\x1b]1",
        b"1;?\x07<11>",
    ];
    let (_, seen) = on_a_terminal(&sb, &printf_pieces(pieces));
    assert_bytes(&seen, b"<1><2><3><4><5><6><7><8><9>\x1b[c<10>\x1b]11;?\x07<11>");
}

#[test]
fn clipboard_allow_in_the_user_layer_passes_osc52_writes_but_never_reads() {
    let sb = Sandbox::new("termclip");
    sb.world.write(
        sb.home().join(".airlock/config.toml"),
        "[network]\nallow = [\"example.test\"]\n[terminal]\nclipboard = \"allow\"\n",
    );
    let write: &[u8] = b"\x1b]52;c;SGVsbG8=\x07";
    let script = printf_pieces(&[b"<1>\x1b]52;c;SGVs", b"bG8=\x07<2>\x1b]52;c;?\x07<3>"]);
    let (_, seen) = on_a_terminal(&sb, &script);
    assert_bytes(&seen, &[b"<1>", write, b"<2><3>"].concat());
    // A deny in the managed layer wins over the user's allow.
    sb.world.write(&sb.world.managed, "[terminal]\nclipboard = \"deny\"\n");
    let (_, seen) = on_a_terminal(&sb, &script);
    assert_bytes(&seen, b"<1><2><3>");
}

#[test]
fn terminal_settings_in_a_repo_file_are_refused_even_when_trusted() {
    let sb = Sandbox::new("termrepo");
    let file = sb.repo.join(".airlock.toml");
    let settings = "[network]\nallow = [\"example.test\"]\n[terminal]\nclipboard = \"allow\"\n";
    let expected = format!(
        "{}:3:2: [terminal] is not allowed in the repo layer: it may only be set in \
         ~/.airlock/config.toml or the managed policy",
        file.display()
    );
    // Untrusted: refused before anything runs, and `policy trust` will not trust it.
    sb.world.write(&file, settings);
    let run = sb.exec(&["true"]).run().expect_code(125);
    assert!(run.stderr().contains(&expected), "{}", run.stderr());
    sb.world.airlock(&sb.repo).args(["policy", "trust"]).run().expect_code(3);
    // Trusted anyway (a record written for these bytes, as by an older airlock): still an
    // error, never applied.
    let valid = "[network]\nallow = [\"example.test\"]\n";
    sb.world.write(&file, valid);
    sb.trust();
    // The record, not the copy of the trusted bytes kept beside it (`<key>.content`).
    let record = std::fs::read_dir(sb.home().join(".airlock/trust"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_none_or(|e| e != "content"))
        .unwrap();
    let trust_bytes = |bytes: &str| {
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes.as_bytes()));
        let text = std::fs::read_to_string(&record).unwrap();
        let forged: Vec<String> =
            text.lines()
                .map(|l| {
                    if l.starts_with("digest") {
                        format!("digest = \"{digest}\"")
                    } else {
                        l.into()
                    }
                })
                .collect();
        std::fs::write(&record, forged.join("\n") + "\n").unwrap();
    };
    // The forged record works: an edited file it names applies without asking.
    let edited = format!("{valid}# edited\n");
    sb.world.write(&file, &edited);
    trust_bytes(&edited);
    sb.exec(&["true"]).run().expect_code(0);
    sb.world.write(&file, settings);
    trust_bytes(settings);
    let run = sb.exec(&["true"]).run().expect_code(125);
    assert!(run.stderr().contains(&expected), "{}", run.stderr());
}

#[test]
fn sandbox_input_left_on_the_callers_terminal_is_flushed_at_the_end() {
    let sb = Sandbox::new("termflush");
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave: OwnedFd = pty.slave;
    // Raw, as a shell's line editor has it: any byte waiting is readable, not only lines.
    let mut raw = nix::sys::termios::tcgetattr(slave.as_fd()).unwrap();
    nix::sys::termios::cfmakeraw(&mut raw);
    nix::sys::termios::tcsetattr(slave.as_fd(), nix::sys::termios::SetArg::TCSANOW, &raw).unwrap();
    // Read through a description of its own: the command's stdout stays blocking.
    let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_NONBLOCK;
    let input =
        nix::fcntl::open(&nix::unistd::ttyname(&slave).unwrap(), flags, Mode::empty()).unwrap();
    let mut master = std::fs::File::from(pty.master);
    let pending_input = || {
        let mut buf = [0u8; 256];
        match nix::unistd::read(&input, &mut buf) {
            Ok(n) => Some(buf[..n].to_vec()),
            Err(nix::errno::Errno::EAGAIN) => None,
            Err(e) => panic!("reading the caller's terminal: {e}"),
        }
    };
    // The check can see input: bytes typed before the session are readable.
    master.write_all(b"probe").unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || pending_input().is_some()),
        "typed input is not readable on the terminal"
    );

    // stdin a pipe, stdout the terminal: nothing in the session reads the terminal's input.
    let mut cmd = sb.exec(&["sh", "-c", "printf 'ready\\033[c'; sleep 1"]).cmd;
    cmd.stdin(Stdio::piped()).stdout(Stdio::from(slave.try_clone().unwrap()));
    cmd.stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    drop(child.stdin.take());
    let mut terminal = PtyOutput::read(&master);
    terminal.wait_for(b"ready\x1b[c");
    // The terminal answers the DA query, and something more is typed, while the session runs.
    master.write_all(b"\x1b[?62;22cecho injected\r").unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(
        pending_input().map(|b| b.escape_ascii().to_string()),
        None,
        "input written during the session survived it"
    );
}
