//! `airlock login` (`--email` for a local identity, `--server` for a review plane),
//! `airlock whoami`, `airlock logout`: the identity file (DESIGN §3) and, for a server login,
//! the token and CA files beside it (`crate::remote::token`).

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{ArgGroup, Args};
use zeroize::Zeroizing;

use super::Context;
use crate::config::{self, fsutil, identity};
use crate::paths::Paths;
use crate::remote::{self, Client, RemoteError, token};

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("who").required(true).args(["email", "server"])))]
pub struct LoginArgs {
    /// Your email address; a stable local user id is generated for it (a local identity,
    /// replacing any review-server login)
    #[arg(long, value_name = "ADDRESS", conflicts_with = "server")]
    pub email: Option<String>,
    /// Log in to a review server (`https://HOST[:PORT]`; `http://` only for a loopback
    /// address): the token is checked with the server, then stored in ~/.airlock/token
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// Read the token from standard input instead of a no-echo prompt
    #[arg(long, requires = "server")]
    pub token_stdin: bool,
    /// Trust this CA certificate (PEM) for the server instead of the system's roots; it is
    /// copied to ~/.airlock/server-ca.pem and used by every later call
    #[arg(long, value_name = "FILE", requires = "server")]
    pub cacert: Option<PathBuf>,
    /// Accept a review-log key other than the one pinned at the last login to this server
    /// (only after its operator confirms the log key was changed on purpose)
    #[arg(long, requires = "server")]
    pub accept_new_log_key: bool,
}

#[derive(Debug, Args)]
pub struct WhoamiArgs {
    /// Show the stored identity without asking the server whether the token still works
    #[arg(long)]
    pub offline: bool,
}

fn paths(ctx: &Context<'_>) -> Result<Paths, i32> {
    Paths::from_env(ctx.env).map_err(|e| {
        eprintln!("airlock: {e}");
        1
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, i32> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
        eprintln!("airlock: cannot start the async runtime: {e}");
        1
    })
}

pub fn login(args: &LoginArgs, ctx: &Context<'_>) -> i32 {
    let paths = match paths(ctx) {
        Ok(p) => p,
        Err(code) => return code,
    };
    match (&args.email, &args.server) {
        (Some(email), _) => login_email(&paths, email),
        (None, Some(server)) => match login_server(&paths, server, args) {
            Ok(()) => 0,
            Err(msg) => {
                eprintln!("airlock: {msg}");
                1
            }
        },
        // clap's group makes one of them required.
        (None, None) => 2,
    }
}

fn login_email(paths: &Paths, email: &str) -> i32 {
    // A local identity replaces a server login whole: the server's token and CA would
    // otherwise linger, unused but readable by any later `publish`.
    let had_server = match identity::read(&paths.identity_file()) {
        Ok(Some(id)) => id.server,
        Ok(None) => None,
        Err(e) => {
            eprintln!("airlock: {e}");
            return 1;
        }
    };
    if let Err(e) = identity::validate_email(email.trim()) {
        eprintln!("airlock: {:?} is not an email address: {e}", email.trim());
        return 1;
    }
    if let Err(e) = remove_server_files(paths) {
        eprintln!("airlock: {e}");
        return 1;
    }
    match identity::login_email(paths, email) {
        Ok(id) => {
            if let Some(server) = had_server {
                println!("logged out of the review server {server} (token removed)");
            }
            println!(
                "logged in as {} (user_id {}); identity saved to {}",
                id.email,
                id.user_id,
                config::display_path(paths, &paths.identity_file())
            );
            0
        }
        Err(e) => {
            eprintln!("airlock: {e}");
            1
        }
    }
}

/// Removes the token and the stored CA; `true` when a token was there.
fn remove_server_files(paths: &Paths) -> Result<bool, token::TokenFileError> {
    let had = token::remove(&token::token_path(paths))?;
    token::remove(&token::server_ca_path(paths))?;
    Ok(had)
}

