//! `airlockd review …` and `airlockd admin …`: argument structs and their `run` functions,
//! the front of the review plane ([`crate::review`]). Every command takes the same store
//! selection: `--database URL` (PostgreSQL) or `--data-dir DIR` (embedded SQLite, the default).
//! An embedded store is created only by `airlockd review init`; every other command refuses a
//! data dir that holds none.

use crate::review::console::{self, auth as console_auth};
use crate::review::detect::Engine;
use crate::review::limits::{self, LimitsConfig, Rate};
use crate::review::server::{AppState, serve, settle_loop, tls_acceptor};
use crate::review::store::pg_tls::PgOptions;
use crate::review::store::postgres::{self, PgStore};
use crate::review::store::sqlite::SqliteStore;
use crate::review::store::{AnyStore, Store, StoreError, random_id};
use crate::review::{Role, token};
use clap::{Args, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Which store to use.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// PostgreSQL connection URL (e.g. `postgres://airlock_runtime@127.0.0.1/airlock`).
    #[arg(long, env = "AIRLOCK_REVIEW_DATABASE", value_name = "URL")]
    pub database: Option<String>,
    /// Directory of the embedded store (`review.db`, made by `airlockd review init`); used
    /// when no --database is given.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// CA certificate (PEM) that a TLS connection to PostgreSQL must chain to, when the URL
    /// names none with `sslrootcert=`; TLS itself is asked for by `sslmode=verify-full`.
    #[arg(long, env = "AIRLOCK_REVIEW_DATABASE_CA", value_name = "FILE")]
    pub database_ca: Option<PathBuf>,
    /// `statement_timeout` of every PostgreSQL statement on these connections (`0`: none).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub statement_timeout: std::time::Duration,
}

/// The embedded store's directory when no `--data-dir` is given.
fn default_data_dir() -> PathBuf {
    dirs::data_dir().unwrap_or_else(|| PathBuf::from(".")).join("airlock").join("review")
}

impl StoreArgs {
    fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }

    /// Opens the selected store; an embedded one must already exist (`airlockd review init`).
    pub async fn open(&self, pool: usize) -> Result<AnyStore, StoreError> {
        match &self.database {
            Some(url) => {
                let opts = PgOptions {
                    ca: self.database_ca.clone(),
                    statement_timeout: Some(self.statement_timeout).filter(|t| !t.is_zero()),
                };
                Ok(AnyStore::Pg(PgStore::connect_with(url, pool, &opts).await?))
            }
            None => {
                let dir = self.data_dir();
                Ok(AnyStore::Sqlite(
                    tokio::task::spawn_blocking(move || SqliteStore::open_existing(&dir))
                        .await
                        .map_err(|e| StoreError::Other(e.to_string()))??,
                ))
            }
        }
    }
}

