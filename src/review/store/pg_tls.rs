//! How the review store reaches PostgreSQL: the connection string's TLS demands, read before
//! `tokio-postgres` sees the string (it knows only `disable`/`prefer`/`require` and no CA
//! options), a rustls [`MakeTlsConnect`] with `sslmode=verify-full` semantics (the chain must
//! lead to the named CA *and* the certificate must name the host), and the runtime session
//! settings (`statement_timeout`) sent as startup options.
//!
//! `sslmode=require`, `verify-ca` and `verify-full` all verify chain and host name: there is no
//! unverified TLS. `disable`, `prefer` or no `sslmode` connect in plain (as before TLS existed:
//! a local socket or private network). The CA comes from `sslrootcert=FILE` in the string, or
//! `--database-ca FILE` (the string wins); `sslrootcert=system` uses the system's CA bundle.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// Default `statement_timeout` of the server's connections (`--statement-timeout`).
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors reading a connection string or its CA.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("invalid PostgreSQL connection string: {0}")]
    Config(String),
    #[error(
        "sslmode={0} demands TLS but no CA is named: add sslrootcert=FILE to the URL or pass --database-ca FILE"
    )]
    NoCa(String),
    #[error("cannot read the database CA {path}: {msg}")]
    Ca { path: PathBuf, msg: String },
    #[error("unsupported connection option {0}: client certificates are not supported")]
    Unsupported(String),
}

/// Connection options beyond the string.
#[derive(Debug, Clone, Default)]
pub struct PgOptions {
    /// CA file for TLS (used when the string has no `sslrootcert`).
    pub ca: Option<PathBuf>,
    /// `statement_timeout` for every statement of these connections (`None`: the server's).
    pub statement_timeout: Option<Duration>,
}

/// A parsed, ready-to-connect database target.
#[derive(Clone)]
pub struct PgTarget {
    config: tokio_postgres::Config,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The Config's Debug redacts the password.
        f.debug_struct("PgTarget")
            .field("config", &self.config)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// What `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Verify,
}

/// Options this module consumes; the rest of the string goes to tokio-postgres untouched.
#[derive(Debug, Default)]
struct Taken {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

impl Taken {
    /// Takes `key=value` if it is ours; returns false for every other key.
    fn take(&mut self, key: &str, value: &str) -> Result<bool, TargetError> {
        match key {
            "sslmode" => self.sslmode = Some(value.to_string()),
            "sslrootcert" => self.sslrootcert = Some(value.to_string()),
            "sslcert" | "sslkey" | "sslpassword" => {
                return Err(TargetError::Unsupported(key.to_string()));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

fn percent_decode(s: &str) -> Result<String, TargetError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hexpair = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let v = hexpair.and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(v) = v else {
                return Err(TargetError::Config(format!("bad percent-encoding in {s:?}")));
            };
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| TargetError::Config(format!("{s:?} is not UTF-8")))
}

/// Splits our options out of a URL (`postgres://…?k=v&…`) or key/value string.
fn split(s: &str) -> Result<(String, Taken), TargetError> {
    let mut taken = Taken::default();
    if s.starts_with("postgres://") || s.starts_with("postgresql://") {
        let Some((base, query)) = s.split_once('?') else {
            return Ok((s.to_string(), taken));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if !taken.take(&percent_decode(k)?, &percent_decode(v)?)? {
                kept.push(pair);
            }
        }
        let rest =
            if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
        return Ok((rest, taken));
    }
    // Key/value form: `k=v` or `k='quoted \' value'`, separated by whitespace.
    let mut kept = String::new();
    let mut chars = s.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut key = String::new();
        while let Some(&(_, c)) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|&(_, c)| c.is_whitespace()) {
            chars.next();
        }
        if chars.next().map(|(_, c)| c) != Some('=') {
            return Err(TargetError::Config(format!("expected `=` after {key:?}")));
        }
        while chars.peek().is_some_and(|&(_, c)| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek().is_some_and(|&(_, c)| c == '\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, c)) => value.push(c),
                        None => return Err(TargetError::Config("unterminated quote".into())),
                    },
                    Some((_, '\'')) => break,
                    Some((_, c)) => value.push(c),
                    None => return Err(TargetError::Config("unterminated quote".into())),
                }
            }
        } else {
            while let Some(&(_, c)) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        let end = chars.peek().map_or(s.len(), |&(i, _)| i);
        if !taken.take(&key, &value)? {
            kept.push_str(&s[start..end]);
            kept.push(' ');
        }
    }
    Ok((kept.trim_end().to_string(), taken))
}

