//! ClientHello reassembly and SNI extraction (SECURITY §3): after `200`, the proxy reads the
//! agent's first TLS flight, reassembles the ClientHello across TLS records (RFC 8446 §5.1
//! allows a handshake message to span records), and reads the `server_name` extension
//! (RFC 6066 §3). Pure: the caller owns the socket, the cap and the timeout.

/// What the bytes seen so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// A TLS handshake is starting but the ClientHello is not complete yet.
    NeedMore,
    /// The first byte is not a TLS handshake record: this is not TLS.
    NotTls,
    /// A complete ClientHello; `sni` is its `host_name`, if any.
    Hello { sni: Option<String> },
    /// TLS, but not a well-formed ClientHello (or larger than the cap).
    Malformed(&'static str),
}

const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;
/// RFC 8446 §5.1: a TLSPlaintext fragment is at most 2^14 bytes.
const MAX_FRAGMENT: usize = 1 << 14;

/// Examines `buf` (everything the agent sent after `200`). `cap` bounds the ClientHello
/// message length so a hostile agent cannot make the proxy buffer without limit.
pub fn peek(buf: &[u8], cap: usize) -> Peek {
    let mut hs: Vec<u8> = Vec::new();
    let mut rest = buf;
    if rest.is_empty() {
        return Peek::NeedMore;
    }
    if rest[0] != RECORD_HANDSHAKE {
        return Peek::NotTls;
    }
    loop {
        if rest.len() < 5 {
            return Peek::NeedMore;
        }
        if rest[0] != RECORD_HANDSHAKE {
            return Peek::Malformed("non-handshake record before the ClientHello ended");
        }
        if rest[1] != 3 {
            return Peek::Malformed("not a TLS record version");
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > MAX_FRAGMENT {
            return Peek::Malformed("bad TLS record length");
        }
        if rest.len() < 5 + len {
            return Peek::NeedMore;
        }
        hs.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
        if hs.len() >= 4 {
            if hs[0] != HANDSHAKE_CLIENT_HELLO {
                return Peek::Malformed("first handshake message is not a ClientHello");
            }
            let msg_len = usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3]);
            if msg_len > cap {
                return Peek::Malformed("ClientHello larger than the cap");
            }
            if hs.len() >= 4 + msg_len {
                return match client_hello_sni(&hs[4..4 + msg_len]) {
                    Ok(sni) => Peek::Hello { sni },
                    Err(why) => Peek::Malformed(why),
                };
            }
        }
        if hs.len() > cap + 4 {
            return Peek::Malformed("ClientHello larger than the cap");
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("truncated ClientHello");
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Result<&'a [u8], &'static str> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }
    fn vec16(&mut self) -> Result<&'a [u8], &'static str> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }
}

/// RFC 8446 §4.1.2 ClientHello body → the `host_name` of `server_name`, if present.
fn client_hello_sni(body: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader(body);
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    if r.vec8()?.len() > 32 {
        return Err("session id longer than 32 bytes");
    }
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.0.is_empty() {
        return Ok(None); // TLS 1.2 ClientHello without extensions
    }
    let mut exts = Reader(r.vec16()?);
    if !r.0.is_empty() {
        return Err("trailing bytes after ClientHello extensions");
    }
    let mut sni: Option<String> = None;
    let mut seen_sni = false;
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind != EXT_SERVER_NAME {
            continue;
        }
        if seen_sni {
            return Err("duplicate server_name extension");
        }
        seen_sni = true;
        let mut list = Reader(data);
        let mut names = Reader(list.vec16()?);
        if !list.0.is_empty() {
            return Err("trailing bytes in server_name");
        }
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let name = names.vec16()?;
            if name_type != NAME_TYPE_HOST {
                continue;
            }
            if sni.is_some() {
                return Err("more than one host_name in server_name");
            }
            if name.is_empty() || !name.is_ascii() {
                return Err("server_name host_name is empty or not ASCII");
            }
            sni = Some(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok(sni)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    /// A real ClientHello from rustls for `name` (None: an IP address, so no SNI).
    fn rustls_hello(name: &str) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    /// Re-frames one TLS record's payload into records of `size` bytes.
    fn split_records(tls: &[u8], size: usize) -> Vec<u8> {
        let payload = &tls[5..];
        let mut out = Vec::new();
        for chunk in payload.chunks(size) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn reads_sni_from_a_real_client_hello() {
        let hello = rustls_hello("example.test");
        assert_eq!(peek(&hello, 65536), Peek::Hello { sni: Some("example.test".into()) });
    }

    #[test]
    fn ip_target_hello_has_no_sni() {
        let hello = rustls_hello("127.0.0.2");
        assert_eq!(peek(&hello, 65536), Peek::Hello { sni: None });
    }

    #[test]
    fn reassembles_across_records_and_waits_for_more() {
        let hello = rustls_hello("split.example.test");
        let split = split_records(&hello, 7);
        assert_eq!(peek(&split, 65536), Peek::Hello { sni: Some("split.example.test".into()) });
        for cut in [1, 4, 5, 6, 40, split.len() - 1] {
            assert_eq!(peek(&split[..cut], 65536), Peek::NeedMore, "cut at {cut}");
        }
    }

    #[test]
    fn non_tls_and_caps() {
        assert_eq!(peek(b"GET / HTTP/1.1\r\n", 65536), Peek::NotTls);
        assert_eq!(peek(b"SSH-2.0-x\r\n", 65536), Peek::NotTls);
        let hello = rustls_hello("example.test");
        assert!(matches!(peek(&hello, 64), Peek::Malformed(_)));
        // An application-data record in the middle of the hello.
        let mut bad = split_records(&hello, 50);
        bad[5 + 50] = 23;
        assert!(matches!(peek(&bad, 65536), Peek::Malformed(_)));
    }

    proptest! {
        #[test]
        fn never_panics(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = peek(&data, 4096);
        }

        #[test]
        fn never_panics_on_mutated_hellos(pos in 0usize..400, byte in any::<u8>()) {
            let mut hello = rustls_hello("example.test");
            let at = pos % hello.len();
            hello[at] = byte;
            let _ = peek(&hello, 65536);
        }
    }
}