/// `airlockd review`: serve the review API, or manage its store and TLS.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ReviewArgs {
    #[command(subcommand)]
    pub command: Option<ReviewCommand>,
    /// Address to listen on (e.g. 127.0.0.1:8443). Without it, the socket passed by the
    /// service manager under the name `review` is adopted.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    #[command(flatten)]
    pub store: StoreArgs,
    /// PEM certificate chain; with --tls-key the server speaks HTTPS only.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Directory of extra detection rule files (`*.toml`: `[[rule]]` tables added to the
    /// built-in pack, `[[correlate]]` tables setting the correlate pack's parameters).
    #[arg(long, value_name = "DIR")]
    pub rules_dir: Option<PathBuf>,
    /// Seconds a session must be quiet before its span and `seq` gaps are checked (they are
    /// also checked as soon as its end record arrives).
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pub settle_secs: u64,
    /// Ingest requests handled at once; more are answered 429 with Retry-After.
    #[arg(long, default_value_t = limits::INGEST_CONCURRENCY, value_name = "N")]
    pub ingest_concurrency: usize,
    /// Ingest requests one user may have in progress at once (at most --ingest-concurrency
    /// minus 1, so one member never holds every slot); more are answered 429. Advertised in
    /// the `X-Airlock-Ingest-Concurrency` response header.
    #[arg(long, default_value_t = limits::INGEST_CONCURRENCY_PER_USER, value_name = "N")]
    pub ingest_concurrency_per_user: usize,
    /// Seconds for a request's headers to arrive (a TLS handshake gets 10 s, or this if
    /// shorter); also how long a keep-alive connection may sit idle between requests.
    #[arg(long, default_value_t = limits::HEADER_TIMEOUT.as_secs(), value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout: u64,
    /// Seconds for an ingest body to arrive; a slower upload is answered 408 and its slot freed.
    #[arg(long, default_value_t = limits::BODY_TIMEOUT.as_secs(), value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout: u64,
    /// Connections served at once; more wait in the kernel's accept queue until one closes.
    #[arg(long, default_value_t = limits::MAX_CONNECTIONS, value_name = "N",
          value_parser = clap::builder::TypedValueParser::map(
              clap::value_parser!(u64).range(1..), |n| usize::try_from(n).unwrap_or(usize::MAX)))]
    pub max_connections: usize,
    /// Requests per second one token may make on average (token bucket); more are answered
    /// 429 with Retry-After.
    #[arg(long, default_value_t = limits::TOKEN_RATE.per_sec, value_name = "RPS",
          value_parser = positive_rate)]
    pub rate_limit_per_token: f64,
    /// Requests one token may make at once before --rate-limit-per-token applies.
    #[arg(long, default_value_t = limits::TOKEN_RATE.burst, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rate_limit_burst: u32,
    /// Failed authentications per second allowed from one address (IPv6: one /64) on
    /// average; past it, its requests are answered 429 before any token is checked.
    #[arg(long, default_value_t = limits::AUTH_FAILURE_RATE.per_sec, value_name = "RPS",
          value_parser = positive_rate)]
    pub auth_failure_rate: f64,
    /// Failed authentications allowed from one address at once before --auth-failure-rate
    /// applies.
    #[arg(long, default_value_t = limits::AUTH_FAILURE_RATE.burst, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub auth_failure_burst: u32,
    /// Reads (events, flags, export) one user may have in progress at once; more are answered
    /// 429 with Retry-After.
    #[arg(long, default_value_t = crate::review::reads::READS_PER_USER, value_name = "N")]
    pub read_concurrency_per_user: usize,
    /// Reads in progress at once over all users; more are answered 429 with Retry-After.
    #[arg(long, default_value_t = crate::review::reads::READS_TOTAL, value_name = "N")]
    pub read_concurrency: usize,
    /// PostgreSQL connections to keep (plus up to as many for ingest transactions).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub pool_size: usize,
    /// A console session ends after this long without a request (e.g. `30m`, `90s`).
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub console_idle_timeout: std::time::Duration,
    /// A console session ends this long after sign-in, however busy (e.g. `12h`).
    #[arg(long, default_value = "12h", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub console_max_age: std::time::Duration,
    /// Failed console sign-ins one account may have at once (one more is allowed a minute
    /// later); past it, sign-ins for that email are answered 429 with Retry-After.
    #[arg(long, default_value_t = crate::review::console::LOGIN_PER_ACCOUNT.burst, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub login_attempts_per_account: u32,
    /// Console sign-in attempts one address (IPv6: one /64) may make at once (one more every
    /// 2 s); past it, its sign-ins are answered 429 with Retry-After.
    #[arg(long, default_value_t = crate::review::console::LOGIN_PER_ADDRESS.burst, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub login_attempts_per_address: u32,
    /// Whether a requester may approve their own action gates: `never` (only the store's sole
    /// reviewer/admin or an admin's override), `managed` (also when the requesting client's
    /// managed layer, /etc/airlock/policy.toml, says `[gate] self_approve = true`), or `always`.
    /// Self-approvals are recorded `"self": true` either way (docs/gates.md).
    #[arg(long, default_value = "managed", value_name = "POLICY",
          value_parser = clap::builder::PossibleValuesParser::new(crate::review::gates::SelfApprove::NAMES))]
    pub gate_self_approve: String,
    /// The review log's signing key (`airlockd review log-key init`): checkpoints of the
    /// event log are signed with it (docs/evidence.md). Default with the embedded store:
    /// `<data dir>/log.key` when it exists; without a key the tree is kept but not signed.
    #[arg(long, value_name = "FILE")]
    pub log_key: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ReviewCommand {
    /// Create an embedded store with its admin and the admin's first token (printed once).
    /// (PostgreSQL: `review migrate`, then `airlockd admin`.)
    Init(InitArgs),
    /// Write a self-signed certificate and key for trials (rcgen).
    InitTls(InitTlsArgs),
    /// Apply schema migrations (PostgreSQL: as the owner role) and create partitions.
    Migrate(MigrateArgs),
    /// Create monthly partitions ahead; warn if the DEFAULT partition holds rows.
    Maintain(MaintainArgs),
    /// The review log's signing key (docs/evidence.md).
    #[command(subcommand)]
    LogKey(LogKeyCommand),
}

