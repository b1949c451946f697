//! Name resolution behind a trait, so the proxy resolves exactly once per attempt through one
//! seam: the system resolver in production, a file-driven resolver in tests (compiled only with
//! the `test-hooks` feature, DESIGN §9). The caller applies the DNS timeout and checks every
//! answer with the address guard; no resolver answer is ever trusted by itself.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;

/// A boxed resolution in progress.
pub type Resolving<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Resolves a canonical host name to its addresses, in the order to dial them.
pub trait Resolver: Send + Sync + fmt::Debug {
    fn resolve<'a>(&'a self, name: &'a str) -> Resolving<'a>;
}

/// The operating system's resolver (`getaddrinfo(3)` on tokio's blocking pool).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> Resolving<'a> {
        Box::pin(async move {
            let mut out: Vec<IpAddr> = Vec::new();
            for sa in tokio::net::lookup_host((name, 0u16)).await? {
                if !out.contains(&sa.ip()) {
                    out.push(sa.ip());
                }
            }
            Ok(out)
        })
    }
}

#[cfg(any(test, feature = "test-hooks"))]
pub use test_resolver::FileResolver;

#[cfg(any(test, feature = "test-hooks"))]
mod test_resolver {
    use super::*;
    use std::collections::HashMap;
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    /// Test-only resolver read from a file of lines `name ip [ip...] [| ip ...]...`: the k-th
    /// query for a name gets the k-th `|`-separated group (the last group repeats), so tests
    /// can rebind a name between queries. Unknown names fail like NXDOMAIN; nothing ever
    /// reaches real DNS. Every query is appended to a log file (one name per line) so tests
    /// can prove a denied name was never resolved.
    #[derive(Debug)]
    pub struct FileResolver {
        table: HashMap<String, Vec<Vec<IpAddr>>>,
        queries: Mutex<HashMap<String, usize>>,
        log: Option<PathBuf>,
    }

    impl FileResolver {
        /// Parses `path`; `log` receives one line per query.
        pub fn load(path: &Path, log: Option<PathBuf>) -> io::Result<Self> {
            let text = std::fs::read_to_string(path)?;
            let table = Self::parse(&text).map_err(|(line, msg)| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}:{line}: {msg}", path.display()),
                )
            })?;
            Ok(Self { table, queries: Mutex::new(HashMap::new()), log })
        }

        /// Builds from text directly (unit tests).
        pub fn from_text(text: &str) -> Result<Self, String> {
            let table = Self::parse(text).map_err(|(l, m)| format!("line {l}: {m}"))?;
            Ok(Self { table, queries: Mutex::new(HashMap::new()), log: None })
        }

        #[allow(clippy::type_complexity)]
        fn parse(text: &str) -> Result<HashMap<String, Vec<Vec<IpAddr>>>, (usize, String)> {
            let mut table = HashMap::new();
            for (i, raw) in text.lines().enumerate() {
                let line = raw.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    continue;
                }
                let mut words = line.split_whitespace();
                let Some(name) = words.next() else { continue };
                let mut groups = vec![Vec::new()];
                for w in words {
                    if w == "|" {
                        groups.push(Vec::new());
                        continue;
                    }
                    let ip: IpAddr =
                        w.parse().map_err(|_| (i + 1, format!("{w:?} is not an IP address")))?;
                    if let Some(g) = groups.last_mut() {
                        g.push(ip);
                    }
                }
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                table.insert(name, groups);
            }
            Ok(table)
        }
    }

    impl Resolver for FileResolver {
        fn resolve<'a>(&'a self, name: &'a str) -> Resolving<'a> {
            let key = name.trim_end_matches('.').to_ascii_lowercase();
            let k = {
                let mut q = self.queries.lock().unwrap_or_else(|p| p.into_inner());
                let c = q.entry(key.clone()).or_insert(0);
                *c += 1;
                *c - 1
            };
            if let Some(log) = &self.log
                && let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log)
            {
                let _ = f.write_all(format!("{key}\n").as_bytes());
            }
            let answer = self.table.get(&key).and_then(|groups| {
                groups.get(k).or_else(|| groups.last()).cloned().filter(|g| !g.is_empty())
            });
            Box::pin(async move {
                answer.ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, format!("test resolver: no {key}"))
                })
            })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_resolver_rebinds_per_query() {
        let r = FileResolver::from_text(
            "# test names\nexample.test 127.0.0.2\nrebind.test 127.0.0.2 | 127.0.0.3\n\
             mixed.test 127.0.0.2 10.0.0.1 ::1\n",
        )
        .unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(r.resolve("Example.Test.").await.unwrap(), vec![ip("127.0.0.2")]);
        assert_eq!(r.resolve("rebind.test").await.unwrap(), vec![ip("127.0.0.2")]);
        assert_eq!(r.resolve("rebind.test").await.unwrap(), vec![ip("127.0.0.3")]);
        assert_eq!(r.resolve("rebind.test").await.unwrap(), vec![ip("127.0.0.3")]);
        assert_eq!(r.resolve("mixed.test").await.unwrap().len(), 3);
        assert!(r.resolve("pastebin.com").await.is_err());
        assert!(FileResolver::from_text("x.test not-an-ip").is_err());
    }
}
