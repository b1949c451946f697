//! Micro-benchmarks of the proxy's per-request pure work: head parsing and ClientHello/SNI
//! extraction. `cargo bench --bench proxy_parse`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};

use airlock::proxy::head::parse_head;
use airlock::proxy::tls_peek::peek;

fn client_hello(name: &str) -> Vec<u8> {
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

fn benches(c: &mut Criterion) {
    let head = b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\
                 User-Agent: curl/8.5.0\r\nProxy-Connection: Keep-Alive\r\n\r\n";
    c.bench_function("parse_head CONNECT", |b| b.iter(|| parse_head(black_box(head)).unwrap()));
    let hello = client_hello("api.example.test");
    c.bench_function("peek ClientHello SNI", |b| b.iter(|| peek(black_box(&hello), 65536)));
}

criterion_group!(proxy_parse, benches);
criterion_main!(proxy_parse);
