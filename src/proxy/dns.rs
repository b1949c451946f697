//! The sandbox's resolver (issue 14): `airlockd` answers the queries the sandbox sends to
//! `127.0.0.53:53` over UDP and TCP, on sockets made inside the sandbox's namespace and handed
//! over like the proxy listener. Nothing is resolved for real here: a name the policy allows on
//! some port gets, for `A`, a **synthetic address** of the session ([`super::synthetic`]); every
//! other type of an allowed name gets NODATA; a refused name gets NXDOMAIN. Real resolution
//! happens when a connection to the name is made, on the host, through the address guard.
//!
//! Every query that parses far enough to have a question is one audit line (`method: "DNS"`,
//! `host`, `qtype`, `allowed`, `reason`, `answer`), appended before the answer is sent; if the
//! line cannot be written the answer is SERVFAIL (fail closed).
//!
//! Messages are parsed and built by hand (RFC 1035 §4), bounded: one question (RFC 9619), no
//! compression pointers in it, names of at most 255 bytes and labels of at most 63, UDP
//! answers of at most 512 bytes without EDNS (else the TC bit, RFC 1035 §4.2.1) or the
//! client's EDNS payload size capped at 1232 (RFC 6891 §6.2.5), TCP messages with the two-byte
//! length prefix (RFC 7766 §8), several queries per connection, answered in order.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::audit::AuditLine;
use crate::policy::{Host, LayerKind, Reason, canonicalize_host};

use super::SessionProxy;
use super::respond;

/// The largest query accepted (UDP datagram or TCP message); real queries are < 300 bytes.
pub const MAX_QUERY: usize = 4096;
/// UDP answer size without EDNS (RFC 1035 §4.2.1).
pub const UDP_PLAIN: usize = 512;
/// Our EDNS UDP payload size (the DNS flag day 2020 value).
pub const EDNS_PAYLOAD: u16 = 1232;
/// TTL of a synthetic answer: the address is stable for the session.
pub const TTL: u32 = 300;
/// Open DNS-over-TCP connections per session; more are closed at once.
pub const MAX_TCP_CONNS: usize = 64;
/// A DNS-over-TCP connection idle this long is closed (RFC 7766 §6.2.3: seconds, not minutes).
pub const TCP_IDLE: Duration = Duration::from_secs(10);

const TYPE_A: u16 = 1;
const TYPE_OPT: u16 = 41;
const CLASS_IN: u16 = 1;

/// Response codes (RFC 1035 §4.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError = 0,
    FormErr = 1,
    ServFail = 2,
    NxDomain = 3,
    NotImp = 4,
    Refused = 5,
}

/// The name of a query type for the audit line (RFC 1035, RFC 3596, RFC 9460, …).
pub fn qtype_name(t: u16) -> String {
    let known = match t {
        1 => "A",
        2 => "NS",
        5 => "CNAME",
        6 => "SOA",
        12 => "PTR",
        15 => "MX",
        16 => "TXT",
        28 => "AAAA",
        33 => "SRV",
        64 => "SVCB",
        65 => "HTTPS",
        255 => "ANY",
        _ => return format!("TYPE{t}"),
    };
    known.to_owned()
}

/// A parsed query: the header id and flags we echo, the question as sent (its bytes are
/// echoed verbatim, keeping the client's 0x20 case), and the EDNS payload size if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// The RD bit, echoed.
    pub rd: bool,
    /// The question's wire bytes (QNAME, QTYPE, QCLASS).
    pub question: Vec<u8>,
    /// The name, dotted, as sent (not yet canonical).
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// `Some(payload size)` when the query carries an OPT record.
    pub edns: Option<u16>,
}

/// Why a message got no normal answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not answerable at all (too short, or a response): dropped silently.
    Drop,
    /// Answered with this code and no question (or the header's id only).
    Reply { id: u16, rcode: Rcode, why: &'static str },
}