#[derive(Debug, Subcommand)]
pub enum LogKeyCommand {
    /// Write a new Ed25519 signing key (0600; never over an existing file) and print its
    /// verifier key, which clients pin at `airlock login`.
    Init(LogKeyInitArgs),
}

#[derive(Debug, Args)]
pub struct LogKeyInitArgs {
    /// Where to write the signer key.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// The log's name (its checkpoints' origin); default `airlock-review/<host name>`.
    #[arg(long, value_name = "ORIGIN")]
    pub name: Option<String>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Directory to create the store in (made 0700); it must not exist or be empty.
    /// Default: `$XDG_DATA_HOME/airlock/review`.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Email of the store's first user, made admin; its token is printed once on stdout.
    #[arg(long, value_name = "EMAIL")]
    pub admin: String,
}

#[derive(Debug, Args)]
pub struct InitTlsArgs {
    /// Certificate output path.
    #[arg(long, value_name = "FILE", default_value = "review-cert.pem")]
    pub cert: PathBuf,
    /// Private key output path (written 0600).
    #[arg(long, value_name = "FILE", default_value = "review-key.pem")]
    pub key: PathBuf,
    /// Names and addresses the certificate is valid for.
    #[arg(long = "name", value_name = "NAME", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])]
    pub names: Vec<String>,
    /// Overwrite existing files.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// PostgreSQL role the server runs as; its grants are set to exactly the runtime column
    /// of the grants table (docs/review.md), revoking anything older versions granted.
    #[arg(long, value_name = "ROLE")]
    pub runtime_role: Option<String>,
    /// PostgreSQL role `airlockd admin` may connect as: writes users, roles, tokens and
    /// revocations only (the admin column of the grants table).
    #[arg(long, value_name = "ROLE")]
    pub admin_role: Option<String>,
}

#[derive(Debug, Args)]
pub struct MaintainArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Months to create ahead of the current one.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub months_ahead: u32,
}