fn login_server(paths: &Paths, server: &str, args: &LoginArgs) -> Result<(), String> {
    // The URL first: a refused URL needs no token and makes no connection.
    let url = remote::ServerUrl::parse(server)
        .map_err(|e| format!("server URL {server:?} refused: {e}"))?;
    let ca_pem = match &args.cacert {
        None => None,
        Some(path) => {
            let bytes = fsutil::read_config(path, true)
                .map_err(|e| format!("cannot read the CA certificate {}: {e}", path.display()))?
                .ok_or_else(|| format!("the CA certificate {} does not exist", path.display()))?;
            remote::tls::parse_ca_pem(&bytes).map_err(|why| {
                format!("--cacert {}: {why}; give the server CA's certificate", path.display())
            })?;
            Some(bytes)
        }
    };
    let token = read_login_token(args.token_stdin)?;
    let client = Client::new(&url.to_string(), token.clone(), ca_pem.as_deref())
        .map_err(|e| e.to_string())?;
    let rt = runtime().map_err(|_| "cannot start the async runtime".to_owned())?;
    let me = rt.block_on(client.me()).map_err(|e| match e {
        RemoteError::Unauthorized { server, message } => format!(
            "{server} refused the token ({message}); check that you pasted the whole token \
             (`airlockd admin token create` prints it once); nothing was saved"
        ),
        other => format!("{other}; nothing was saved"),
    })?;
    identity::validate_email(&me.email).map_err(|why| {
        format!(
            "{} reports the email {:?}, which is not an address ({why}); nothing was saved",
            client.server(),
            me.email
        )
    })?;
    let log_key = rt.block_on(client.log_key()).map_err(|e| {
        format!(
            "cannot read the server's review-log key (GET /api/v1/log/key): {e}; nothing was saved"
        )
    })?;
    let log_key = log_key.map(|k| k.to_string());
    let before = identity::read(&paths.identity_file()).ok().flatten();
    check_log_pin(before.as_ref(), client.server(), log_key.as_deref(), args.accept_new_log_key)?;
    let id = identity::Identity {
        email: me.email.clone(),
        user_id: me.id.clone(),
        server: Some(client.server().to_owned()),
        role: Some(me.role.clone()),
        log_key: log_key.clone(),
    };
    // Another log (another server, or a key accepted anew): what this client witnessed of
    // the old one is kept aside, never compared with the new log.
    let pin_before = before.as_ref().and_then(|b| b.log_key.clone());
    if pin_before != log_key {
        retire_witness_state(paths)?;
    }
    store_login(paths, &token, ca_pem.as_deref(), &id)?;
    println!(
        "logged in to {} as {} (user_id {}, role {}); token saved to {}",
        client.server(),
        me.email,
        me.id,
        me.role,
        config::display_path(paths, &token::token_path(paths))
    );
    match &log_key {
        Some(k) => println!(
            "review-log key pinned: {k}\n`airlock publish` checks every checkpoint of this \
             server's log against it (docs/evidence.md)"
        ),
        None => println!(
            "the server keeps no signed log: no log key pinned, so `airlock publish` cannot \
             check the server's record (docs/evidence.md)"
        ),
    }
    Ok(())
}

/// Refuses a login whose server answers with another log key than the one pinned for it
/// (or none any more), unless `accept`.
fn check_log_pin(
    before: Option<&identity::Identity>,
    server: &str,
    new: Option<&str>,
    accept: bool,
) -> Result<(), String> {
    let Some(before) = before.filter(|b| b.server.as_deref() == Some(server)) else {
        return Ok(());
    };
    let Some(pinned) = before.log_key.as_deref() else { return Ok(()) };
    if accept || new == Some(pinned) {
        return Ok(());
    }
    let now = match new {
        Some(k) => format!("now answers with the log key {k}"),
        None => "now says it keeps no signed log".to_owned(),
    };
    Err(format!(
        "{server} {now}, but the key pinned at your last login is {pinned}. A changed log key \
         lets the server start a new history that hides the old one. Ask the server's operator \
         whether the key was changed on purpose; only then run `airlock login --server \
         {server} --accept-new-log-key`. Nothing was saved."
    ))
}

/// Moves `~/.airlock/publish/log-checkpoint` and `receipts/` (what was witnessed of the
/// previous log) to `~/.airlock/publish/retired/<UTC time>/`.
fn retire_witness_state(paths: &Paths) -> Result<(), String> {
    let air = paths.airlock_dir();
    let publish = crate::publish::state::dir(&air);
    let held = crate::evidence::held_path(&air);
    let receipts = crate::publish::receipts::dir(&air);
    let present: Vec<PathBuf> =
        [held, receipts].into_iter().filter(|p| p.symlink_metadata().is_ok()).collect();
    if present.is_empty() {
        return Ok(());
    }
    let stamp = crate::timefmt::rfc3339_ms(std::time::SystemTime::now()).replace(':', "");
    let dest = publish.join("retired").join(stamp);
    fsutil::private_dir(&dest).map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    for p in present {
        let name = p.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        std::fs::rename(&p, dest.join(name)).map_err(|e| {
            format!("cannot move {} to {}: {e}; nothing was saved", p.display(), dest.display())
        })?;
    }
    println!(
        "the previous review log's witness state was moved to {}",
        config::display_path(paths, &dest)
    );
    Ok(())
}