fn mode_of(sslmode: Option<&str>) -> Result<Mode, TargetError> {
    match sslmode {
        None | Some("disable" | "allow" | "prefer") => Ok(Mode::Plain),
        Some("require" | "verify-ca" | "verify-full") => Ok(Mode::Verify),
        Some(other) => Err(TargetError::Config(format!("unknown sslmode {other:?}"))),
    }
}

/// System CA bundles, for `sslrootcert=system`.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

fn load_roots(path: &Path) -> Result<rustls::RootCertStore, TargetError> {
    let err = |msg: String| TargetError::Ca { path: path.to_path_buf(), msg };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(format!("bad PEM: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(err("no usable CA certificate in the file".into()));
    }
    Ok(roots)
}

impl PgTarget {
    /// Reads `url` and the options (the CA file is read here, once).
    pub fn new(url: &str, opts: &PgOptions) -> Result<Self, TargetError> {
        let (rest, taken) = split(url)?;
        let mut config: tokio_postgres::Config =
            rest.parse().map_err(|e: tokio_postgres::Error| TargetError::Config(e.to_string()))?;
        if let Some(t) = opts.statement_timeout {
            let setting = format!("-c statement_timeout={}", t.as_millis());
            let options = match config.get_options() {
                Some(o) if !o.is_empty() => format!("{o} {setting}"),
                _ => setting,
            };
            config.options(options);
        }
        let mode = mode_of(taken.sslmode.as_deref())?;
        if mode == Mode::Plain {
            config.ssl_mode(SslMode::Disable);
            return Ok(Self { config, tls: None });
        }
        let ca = match (&taken.sslrootcert, &opts.ca) {
            (Some(s), _) if s == "system" => {
                SYSTEM_BUNDLES.iter().map(PathBuf::from).find(|p| p.exists()).ok_or_else(|| {
                    TargetError::Ca {
                        path: PathBuf::from("system"),
                        msg: "no system CA bundle found".into(),
                    }
                })?
            }
            (Some(s), _) => PathBuf::from(s),
            (None, Some(p)) => p.clone(),
            (None, None) => {
                return Err(TargetError::NoCa(taken.sslmode.unwrap_or_default()));
            }
        };
        let roots = load_roots(&ca)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TargetError::Config(format!("TLS setup failed: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.ssl_mode(SslMode::Require);
        Ok(Self { config, tls: Some(Arc::new(tls)) })
    }

    /// Whether connections use TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Connects; the connection task is spawned on the current runtime.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let client = match &self.tls {
            None => {
                let (client, conn) = self.config.connect(tokio_postgres::NoTls).await?;
                spawn_connection(conn);
                client
            }
            Some(tls) => {
                let (client, conn) =
                    self.config.connect(RustlsConnect { config: Arc::clone(tls) }).await?;
                spawn_connection(conn);
                client
            }
        };
        Ok(client)
    }
}

fn spawn_connection<F>(conn: F)
where
    F: Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::warn!("review store connection ended: {e}");
        }
    });
}

/// Makes one verifying TLS connector per connection attempt (for the attempted host name).
#[derive(Debug, Clone)]
pub struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
}

/// The connector for one host.
#[derive(Debug)]
pub struct RustlsConnectHost {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl<S> MakeTlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnectHost;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnectHost, Self::Error> {
        // The host name of the string (not `hostaddr`) is what the certificate must name;
        // an IP address host is checked against the certificate's IP addresses.
        let name = ServerName::try_from(domain.to_string())?;
        Ok(RustlsConnectHost { config: Arc::clone(&self.config), name })
    }
}

impl<S> TlsConnect<S> for RustlsConnectHost
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        Box::pin(async move { connector.connect(self.name, stream).await.map(RustlsStream) })
    }
}