/// Parses one query message (RFC 1035 §4.1).
pub fn parse_query(msg: &[u8]) -> Result<Query, ParseError> {
    if msg.len() < 12 || msg.len() > MAX_QUERY {
        return Err(ParseError::Drop);
    }
    let be = |i: usize| u16::from_be_bytes([msg[i], msg[i + 1]]);
    let id = be(0);
    let flags = be(2);
    if flags & 0x8000 != 0 {
        return Err(ParseError::Drop); // a response: never answer one (loops)
    }
    let reply = |rcode, why| ParseError::Reply { id, rcode, why };
    if (flags >> 11) & 0xf != 0 {
        return Err(reply(Rcode::NotImp, "only standard queries (opcode 0) are answered"));
    }
    if be(4) != 1 {
        return Err(reply(Rcode::FormErr, "exactly one question is answered"));
    }
    let (ancount, nscount, arcount) = (be(6), be(8), be(10));
    let mut pos = 12;
    let mut name = String::new();
    loop {
        let Some(&len) = msg.get(pos) else {
            return Err(reply(Rcode::FormErr, "the question is cut short"));
        };
        pos += 1;
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 {
            return Err(reply(Rcode::FormErr, "compression or extended labels in the question"));
        }
        let label = msg
            .get(pos..pos + usize::from(len))
            .ok_or(reply(Rcode::FormErr, "the question is cut short"))?;
        pos += usize::from(len);
        if pos - 12 > 255 {
            return Err(reply(Rcode::FormErr, "the name is longer than 255 bytes"));
        }
        if !name.is_empty() {
            name.push('.');
        }
        // Bytes outside printable ASCII become U+FFFD: such a name fails canonicalization
        // and is refused, and the audit line stays readable.
        name.extend(
            label.iter().map(|&b| {
                if b.is_ascii_graphic() && b != b'.' { char::from(b) } else { '\u{fffd}' }
            }),
        );
    }
    let Some(tail) = msg.get(pos..pos + 4) else {
        return Err(reply(Rcode::FormErr, "the question is cut short"));
    };
    let qtype = u16::from_be_bytes([tail[0], tail[1]]);
    let qclass = u16::from_be_bytes([tail[2], tail[3]]);
    let question = msg[12..pos + 4].to_vec();
    pos += 4;
    // EDNS: an OPT record in the additional section (RFC 6891 §6.1.2). Answer and authority
    // records in a query are not expected; a query carrying them is not looked into further.
    let mut edns = None;
    if ancount == 0 && nscount == 0 && arcount > 0 {
        for _ in 0..arcount.min(4) {
            // Only the root name (one zero byte) is legal for OPT; anything else ends the scan.
            let Some(rr) = msg.get(pos..pos + 11) else { break };
            if rr[0] != 0 {
                break;
            }
            let ty = u16::from_be_bytes([rr[1], rr[2]]);
            let class = u16::from_be_bytes([rr[3], rr[4]]);
            let rdlen = usize::from(u16::from_be_bytes([rr[9], rr[10]]));
            if ty == TYPE_OPT {
                edns = Some(class.max(UDP_PLAIN as u16));
            }
            pos += 11 + rdlen;
        }
    }
    Ok(Query { id, rd: flags & 0x0100 != 0, question, name, qtype, qclass, edns })
}

/// What to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// One `A` record.
    A(Ipv4Addr),
    /// NOERROR without records.
    NoData,
    /// An error code.
    Code(Rcode),
}

impl Answer {
    /// The audit line's `answer`.
    pub fn describe(&self) -> String {
        match self {
            Answer::A(a) => a.to_string(),
            Answer::NoData => "NODATA".into(),
            Answer::Code(Rcode::NxDomain) => "NXDOMAIN".into(),
            Answer::Code(Rcode::ServFail) => "SERVFAIL".into(),
            Answer::Code(Rcode::Refused) => "REFUSED".into(),
            Answer::Code(Rcode::FormErr) => "FORMERR".into(),
            Answer::Code(Rcode::NotImp) => "NOTIMP".into(),
            Answer::Code(Rcode::NoError) => "NOERROR".into(),
        }
    }
}