/// Writes the CA (or removes a stale one), the token, then the identity; a failure part way
/// removes what this call wrote, so a failed login leaves no half-written login behind.
fn store_login(
    paths: &Paths,
    tok: &str,
    ca_pem: Option<&[u8]>,
    id: &identity::Identity,
) -> Result<(), String> {
    let dir = paths.airlock_dir();
    fsutil::private_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let ca_path = token::server_ca_path(paths);
    let token_path = token::token_path(paths);
    let undo = || {
        let _ = token::remove(&token_path);
        let _ = token::remove(&ca_path);
    };
    let ca_result = match ca_pem {
        Some(pem) => fsutil::write_private(&ca_path, pem)
            .map_err(|e| format!("cannot write {}: {e}", ca_path.display())),
        None => token::remove(&ca_path).map(|_| ()).map_err(|e| e.to_string()),
    };
    if let Err(e) = ca_result
        .and_then(|()| token::write_token(&token_path, tok).map_err(|e| e.to_string()))
        .and_then(|()| identity::write(&paths.identity_file(), id).map_err(|e| e.to_string()))
    {
        undo();
        return Err(format!("{e}; nothing was saved"));
    }
    Ok(())
}

fn read_login_token(from_stdin: bool) -> Result<Zeroizing<String>, String> {
    if from_stdin {
        let raw = token::read_bounded(std::io::stdin().lock())
            .map_err(|e| format!("cannot read the token from standard input: {e}"))?;
        return token::parse_token(raw).map_err(|why| match why {
            token::TokenShapeError::Empty => {
                "the token read from standard input is empty; pipe the token in, e.g. \
                 `airlock login --server URL --token-stdin < token-file`"
                    .to_owned()
            }
            other => format!("the token read from standard input: {other}"),
        });
    }
    if !std::io::stdin().is_terminal() {
        return Err("standard input is not a terminal, so there is no way to prompt for the \
                    token; pass --token-stdin and pipe the token in"
            .to_owned());
    }
    let raw = prompt::read_secret("review server token: ")
        .map_err(|e| format!("cannot read the token from the terminal: {e}"))?;
    let Some(raw) = raw else {
        return Err("cancelled; nothing was saved".to_owned());
    };
    token::parse_token(raw).map_err(|why| format!("the token typed: {why}"))
}

/// The no-echo prompt: echo, canonical mode and signal keys are turned off so that Ctrl-C
/// arrives as a byte we act on, and the terminal is restored on every path (a guard).
pub(crate) mod prompt {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    use nix::sys::termios::{self, LocalFlags, SetArg};
    use zeroize::Zeroizing;