/// `airlockd admin`: users and tokens.
#[derive(Debug, Args)]
pub struct AdminArgs {
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Manage users.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user with a role (admin, reviewer, member).
    Add {
        #[arg(long)]
        email: String,
        #[arg(long, default_value = "member")]
        role: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List users.
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Change a user's role (appended; history kept).
    SetRole {
        #[arg(long)]
        email: String,
        #[arg(long)]
        role: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Set a user's console password (argon2id), read from stdin; ends their console sessions.
    SetPassword {
        #[arg(long)]
        email: String,
        /// Read the password from stdin (one trailing newline is dropped); required, so a
        /// password never appears in the process list or shell history.
        #[arg(long, required = true)]
        password_stdin: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Print a one-time link (`BASE/invite/<token>`, valid 7 days) whose page lets the user
    /// set their console password.
    Invite {
        #[arg(long)]
        email: String,
        /// The console's address as the user's browser reaches it, e.g. `https://review.example:8443`.
        #[arg(long, value_name = "BASE")]
        url: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token for a user; the secret is printed once on stdout, its id on stderr.
    Create {
        #[arg(long, value_name = "EMAIL")]
        user: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Revoke one token by id, or every token of a user.
    Revoke {
        /// Token id (as printed by `token create` / `token list`).
        #[arg(value_name = "TOKEN_ID", required_unless_present = "user")]
        id: Option<String>,
        /// Revoke all tokens of this user instead.
        #[arg(long, value_name = "EMAIL", conflicts_with = "id")]
        user: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List a user's token ids.
    List {
        #[arg(long, value_name = "EMAIL")]
        user: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    let msg = msg.to_string();
    eprintln!("airlockd: {msg}");
    if let Some(hint) = privilege_hint(&msg) {
        eprintln!("{hint}");
    }
    1
}

/// What to do about PostgreSQL's `42501 insufficient_privilege` (a store error renders as
/// `CODE: message`): usually `airlockd admin` run with the server's runtime role.
fn privilege_hint(msg: &str) -> Option<&'static str> {
    msg.contains("42501:").then_some(
        "hint: this database role may not do that. `airlockd admin` and `airlockd review migrate` \
         need the database owner or the admin role named by `airlockd review migrate \
         --admin-role`; the server's runtime role only writes events and flags (docs/review.md, \
         \"Grants (the contract)\")",
    )
}

/// Entry point of `airlockd review`. Returns the exit code.
pub fn run_review(args: ReviewArgs) -> i32 {
    match args.command {
        Some(ReviewCommand::Init(a)) => init(&a),
        Some(ReviewCommand::InitTls(a)) => init_tls(&a),
        Some(ReviewCommand::Migrate(a)) => migrate(&a),
        Some(ReviewCommand::Maintain(a)) => maintain(&a),
        Some(ReviewCommand::LogKey(LogKeyCommand::Init(a))) => log_key_init(&a),
        None => run_server(args),
    }
}

fn init(a: &InitArgs) -> i32 {
    if !a.admin.contains('@') {
        return fail(format!("--admin {:?} is not an email address", a.admin));
    }
    let dir = a.data_dir.clone().unwrap_or_else(default_data_dir);
    let rt = match runtime() {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let created = rt.block_on(SqliteStore::create(&dir, |store| async move {
        let user = store.add_user(&a.admin, Role::Admin).await?;
        let secret = token::Token::generate().map_err(|e| StoreError::Other(e.to_string()))?;
        let id = random_id();
        store.create_token(&id, &user.id, secret.hash()).await?;
        Ok((id, secret))
    }));
    match created {
        Ok((store, (id, secret))) => {
            let key_path = dir.join(LOG_KEY_FILE);
            match write_log_key(&key_path, &default_log_name()) {
                Ok(v) => eprintln!(
                    "wrote the review log's signing key {} (0600); verifier key {v}",
                    key_path.display()
                ),
                Err(e) => return fail(format!("the store was created, but {e}")),
            }
            eprintln!(
                "created the review store {} (directory 0700, files 0600) with admin {}; \
                 token id {id}; the token below is shown once and cannot be shown again \
                 (make another with `airlockd admin token create`)",
                store.path().display(),
                a.admin
            );
            println!("{}", secret.expose());
            // The way on (issue 16: a personal review plane in two commands). stderr, so that
            // `init | airlock login --token-stdin` hands over the token alone.
            eprintln!(
                "log in with it: airlock login --server {PERSONAL_REVIEW_URL} --token-stdin\n\
                 (paste the token, then Ctrl-D; or pipe this command into it. \
                 {PERSONAL_REVIEW_URL} is the personal review plane of `airlock service install \
                 --review`; for a server elsewhere use its https:// URL)"
            );
            0
        }
        Err(e) => fail(e),
    }
}

/// The log key file `airlockd review init` writes into an embedded store's directory.
pub const LOG_KEY_FILE: &str = "log.key";

/// The default log name: `airlock-review/<host name>` (characters a key name may hold).
fn default_log_name() -> String {
    let host = crate::config::machine_key::host_label();
    format!("airlock-review/{}", if host.is_empty() { "localhost" } else { &host })
}

/// Writes a new signer key to `path` (0600, failing if it exists); returns the verifier.
fn write_log_key(
    path: &std::path::Path,
    name: &str,
) -> Result<crate::tlog::note::NoteVerifier, String> {
    let signer = crate::tlog::note::NoteSigner::generate(name).map_err(|e| e.to_string())?;
    let mut text = signer.to_private_string();
    text.push('\n');
    crate::config::fsutil::create_private_new(path, text.as_bytes()).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "{} exists; a log key is never overwritten (clients pinned it): \
                 choose another path",
                path.display()
            )
        } else {
            format!("cannot write {}: {e}", path.display())
        }
    })?;
    Ok(signer.verifier())
}

fn log_key_init(a: &LogKeyInitArgs) -> i32 {
    let name = a.name.clone().unwrap_or_else(default_log_name);
    match write_log_key(&a.out, &name) {
        Ok(v) => {
            eprintln!(
                "wrote the review log's signing key to {} (0600; keep it secret and backed \
                 up: a new key is a new log that every client must re-pin). Serve with \
                 `airlockd review --log-key {}`; its verifier key:",
                a.out.display(),
                a.out.display()
            );
            println!("{v}");
            0
        }
        Err(e) => fail(e),
    }
}

/// Reads the signer key `airlockd review` signs with: `--log-key`, else the embedded
/// store's `log.key` when present. `Ok(None)`: no key.
fn load_log_key(args: &ReviewArgs) -> Result<Option<crate::tlog::note::NoteSigner>, String> {
    let (path, explicit) = match (&args.log_key, &args.store.database) {
        (Some(p), _) => (p.clone(), true),
        (None, None) => (args.store.data_dir().join(LOG_KEY_FILE), false),
        (None, Some(_)) => return Ok(None),
    };
    let bytes = match crate::config::fsutil::read_private(&path) {
        Ok(Some(b)) => zeroize::Zeroizing::new(b),
        Ok(None) if !explicit => return Ok(None),
        Ok(None) => return Err(format!("--log-key {}: no such file", path.display())),
        Err(e) => return Err(format!("log key {}: {e}", path.display())),
    };
    let text = String::from_utf8_lossy(&bytes);
    crate::tlog::note::NoteSigner::parse(&text)
        .map(Some)
        .map_err(|e| format!("log key {}: {e}", path.display()))
}

/// Where `airlock service install --review` makes the personal review plane listen
/// (service/systemd/user/airlock-review.socket).
const PERSONAL_REVIEW_URL: &str = "http://127.0.0.44:8443";

fn init_tls(a: &InitTlsArgs) -> i32 {
    for p in [&a.cert, &a.key] {
        if p.exists() && !a.force {
            return fail(format!("{} exists; pass --force to overwrite", p.display()));
        }
    }
    let ck = match rcgen::generate_simple_self_signed(a.names.clone()) {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot generate a certificate: {e}")),
    };
    let key_pem = zeroize::Zeroizing::new(ck.signing_key.serialize_pem());
    // Key first: a failure leaves no certificate without its key.
    if let Err(e) = replace_file(&a.key, key_pem.as_bytes(), 0o600) {
        return fail(format!("cannot write {}: {e}", a.key.display()));
    }
    if let Err(e) = replace_file(&a.cert, ck.cert.pem().as_bytes(), 0o644) {
        return fail(format!("cannot write {}: {e}", a.cert.display()));
    }
    eprintln!(
        "wrote {} and {} (key 0600; self-signed, for trials: clients need --cacert {})",
        a.cert.display(),
        a.key.display(),
        a.cert.display()
    );
    0
}

/// Writes `data` to a new file beside `path` created with `mode`, then renames it over
/// `path` (rename(2) is atomic), so an existing file — perhaps a world-readable old key — is
/// replaced, never rewritten in place under its old mode.
fn replace_file(path: &std::path::Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", random_id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut f| {
            // The umask may have removed bits; set exactly `mode`.
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.write_all(data)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn migrate(a: &MigrateArgs) -> i32 {
    let rt = match runtime() {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    rt.block_on(async {
        match &a.store.database {
            Some(url) => match postgres::migrate(
                url,
                &postgres::MigrateOptions {
                    runtime_role: a.runtime_role.clone(),
                    admin_role: a.admin_role.clone(),
                    ca: a.store.database_ca.clone(),
                },
            )
            .await
            {
                Ok(report) => {
                    report_maintenance(&report);
                    eprintln!("migrations applied");
                    0
                }
                Err(e) => fail(e),
            },
            None => match a.store.open(1).await {
                Ok(_) => {
                    eprintln!("embedded store at {} is up to date", a.store.data_dir().display());
                    0
                }
                Err(e) => fail(e),
            },
        }
    })
}

fn report_maintenance(r: &postgres::MaintainReport) {
    for c in &r.created {
        eprintln!("created partition {c}");
    }
    for w in &r.warnings {
        eprintln!("airlockd: warning: {w}");
    }
}

fn maintain(a: &MaintainArgs) -> i32 {
    let Some(url) = &a.store.database else {
        eprintln!("the embedded store needs no maintenance (no partitions); nothing to do");
        return 0;
    };
    let rt = match runtime() {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    rt.block_on(async {
        match postgres::maintain(url, a.months_ahead, a.store.database_ca.as_deref()).await {
            Ok(r) => {
                report_maintenance(&r);
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// A rate in requests per second: a finite number above zero.
fn positive_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a rate above zero (requests per second, e.g. 50 or 0.5)")),
    }
}

impl ReviewArgs {
    /// The console's settings from the flags.
    fn console_config(&self) -> console::ConsoleConfig {
        console::ConsoleConfig {
            sessions: console_auth::SessionLimits {
                idle: self.console_idle_timeout,
                max_age: self.console_max_age,
            },
            login_per_account: limits::Rate {
                burst: self.login_attempts_per_account,
                ..console::LOGIN_PER_ACCOUNT
            },
            login_per_address: limits::Rate {
                burst: self.login_attempts_per_address,
                ..console::LOGIN_PER_ADDRESS
            },
        }
    }

    /// The server's limits from the flags; warns about a clamped per-user share.
    fn limits(&self) -> LimitsConfig {
        let share =
            limits::per_user_share(self.ingest_concurrency, self.ingest_concurrency_per_user);
        if share != self.ingest_concurrency_per_user {
            eprintln!(
                "airlockd: warning: --ingest-concurrency-per-user {} used as {share} \
                 (at least 1, at most --ingest-concurrency {} minus 1, so one member never \
                 holds every slot)",
                self.ingest_concurrency_per_user, self.ingest_concurrency
            );
        }
        LimitsConfig {
            ingest_concurrency: self.ingest_concurrency,
            ingest_concurrency_per_user: share,
            header_timeout: std::time::Duration::from_secs(self.header_timeout),
            body_timeout: std::time::Duration::from_secs(self.body_timeout),
            max_connections: self.max_connections,
            token_rate: Rate { per_sec: self.rate_limit_per_token, burst: self.rate_limit_burst },
            auth_failure_rate: Rate {
                per_sec: self.auth_failure_rate,
                burst: self.auth_failure_burst,
            },
        }
    }
}

/// Raises the soft open-files limit to the hard one (the connection cap is meant to bind
/// first) and warns when --max-connections does not fit under it.
fn raise_nofile(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return };
    let soft = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    // Descriptors besides connections: the store's files, the listener, the runtime's own.
    const RESERVE: u64 = 64;
    if (max_connections as u64).saturating_add(RESERVE) > soft {
        eprintln!(
            "airlockd: warning: --max-connections {max_connections} does not fit under the \
             open-files limit {soft} (minus {RESERVE} for the store and runtime); accept will \
             fail with EMFILE first (it backs off and recovers, but lower --max-connections \
             or raise LimitNOFILE)"
        );
    }
}

fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

fn run_server(args: ReviewArgs) -> i32 {
    use crate::sys::activation::Family;
    // Adopt the activation socket before any thread exists (DESIGN §6).
    let std_listener = match args.listen {
        Some(addr) => match std::net::TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) => return fail(format!("cannot listen on {addr}: {e}")),
        },
        None => match crate::sys::activation::adopt_named("review", Family::Inet) {
            Ok(Some(fd)) => std::net::TcpListener::from(fd),
            Ok(None) => {
                eprintln!(
                    "airlockd: review: no --listen address and no activation socket named `review`; \
                     pass --listen 127.0.0.1:8443 or start airlock-review.socket"
                );
                return 64;
            }
            Err(e) => return fail(format!("cannot adopt the activation socket: {e}")),
        },
    };
    let local = match std_listener.local_addr() {
        Ok(a) => a,
        Err(e) => return fail(format!("listener has no address: {e}")),
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => match tls_acceptor(c, k) {
            Ok(a) => Some(a),
            Err(e) => return fail(e),
        },
        _ => {
            if !is_loopback(&local) {
                return fail(format!(
                    "refusing plain HTTP on non-loopback address {local}: tokens would cross the network in clear; \
                     pass --tls-cert and --tls-key (see `airlockd review init-tls`)"
                ));
            }
            eprintln!(
                "airlockd: warning: serving plain HTTP on {local} (loopback only); use TLS for anything else"
            );
            None
        }
    };
    let engine = match Engine::with_dir(args.rules_dir.as_deref()) {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    if let Err(e) = std_listener.set_nonblocking(true) {
        return fail(format!("cannot make the listener non-blocking: {e}"));
    }
    let log_key = match load_log_key(&args) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    let limits = args.limits();
    let console_config = args.console_config();
    raise_nofile(limits.max_connections);
    let rt = match runtime() {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    rt.block_on(async move {
        let store = match args.store.open(args.pool_size).await {
            Ok(s) => s,
            // No store at --data-dir: restarting cannot help (the unit prevents restarts on 64).
            Err(e @ StoreError::NotFound(_)) => {
                fail(e);
                return 64;
            }
            Err(e) => return fail(e),
        };
        let listener = match tokio::net::TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => return fail(format!("cannot use the listener: {e}")),
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        eprintln!(
            "airlockd: review plane listening on {scheme}://{local} ({} store, {} rules)",
            match store {
                AnyStore::Sqlite(_) => "embedded",
                AnyStore::Pg(_) => "PostgreSQL",
            },
            engine.rules().len()
        );
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
        let state = Arc::new(
            AppState::with_limits(store, engine, limits)
                .with_read_slots(args.read_concurrency_per_user, args.read_concurrency)
                .with_console(console_config)
                .with_gate_self_approve(
                    crate::review::gates::SelfApprove::parse(&args.gate_self_approve)
                        .unwrap_or_default(),
                )
                .with_log_key(log_key),
        );
        let sequencer = tokio::spawn(crate::review::log::sequencer_loop(Arc::clone(&state)));
        let expiry = tokio::spawn(crate::review::gate_api::expiry_loop(Arc::clone(&state)));
        let settle = tokio::spawn(settle_loop(
            Arc::clone(&state),
            std::time::Duration::from_secs(args.settle_secs.max(1)),
        ));
        serve(listener, tls, state, shutdown_signal()).await;
        settle.abort();
        expiry.abort();
        sequencer.abort();
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
        0
    })
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Entry point of `airlockd admin`. Returns the exit code.
pub fn run_admin(args: AdminArgs) -> i32 {
    let rt = match runtime() {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    rt.block_on(admin(args.command))
}

/// The password piped to `--password-stdin`, without one trailing newline.
fn read_password_stdin() -> Result<zeroize::Zeroizing<String>, String> {
    use std::io::Read;
    let mut pw = zeroize::Zeroizing::new(String::new());
    std::io::stdin()
        .take(64 * 1024)
        .read_to_string(&mut pw)
        .map_err(|e| format!("cannot read the password from stdin (is it UTF-8?): {e}"))?;
    let trimmed = pw.strip_suffix('\n').map(|p| p.strip_suffix('\r').unwrap_or(p));
    Ok(zeroize::Zeroizing::new(trimmed.unwrap_or(&pw).to_string()))
}

async fn open(store: &StoreArgs) -> Result<AnyStore, i32> {
    store.open(1).await.map_err(fail)
}

async fn find_user(s: &AnyStore, email: &str) -> Result<crate::review::User, i32> {
    match s.user_by_email(email).await {
        Ok(Some(u)) => Ok(u),
        Ok(None) => Err(fail(format!(
            "no user {email}; add one with `airlockd admin user add --email {email} --role member`"
        ))),
        Err(e) => Err(fail(e)),
    }
}

async fn admin(cmd: AdminCommand) -> i32 {
    let r: Result<i32, i32> = async {
        match cmd {
            AdminCommand::User(UserCommand::Add { email, role, store }) => {
                let role: Role = role.parse().map_err(fail)?;
                if !email.contains('@') {
                    return Err(fail(format!("{email:?} is not an email address")));
                }
                let s = open(&store).await?;
                let u = s.add_user(&email, role).await.map_err(fail)?;
                println!("{}\t{}\t{}", u.id, u.email, u.role);
                Ok(0)
            }
            AdminCommand::User(UserCommand::List { json, store }) => {
                let s = open(&store).await?;
                let users = s.list_users().await.map_err(fail)?;
                if json {
                    println!("{}", serde_json::to_string(&users).unwrap_or_default());
                } else {
                    for u in users {
                        println!("{}\t{}\t{}", u.id, u.email, u.role);
                    }
                }
                Ok(0)
            }
            AdminCommand::User(UserCommand::SetRole { email, role, store }) => {
                let role: Role = role.parse().map_err(fail)?;
                let s = open(&store).await?;
                let u = find_user(&s, &email).await?;
                s.set_role(&u.id, role).await.map_err(fail)?;
                eprintln!("{email} is now {role}");
                Ok(0)
            }
            AdminCommand::User(UserCommand::SetPassword { email, password_stdin: _, store }) => {
                let pw = read_password_stdin().map_err(fail)?;
                console_auth::check_new_password(&pw).map_err(|m| fail(format!("not set: {m}")))?;
                let s = open(&store).await?;
                let u = find_user(&s, &email).await?;
                let phc = tokio::task::spawn_blocking(move || console_auth::hash_password(&pw))
                    .await
                    .map_err(fail)?
                    .map_err(fail)?;
                s.set_password(&u.id, &phc).await.map_err(fail)?;
                eprintln!("console password set for {email}; their console sessions have ended");
                Ok(0)
            }
            AdminCommand::User(UserCommand::Invite { email, url, store }) => {
                let base = url.trim_end_matches('/');
                if !(base.starts_with("https://") || base.starts_with("http://")) {
                    return Err(fail(format!(
                        "--url {url:?} is not an http(s) address; give the console's base URL, \
                         e.g. https://review.example:8443"
                    )));
                }
                let s = open(&store).await?;
                let u = find_user(&s, &email).await?;
                let token = console_auth::new_secret().map_err(fail)?;
                let lifetime = console_auth::INVITE_LIFETIME;
                let expires = crate::review::now_micros() + lifetime.as_micros() as i64;
                s.create_invite(console_auth::secret_hash(&token), &u.id, expires)
                    .await
                    .map_err(fail)?;
                eprintln!(
                    "invite for {email} ({}): usable once, until {}; the link below is shown once",
                    u.role,
                    crate::review::format_micros(expires)
                );
                println!("{base}/invite/{}", token.as_str());
                Ok(0)
            }
            AdminCommand::Token(TokenCommand::Create { user, store }) => {
                let s = open(&store).await?;
                let u = find_user(&s, &user).await?;
                let t = token::Token::generate().map_err(fail)?;
                let id = random_id();
                s.create_token(&id, &u.id, t.hash()).await.map_err(fail)?;
                eprintln!(
                    "token id {id} for {} ({}); the secret below is shown once",
                    u.email, u.role
                );
                println!("{}", t.expose());
                Ok(0)
            }
            AdminCommand::Token(TokenCommand::Revoke { id, user, store }) => {
                let s = open(&store).await?;
                let ids: Vec<String> = match (id, user) {
                    (Some(id), _) => vec![id],
                    (None, Some(email)) => {
                        let u = find_user(&s, &email).await?;
                        s.list_tokens(&u.id)
                            .await
                            .map_err(fail)?
                            .into_iter()
                            .filter(|(_, revoked)| !revoked)
                            .map(|(id, _)| id)
                            .collect()
                    }
                    (None, None) => return Err(fail("name a token id or --user")),
                };
                for id in ids {
                    if !s.revoke_token(&id).await.map_err(fail)? {
                        return Err(fail(format!("no token with id {id}")));
                    }
                    eprintln!("revoked token {id}");
                }
                Ok(0)
            }
            AdminCommand::Token(TokenCommand::List { user, store }) => {
                let s = open(&store).await?;
                let u = find_user(&s, &user).await?;
                for (id, revoked) in s.list_tokens(&u.id).await.map_err(fail)? {
                    println!("{id}\t{}", if revoked { "revoked" } else { "active" });
                }
                Ok(0)
            }
        }
    }
    .await;
    r.unwrap_or_else(|code| code)
}