/// Builds the response to `q` (RFC 1035 §4.1): header with QR, RA and the echoed RD, the
/// question as sent, the answer record if any (its name a pointer to the question, §4.1.4),
/// and an OPT record when the query had one. `limit` is the largest message the transport
/// takes: past it the answer is dropped and TC set (UDP only; TCP passes `u16::MAX`).
pub fn build_response(q: &Query, answer: &Answer, limit: usize) -> Vec<u8> {
    let rcode = match answer {
        Answer::Code(c) => *c as u16,
        _ => 0,
    };
    let mut flags: u16 = 0x8000 | 0x0080 | rcode; // QR, RA
    if q.rd {
        flags |= 0x0100;
    }
    let mut records = Vec::new();
    let mut ancount = 0u16;
    if let Answer::A(addr) = answer {
        ancount = 1;
        records.extend_from_slice(&[0xc0, 0x0c]); // pointer to the question's name at 12
        records.extend_from_slice(&TYPE_A.to_be_bytes());
        records.extend_from_slice(&CLASS_IN.to_be_bytes());
        records.extend_from_slice(&TTL.to_be_bytes());
        records.extend_from_slice(&4u16.to_be_bytes());
        records.extend_from_slice(&addr.octets());
    }
    let mut opt = Vec::new();
    if q.edns.is_some() {
        opt.push(0); // root
        opt.extend_from_slice(&TYPE_OPT.to_be_bytes());
        opt.extend_from_slice(&EDNS_PAYLOAD.to_be_bytes());
        opt.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // ext-rcode, version 0, flags, rdlen 0
    }
    let mut out = Vec::with_capacity(12 + q.question.len() + records.len() + opt.len());
    let header = |out: &mut Vec<u8>, flags: u16, an: u16| {
        out.extend_from_slice(&q.id.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&an.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&u16::from(!opt.is_empty()).to_be_bytes());
    };
    if 12 + q.question.len() + records.len() + opt.len() > limit {
        // Truncated (TC): the question and OPT only; the client retries over TCP.
        header(&mut out, flags | 0x0200, 0);
        out.extend_from_slice(&q.question);
        out.extend_from_slice(&opt);
        return out;
    }
    header(&mut out, flags, ancount);
    out.extend_from_slice(&q.question);
    out.extend_from_slice(&records);
    out.extend_from_slice(&opt);
    out
}

/// A bare error response for a query that did not parse as far as its question.
fn error_response(id: u16, rcode: Rcode) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&(0x8000u16 | 0x0080 | rcode as u16).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out
}

/// The UDP answer size a query may receive.
fn udp_limit(q: &Query) -> usize {
    match q.edns {
        Some(size) => usize::from(size.min(EDNS_PAYLOAD)),
        None => UDP_PLAIN,
    }
}

/// Decides, audits and answers one message. `None` = send nothing.
pub fn answer_message(session: &SessionProxy, msg: &[u8], limit: Option<usize>) -> Option<Vec<u8>> {
    let started = Instant::now();
    let q = match parse_query(msg) {
        Ok(q) => q,
        Err(ParseError::Drop) => return None,
        Err(ParseError::Reply { id, rcode, why }) => {
            // Nothing to name: one malformed line, so the attempt is still on record.
            let mut line = respond::new_line(session, "", None, "DNS");
            line.reason = Some(Reason::Malformed);
            line.layer = Some(LayerKind::None);
            line.answer = Some(Answer::Code(rcode).describe());
            line.url = Some(why.to_owned());
            line.duration_ms = Some(0);
            return session.audit.append(&line).ok().map(|()| error_response(id, rcode));
        }
    };
    let (answer, mut line) = decide(session, &q);
    line.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
    let answer = match session.audit.append(&line) {
        Ok(()) => answer,
        // Fail closed: no answer the audit trail does not hold.
        Err(e) => {
            tracing::error!("DNS audit line for {:?} not written: {e}", q.name);
            Answer::Code(Rcode::ServFail)
        }
    };
    let limit = limit.unwrap_or_else(|| udp_limit(&q));
    Some(build_response(&q, &answer, limit))
}