/// A TLS session to the database.
#[derive(Debug)]
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM channel binding is not offered (the session is still verified above).
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_options_are_taken_and_the_rest_kept() {
        let (rest, t) = split(
            "postgres://u@db.example:5433/airlock?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@db.example:5433/airlock?application_name=x");
        assert_eq!(t.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(t.sslrootcert.as_deref(), Some("/etc/ca.pem"));
        let (rest, t) = split("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(mode_of(t.sslmode.as_deref()).unwrap(), Mode::Plain);
        assert!(matches!(split("postgres://u@h/db?sslkey=k"), Err(TargetError::Unsupported(_))));
    }

    #[test]
    fn key_value_options_are_taken_and_the_rest_kept() {
        let (rest, t) =
            split("host=db user=u sslmode = require sslrootcert='/a b/c\\'a.pem' options='-c x=1'")
                .unwrap();
        assert_eq!(rest, "host=db user=u options='-c x=1'");
        assert_eq!(t.sslmode.as_deref(), Some("require"));
        assert_eq!(t.sslrootcert.as_deref(), Some("/a b/c'a.pem"));
        assert!(split("host=db user").is_err());
    }

    #[test]
    fn tls_demanded_without_a_ca_is_refused_and_plain_keeps_plain() {
        let e = PgTarget::new("postgres://u@h/db?sslmode=verify-full", &PgOptions::default());
        assert!(matches!(e, Err(TargetError::NoCa(_))), "{e:?}");
        let t = PgTarget::new("postgres://u@h/db", &PgOptions::default()).unwrap();
        assert!(!t.uses_tls());
        assert!(PgTarget::new("postgres://u@h/db?sslmode=bogus", &PgOptions::default()).is_err());
    }

    /// The verification the connector does (rustls' WebPKI verifier over the CA's roots):
    /// a certificate the CA signed for the name passes; another name or another CA fails.
    #[test]
    fn verifier_checks_chain_and_name() {
        use rustls::client::danger::ServerCertVerifier;
        // Keys are random: a few rounds (300 were run once while writing this).
        for _ in 0..3 {
            let mk_ca = |cn: &str| {
                let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
                p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
                p.distinguished_name.push(rcgen::DnType::CommonName, cn);
                let k = rcgen::KeyPair::generate().unwrap();
                let c = p.self_signed(&k).unwrap();
                (p, k, c)
            };
            let (ca_p, ca_k, ca_c) = mk_ca("ca one");
            let (_, _, other_c) = mk_ca("ca two");
            let leaf_k = rcgen::KeyPair::generate().unwrap();
            let leaf = rcgen::CertificateParams::new(vec!["pg.airlock.test".to_string()])
                .unwrap()
                .signed_by(&leaf_k, &rcgen::Issuer::from_params(&ca_p, &ca_k))
                .unwrap();
            let verify = |root: &rcgen::Certificate, name: &str| {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(root.der().clone()).unwrap();
                let v = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::new(rustls::crypto::ring::default_provider()),
                )
                .build()
                .unwrap();
                v.verify_server_cert(
                    leaf.der(),
                    &[],
                    &ServerName::try_from(name.to_string()).unwrap(),
                    &[],
                    rustls::pki_types::UnixTime::now(),
                )
                .map(|_| ())
            };
            assert!(
                verify(&ca_c, "pg.airlock.test").is_ok(),
                "{:?}",
                verify(&ca_c, "pg.airlock.test")
            );
            assert!(verify(&ca_c, "other.airlock.test").is_err());
            assert!(verify(&ca_c, "127.0.0.1").is_err());
            assert!(verify(&other_c, "pg.airlock.test").is_err());
        }
    }

    #[test]
    fn statement_timeout_is_appended_to_existing_options() {
        let opts =
            PgOptions { statement_timeout: Some(Duration::from_secs(30)), ..Default::default() };
        let t = PgTarget::new("host=h user=u options='-c work_mem=4MB'", &opts).unwrap();
        assert_eq!(t.config.get_options(), Some("-c work_mem=4MB -c statement_timeout=30000"));
        let t = PgTarget::new("postgres://u@h/db", &opts).unwrap();
        assert_eq!(t.config.get_options(), Some("-c statement_timeout=30000"));
    }
}