    struct Restore<'a, F: AsFd> {
        fd: &'a F,
        saved: termios::Termios,
    }

    impl<F: AsFd> Drop for Restore<'_, F> {
        fn drop(&mut self) {
            let _ = termios::tcsetattr(self.fd, SetArg::TCSADRAIN, &self.saved);
        }
    }

    /// `Ok(None)` when the user cancelled (Ctrl-C, or Ctrl-D on an empty line).
    pub fn read_secret(prompt: &str) -> std::io::Result<Option<Zeroizing<Vec<u8>>>> {
        let stdin = std::io::stdin();
        let fd = stdin.as_fd();
        let saved = termios::tcgetattr(fd).map_err(std::io::Error::from)?;
        let mut raw = saved.clone();
        raw.local_flags
            .remove(LocalFlags::ECHO | LocalFlags::ECHONL | LocalFlags::ICANON | LocalFlags::ISIG);
        raw.control_chars[libc::VMIN] = 1;
        raw.control_chars[libc::VTIME] = 0;
        // Echo off before the prompt shows: what is typed after seeing it is never echoed
        // (and TCSAFLUSH cannot discard it).
        termios::tcsetattr(fd, SetArg::TCSAFLUSH, &raw).map_err(std::io::Error::from)?;
        let guard = Restore { fd: &fd, saved };
        let mut stderr = std::io::stderr();
        let _ = write!(stderr, "{prompt}");
        let _ = stderr.flush();
        let mut buf = Zeroizing::new(Vec::with_capacity(super::token::MAX_TOKEN_BYTES + 1));
        let mut lock = stdin.lock();
        let result = loop {
            let mut b = [0u8; 1];
            match lock.read(&mut b) {
                Ok(0) => break Ok(if buf.is_empty() { None } else { Some(()) }),
                Ok(_) => match b[0] {
                    b'\r' | b'\n' => break Ok(Some(())),
                    0x03 => break Ok(None),
                    0x04 if buf.is_empty() => break Ok(None),
                    0x7f | 0x08 => {
                        buf.pop();
                    }
                    0x15 => buf.clear(),
                    c if buf.len() <= super::token::MAX_TOKEN_BYTES => buf.push(c),
                    _ => {}
                },
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        drop(lock);
        drop(guard);
        let _ = writeln!(stderr);
        result.map(|done| done.map(|()| buf))
    }
}

pub fn whoami(args: &WhoamiArgs, ctx: &Context<'_>) -> i32 {
    let paths = match paths(ctx) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let id = match identity::read(&paths.identity_file()) {
        Ok(Some(id)) => id,
        Ok(None) => {
            eprintln!(
                "airlock: not logged in; run `airlock login --server URL` (a review server) or \
                 `airlock login --email ADDRESS` (a local identity)"
            );
            return 1;
        }
        Err(e) => {
            eprintln!("airlock: {e}");
            return 1;
        }
    };
    let Some(server) = &id.server else {
        println!("email: {}", id.email);
        println!("user_id: {}", id.user_id);
        println!(
            "server: none (a local identity; `airlock login --server URL` to use a review server)"
        );
        return 0;
    };
    println!("server: {server}");
    println!("email: {}", id.email);
    println!("user_id: {}", id.user_id);
    println!("role: {}", id.role.as_deref().unwrap_or("unknown"));
    match &id.log_key {
        Some(k) => println!("log key: {k}"),
        None => println!("log key: none (the server kept no signed log at login)"),
    }
    if args.offline {
        println!("token: not checked (--offline)");
        return 0;
    }
    let client = match Client::from_login(&paths) {
        Ok(c) => c,
        Err(RemoteError::NotLoggedIn) => {
            println!("token: missing");
            eprintln!(
                "airlock: {} does not exist; run `airlock login --server {server}` again",
                config::display_path(&paths, &token::token_path(&paths))
            );
            return 1;
        }
        Err(e) => {
            println!("token: not usable");
            eprintln!("airlock: {e}");
            return 1;
        }
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match rt.block_on(client.me()) {
        Ok(me) => {
            println!("token: works");
            if me.id != id.user_id || me.email != id.email || Some(&me.role) != id.role.as_ref() {
                eprintln!(
                    "airlock: the server now reports {} (user_id {}, role {}); run \
                     `airlock login --server {server}` again to update the identity",
                    me.email, me.id, me.role
                );
            }
            0
        }
        Err(RemoteError::Unauthorized { message, .. }) => {
            println!("token: no longer works");
            eprintln!(
                "airlock: {server} refused the token ({message}): it was revoked or has \
                 expired; get a new token from the server's admin and run \
                 `airlock login --server {server}`"
            );
            1
        }
        Err(e) => {
            println!("token: not checked");
            eprintln!("airlock: {e}");
            1
        }
    }
}

pub fn logout(ctx: &Context<'_>) -> i32 {
    let paths = match paths(ctx) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let shown = config::display_path(&paths, &paths.identity_file());
    // The secret first: a logout interrupted part way never leaves a token behind an
    // identity that no longer names its server.
    let had_token = match remove_server_files(&paths) {
        Ok(had) => had,
        Err(e) => {
            eprintln!("airlock: {e}");
            return 1;
        }
    };
    match identity::logout(&paths) {
        Ok(true) => {
            if had_token {
                println!("logged out (removed {shown} and the review-server token)");
            } else {
                println!("logged out (removed {shown})");
            }
            0
        }
        Ok(false) if had_token => {
            println!("logged out (removed the review-server token)");
            0
        }
        Ok(false) => {
            println!("not logged in ({shown} does not exist)");
            0
        }
        Err(e) => {
            eprintln!("airlock: {e}");
            1
        }
    }
}