/// The policy's answer for a parsed query, with its audit line.
fn decide(session: &SessionProxy, q: &Query) -> (Answer, AuditLine) {
    let (mut line, policy) = respond::begin(session, &q.name, None, "DNS");
    line.qtype = Some(qtype_name(q.qtype));
    let finish = |line: &mut AuditLine, answer: Answer, reason: Reason, allowed: bool| {
        line.allowed = allowed;
        line.reason = Some(reason);
        if line.layer.is_none() {
            line.layer = Some(LayerKind::None);
        }
        line.answer = Some(answer.describe());
        answer
    };
    if q.qclass != CLASS_IN {
        let a = finish(&mut line, Answer::Code(Rcode::Refused), Reason::Malformed, false);
        return (a, line);
    }
    let name = match canonicalize_host(&q.name) {
        Ok(Host::Name(n)) => n,
        // An IP literal or a name that does not canonicalize: no such name.
        Ok(Host::Ip(_)) | Err(_) => {
            let a = finish(&mut line, Answer::Code(Rcode::NxDomain), Reason::Malformed, false);
            return (a, line);
        }
    };
    line.host = name.clone();
    let decision = policy.decide_name_any_port(&name);
    if !decision.is_allowed() {
        respond::set_refusal(&mut line, &decision);
        let a = finish(&mut line, Answer::Code(Rcode::NxDomain), decision.reason, false);
        return (a, line);
    }
    line.layer = Some(decision.layer);
    line.policy = decision.policy.clone();
    line.rule = decision.rule.clone();
    if q.qtype != TYPE_A {
        let a = finish(&mut line, Answer::NoData, Reason::Allowed, true);
        return (a, line);
    }
    match session.synthetic.assign(&name) {
        Ok(addr) => {
            let a = finish(&mut line, Answer::A(addr), Reason::Allowed, true);
            (a, line)
        }
        Err(_) => {
            line.layer = Some(LayerKind::None);
            line.policy = None;
            line.rule = None;
            let a = finish(&mut line, Answer::Code(Rcode::ServFail), Reason::DnsLimit, false);
            (a, line)
        }
    }
}

/// Serves the resolver's UDP socket and TCP listener until `shutdown` turns true.
pub async fn serve(
    udp: Option<UdpSocket>,
    tcp: Option<TcpListener>,
    session: Arc<SessionProxy>,
    shutdown: watch::Receiver<bool>,
) {
    let u = udp.map(|u| tokio::spawn(serve_udp(u, Arc::clone(&session), shutdown.clone())));
    let t = tcp.map(|t| tokio::spawn(serve_tcp(t, Arc::clone(&session), shutdown.clone())));
    for h in [u, t].into_iter().flatten() {
        let _ = h.await;
    }
}

async fn serve_udp(
    sock: UdpSocket,
    session: Arc<SessionProxy>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; MAX_QUERY + 1];
    loop {
        tokio::select! {
            biased;
            () = super::stopped(&mut shutdown) => return,
            got = sock.recv_from(&mut buf) => match got {
                Ok((n, peer)) => {
                    if let Some(resp) = answer_message(&session, &buf[..n.min(MAX_QUERY + 1)], None) {
                        let _ = sock.send_to(&resp, peer).await;
                    }
                }
                Err(e) => {
                    // ICMP errors from an earlier reply's vanished peer surface here
                    // (ECONNREFUSED); they do not stop the resolver.
                    tracing::debug!("DNS UDP receive: {e}");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            },
        }
    }
}

async fn serve_tcp(
    listener: TcpListener,
    session: Arc<SessionProxy>,
    mut shutdown: watch::Receiver<bool>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let mut tasks: JoinSet<()> = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = super::stopped(&mut shutdown) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((sock, _)) => {
                    if open.load(Ordering::Acquire) >= MAX_TCP_CONNS {
                        drop(sock);
                        continue;
                    }
                    open.fetch_add(1, Ordering::AcqRel);
                    let (s, o) = (Arc::clone(&session), Arc::clone(&open));
                    tasks.spawn(async move {
                        serve_tcp_conn(&s, sock).await;
                        o.fetch_sub(1, Ordering::AcqRel);
                    });
                }
                Err(e) => {
                    tracing::warn!("DNS TCP accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    tasks.abort_all();
}

/// One DNS-over-TCP connection: length-prefixed queries answered in order (RFC 7766 §8).
async fn serve_tcp_conn(session: &SessionProxy, mut sock: TcpStream) {
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, sock.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let n = usize::from(u16::from_be_bytes(len));
        if n > MAX_QUERY {
            return;
        }
        let mut msg = vec![0u8; n];
        match tokio::time::timeout(TCP_IDLE, sock.read_exact(&mut msg)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let Some(resp) = answer_message(session, &msg, Some(usize::from(u16::MAX))) else {
            return;
        };
        let mut framed = Vec::with_capacity(resp.len() + 2);
        // A response is at most a few hundred bytes; the cast cannot truncate.
        framed.extend_from_slice(&(resp.len() as u16).to_be_bytes());
        framed.extend_from_slice(&resp);
        if sock.write_all(&framed).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    /// A query for `name`/`qtype`, with an OPT record of `edns` size if given.
    pub(crate) fn query(id: u16, name: &str, qtype: u16, edns: Option<u16>) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&id.to_be_bytes());
        m.extend_from_slice(&0x0100u16.to_be_bytes()); // RD
        m.extend_from_slice(&1u16.to_be_bytes());
        m.extend_from_slice(&[0, 0, 0, 0]);
        m.extend_from_slice(&u16::from(edns.is_some()).to_be_bytes());
        for label in name.split('.').filter(|l| !l.is_empty()) {
            m.push(label.len() as u8);
            m.extend_from_slice(label.as_bytes());
        }
        m.push(0);
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&CLASS_IN.to_be_bytes());
        if let Some(size) = edns {
            m.push(0);
            m.extend_from_slice(&TYPE_OPT.to_be_bytes());
            m.extend_from_slice(&size.to_be_bytes());
            m.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        }
        m
    }

    /// `(rcode, tc, ancount, first A address)` of a response.
    pub(crate) fn read_response(r: &[u8]) -> (u16, bool, u16, Option<Ipv4Addr>) {
        let flags = u16::from_be_bytes([r[2], r[3]]);
        let an = u16::from_be_bytes([r[6], r[7]]);
        if r.len() == 12 {
            return (flags & 0xf, flags & 0x0200 != 0, an, None);
        }
        let mut pos = 12;
        while r[pos] != 0 {
            pos += 1 + usize::from(r[pos]);
        }
        // Past the root, QTYPE and QCLASS, then the record's pointer, type, class, TTL, rdlen.
        let at = pos + 1 + 4 + 12;
        let addr = (an > 0).then(|| Ipv4Addr::new(r[at], r[at + 1], r[at + 2], r[at + 3]));
        (flags & 0xf, flags & 0x0200 != 0, an, addr)
    }

    #[test]
    fn a_query_parses_and_echoes_its_question() {
        let m = query(0x1234, "Allowed.TEST", 1, None);
        let q = parse_query(&m).unwrap();
        assert_eq!(
            (q.id, q.rd, q.name.as_str(), q.qtype, q.qclass, q.edns),
            (0x1234, true, "Allowed.TEST", 1, 1, None)
        );
        let r = build_response(&q, &Answer::A(Ipv4Addr::new(198, 18, 0, 7)), UDP_PLAIN);
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(&r[12..12 + q.question.len()], &q.question[..], "question echoed as sent");
        assert_eq!(read_response(&r), (0, false, 1, Some(Ipv4Addr::new(198, 18, 0, 7))));
        assert_eq!(u16::from_be_bytes([r[2], r[3]]) & 0x8180, 0x8180, "QR, RD, RA");
    }

    #[test]
    fn edns_is_answered_with_an_opt_record_and_sizes_are_bounded() {
        let q = parse_query(&query(1, "a.test", 1, Some(4096))).unwrap();
        assert_eq!(q.edns, Some(4096));
        assert_eq!(udp_limit(&q), usize::from(EDNS_PAYLOAD));
        let r = build_response(&q, &Answer::NoData, udp_limit(&q));
        assert_eq!(u16::from_be_bytes([r[10], r[11]]), 1, "one OPT record");
        let tiny = parse_query(&query(1, "a.test", 1, Some(100))).unwrap();
        assert_eq!(udp_limit(&tiny), UDP_PLAIN, "sizes below 512 count as 512");
        let plain = parse_query(&query(1, "a.test", 1, None)).unwrap();
        assert_eq!(udp_limit(&plain), UDP_PLAIN);
    }

    #[test]
    fn an_answer_past_the_limit_sets_tc_and_drops_the_records() {
        let q = parse_query(&query(9, "a.test", 1, None)).unwrap();
        let full = build_response(&q, &Answer::A(Ipv4Addr::new(198, 18, 0, 1)), UDP_PLAIN);
        let cut = build_response(&q, &Answer::A(Ipv4Addr::new(198, 18, 0, 1)), full.len() - 1);
        let (rcode, tc, an, _) = read_response(&cut);
        assert_eq!((rcode, tc, an), (0, true, 0));
        assert_eq!(cut.len(), 12 + q.question.len());
        // The longest legal name still fits 512 bytes with its answer: TC is for later types.
        let long = (0..4).map(|_| "a".repeat(62)).collect::<Vec<_>>().join(".");
        let q = parse_query(&query(9, &long, 1, None)).unwrap();
        let r = build_response(&q, &Answer::A(Ipv4Addr::new(198, 18, 0, 1)), UDP_PLAIN);
        assert!(!read_response(&r).1);
    }

    #[test]
    fn malformed_messages_are_dropped_or_refused() {
        assert_eq!(parse_query(&[0; 11]), Err(ParseError::Drop));
        let mut resp = query(1, "a.test", 1, None);
        resp[2] |= 0x80;
        assert_eq!(parse_query(&resp), Err(ParseError::Drop), "responses are never answered");
        assert_eq!(parse_query(&vec![0; MAX_QUERY + 1]), Err(ParseError::Drop));
        let code = |m: &[u8]| match parse_query(m) {
            Err(ParseError::Reply { rcode, .. }) => rcode,
            other => panic!("{other:?}"),
        };
        let mut two = query(1, "a.test", 1, None);
        two[5] = 2;
        assert_eq!(code(&two), Rcode::FormErr);
        let mut zero = query(1, "a.test", 1, None);
        zero[5] = 0;
        assert_eq!(code(&zero), Rcode::FormErr);
        let mut opcode = query(1, "a.test", 1, None);
        opcode[2] |= 0x10; // opcode 2 (status)
        assert_eq!(code(&opcode), Rcode::NotImp);
        let mut pointer = query(1, "a.test", 1, None);
        pointer[12] = 0xc0;
        assert_eq!(code(&pointer), Rcode::FormErr);
        let short = query(1, "a.test", 1, None);
        assert_eq!(code(&short[..short.len() - 2]), Rcode::FormErr);
        let long = (0..5).map(|_| "a".repeat(60)).collect::<Vec<_>>().join(".");
        assert_eq!(code(&query(1, &long, 1, None)), Rcode::FormErr, "names over 255 bytes");
    }

    #[test]
    fn qtypes_are_named() {
        assert_eq!(qtype_name(1), "A");
        assert_eq!(qtype_name(28), "AAAA");
        assert_eq!(qtype_name(65), "HTTPS");
        assert_eq!(qtype_name(64), "SVCB");
        assert_eq!(qtype_name(999), "TYPE999");
    }
}
