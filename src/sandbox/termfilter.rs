//! The escape-sequence filter on the pty relay's sandbox→terminal direction (SECURITY §4
//! "Terminal", §7): it drops the sequences through which an agent could make the caller's
//! terminal type text back as input (title reports, DECRQSS, clipboard and font queries) or act
//! on the host (clipboard writes, file transfer), and passes everything else byte for byte.
//! Pure: bytes in, bytes out, state kept across chunks; [`super::relay`] feeds it what it reads
//! from the pty master. Pipes (a non-terminal stdout) are never filtered.
//!
//! Grammar: ECMA-48 (5th edition, 1991) §5.4 control sequences (`CSI P… I… F`), §5.6 control
//! strings (`OSC`/`DCS`/`APC`/`PM`/`SOS` … `ST`) and §8.3 the C1 controls; xterm's "Control
//! Sequences" (ctlseqs, invisible-island.net/xterm/ctlseqs/ctlseqs.html) for the OSC numbers,
//! BEL as an OSC terminator and which sequences the terminal answers. Where a sequence ends
//! follows the DEC parser (vt100.net/emu/dec_ansi_parser) that terminals implement: ESC, CAN,
//! SUB and any C1 control interrupt every sequence, and C0 controls inside a control sequence
//! are executed on the spot.
//!
//! Every introducer is recognised in its 7-bit form (`ESC [`), UTF-8-encoded (`C2 9B`) and as a
//! raw 8-bit C1 byte that does not continue a UTF-8 character (`9B`). Memory is bounded: a
//! control sequence, DCS header or ESC sequence longer than [`MAX_SEQUENCE`] is dropped whole;
//! an OSC is decided by its leading number and then streamed or discarded up to its
//! terminator. The filter only ever emits a sequence it has decided to pass, so a sequence it
//! drops never reaches the terminal in part.

use serde::{Deserialize, Serialize};

/// `[terminal] clipboard` (docs/configuration.md): whether an agent may *set* the caller's
/// clipboard with OSC 52. Reading it is never allowed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clipboard {
    #[default]
    Deny,
    Allow,
}

/// What the terminal filter lets through (from the managed and user layers only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TerminalPolicy {
    pub clipboard: Clipboard,
}

/// Longest control sequence, DCS header or ESC sequence held while it is decided.
pub const MAX_SEQUENCE: usize = 256;
/// Longest OSC prefix (the leading number, and OSC 52's selections) held while deciding.
const MAX_OSC_PREFIX: usize = 32;

const BEL: u8 = 0x07;
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;
const ESC: u8 = 0x1b;
const DEL: u8 = 0x7f;
/// C1 controls (ECMA-48 §8.3), as bytes and as the code points U+0080..U+009F.
const DCS: u8 = 0x90;
const SOS: u8 = 0x98;
const CSI: u8 = 0x9b;
const ST: u8 = 0x9c;
const OSC: u8 = 0x9d;
const PM: u8 = 0x9e;
const APC: u8 = 0x9f;
/// ST as the filter writes it when it ends a passed string itself.
const ST_7BIT: &[u8] = b"\x1b\\";
/// The UTF-8 lead byte of U+0080..U+00BF; followed by 80..9F it encodes a C1 control.
const C1_LEAD: u8 = 0xc2;

/// OSC numbers dropped whatever the policy (OSC 52 is decided by [`Clipboard`]):
/// - 46: xterm's "change log file": the terminal writes to a host path the agent names.
/// - 50: font query and set: `OSC 50 ; ?` makes xterm type the font name back as input, and a
///   set changes how the host terminal renders after the session.
/// - 1337: iTerm2's proprietary commands: `File=` saves a file on the host, `RequestUpload`
///   sends one, `Copy` sets the clipboard, `ReportVariable` types values back.
/// - 5113: kitty's file transfer protocol: reads and writes host files.
/// - 5522: kitty's extended clipboard protocol: reads and writes the clipboard like OSC 52.
const DROPPED_OSC: &[u32] = &[46, 50, 1337, 5113, 5522];
/// OSC 52: set (`52 ; Pc ; base64`) or read (`52 ; Pc ; ?`) a selection.
const OSC_CLIPBOARD: u32 = 52;
/// OSC 52's selection names (xterm: clipboard, primary, secondary, select, cut buffers 0-7).
const SELECTIONS: &[u8] = b"cpqs01234567";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StringKind {
    /// BEL terminates an OSC (xterm), and only an OSC.
    Osc,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ground,
    /// After ESC. `after_string`: the ESC ended a control string that was passed (`Some(true)`)
    /// or dropped (`Some(false)`), so `ESC \` is that string's ST.
    Escape {
        after_string: Option<bool>,
    },
    /// `ESC` and intermediate bytes (`ESC ( B`), passed once the final byte arrives.
    EscIntermediate {
        discard: bool,
    },
    /// A control sequence; `discard` once it grew past [`MAX_SEQUENCE`].
    Csi {
        discard: bool,
    },
    /// An OSC, reading its leading number.
    OscNumber,
    /// OSC 52 under `clipboard = "allow"`: reading the selections, then the first data byte.
    OscClipboard {
        data: bool,
    },
    /// A DCS, reading its parameters, intermediates and final byte.
    DcsHeader,
    /// A control string's payload, streamed (`pass`) or discarded up to its terminator.
    Str {
        kind: StringKind,
        pass: bool,
    },
}

/// UTF-8 decoding state, so a byte 80..BF continuing a character is not mistaken for a C1
/// control. Valid sequences only (RFC 3629's table); anything else starts afresh.
#[derive(Debug, Clone, Copy, Default)]
struct Utf8 {
    need: u8,
    lo: u8,
    hi: u8,
}

impl Utf8 {
    /// Whether `b` continues the character in progress (consuming it).
    fn continues(&mut self, b: u8) -> bool {
        if self.need > 0 && (self.lo..=self.hi).contains(&b) {
            self.need -= 1;
            (self.lo, self.hi) = (0x80, 0xbf);
            true
        } else {
            self.need = 0;
            false
        }
    }

    /// Starts a character at `b` if it is a lead byte ([`C1_LEAD`] is handled by the filter).
    fn start(&mut self, b: u8) {
        let (need, lo, hi) = match b {
            0xc3..=0xdf => (1, 0x80, 0xbf),
            0xe0 => (2, 0xa0, 0xbf),
            0xe1..=0xec | 0xee..=0xef => (2, 0x80, 0xbf),
            0xed => (2, 0x80, 0x9f),
            0xf0 => (3, 0x90, 0xbf),
            0xf1..=0xf3 => (3, 0x80, 0xbf),
            0xf4 => (3, 0x80, 0x8f),
            _ => (0, 0x80, 0xbf),
        };
        *self = Self { need, lo, hi };
    }
}

/// The streaming filter for one terminal (one per pty output pump).
#[derive(Debug)]
pub struct TermFilter {
    policy: TerminalPolicy,
    state: State,
    /// The sequence being decided: its introducer (`intro` bytes) and what followed.
    seq: Vec<u8>,
    intro: usize,
    utf8: Utf8,
    /// A [`C1_LEAD`] byte whose next byte says whether it is text or a C1 control.
    pending_lead: bool,
    query_relayed: bool,
}

impl TermFilter {
    pub fn new(policy: TerminalPolicy) -> Self {
        Self {
            policy,
            state: State::Ground,
            seq: Vec::with_capacity(MAX_SEQUENCE),
            intro: 0,
            utf8: Utf8::default(),
            pending_lead: false,
            query_relayed: false,
        }
    }

    /// Filters one chunk, appending what may reach the terminal to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &b in input {
            self.byte(b, out);
        }
    }

    /// The stream ended: an unfinished sequence is dropped (the terminal never saw its start);
    /// a held lead byte is text and is passed.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.pending_lead) {
            self.text(&[C1_LEAD], out);
        }
        self.reset();
    }

    /// Whether a sequence the terminal answers (DA, DSR, a colour query, …) was passed: its
    /// answer may still arrive on the caller's terminal input after the session.
    pub fn relayed_a_query(&self) -> bool {
        self.query_relayed
    }

    fn reset(&mut self) {
        self.state = State::Ground;
        self.seq.clear();
        self.utf8 = Utf8::default();
    }

    fn byte(&mut self, b: u8, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.pending_lead) {
            match b {
                0x80..=0x9f => return self.c1(b, &[C1_LEAD, b], out),
                0xa0..=0xbf => return self.text(&[C1_LEAD, b], out),
                // A lone lead byte is invalid UTF-8: passed as it is, `b` decided afresh.
                _ => self.text(&[C1_LEAD], out),
            }
        }
        self.step(b, out);
    }

    fn step(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.state {
            State::Ground => self.ground(b, out),
            State::Escape { after_string } => self.escape(after_string, b, out),
            State::EscIntermediate { discard } => self.esc_intermediate(discard, b, out),
            State::Csi { discard } => self.csi(discard, b, out),
            State::OscNumber => self.osc_number(b, out),
            State::OscClipboard { data } => self.osc_clipboard(data, b, out),
            State::DcsHeader => self.dcs_header(b, out),
            State::Str { kind, pass } => self.string(kind, pass, b, out),
        }
    }

    /// Text held while deciding a lead byte: passed in the ground state and inside a string
    /// being passed, nowhere else.
    fn text(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        if matches!(self.state, State::Ground | State::Str { pass: true, .. }) {
            out.extend_from_slice(bytes);
        }
    }

    fn ground(&mut self, b: u8, out: &mut Vec<u8>) {
        if self.utf8.continues(b) {
            out.push(b);
            return;
        }
        match b {
            ESC => self.begin_escape(None),
            0x80..=0x9f => self.c1(b, &[b], out),
            C1_LEAD => self.pending_lead = true,
            _ => {
                self.utf8.start(b);
                out.push(b);
            }
        }
    }

    fn begin_escape(&mut self, after_string: Option<bool>) {
        self.reset();
        self.seq.push(ESC);
        self.state = State::Escape { after_string };
    }

    /// Starts holding a sequence whose introducer is `intro`.
    fn begin(&mut self, state: State, intro: &[u8]) {
        self.reset();
        self.seq.extend_from_slice(intro);
        self.intro = intro.len();
        self.state = state;
    }

    /// Drops the sequence being held and decides `b` in the ground state: the terminal never
    /// saw the sequence's start, so `b` is whatever it is there.
    fn abandon(&mut self, b: u8, out: &mut Vec<u8>) {
        self.reset();
        self.ground(b, out);
    }

    /// A C1 control (`bytes` as it was written), from the ground state or a string, which it
    /// ends (DEC parser: C1 controls act from any state).
    fn c1(&mut self, code: u8, bytes: &[u8], out: &mut Vec<u8>) {
        let ended = match self.state {
            State::Str { pass, .. } => Some(pass),
            _ => None,
        };
        self.reset();
        if ended == Some(true) && code != ST {
            // As for ESC: what this starts may be dropped, so the passed string is ended here.
            out.extend_from_slice(ST_7BIT);
        }
        match code {
            CSI => self.begin(State::Csi { discard: false }, bytes),
            OSC => self.begin(State::OscNumber, bytes),
            DCS => self.begin(State::DcsHeader, bytes),
            SOS | PM | APC => {
                out.extend_from_slice(bytes);
                self.state = State::Str { kind: StringKind::Other, pass: true };
            }
            // The ST of a dropped string is dropped with it.
            ST if ended == Some(false) => {}
            _ => out.extend_from_slice(bytes),
        }
    }

    fn escape(&mut self, after_string: Option<bool>, b: u8, out: &mut Vec<u8>) {
        match b {
            b'\\' => {
                if after_string != Some(false) {
                    out.extend_from_slice(&[ESC, b]);
                }
                return self.reset();
            }
            // ESC ESC: the first one is void.
            ESC => return,
            _ => {}
        }
        if after_string == Some(true) {
            // The ESC ended a passed string. Say so with an ST before deciding what follows:
            // if that is dropped, the terminal would read the bytes after it as more of the
            // string (`ESC ] 5`, a dropped sequence, then `2;c;?` would be OSC 52).
            out.extend_from_slice(ST_7BIT);
            self.state = State::Escape { after_string: None };
        }
        match b {
            b'[' => self.begin(State::Csi { discard: false }, &[ESC, b]),
            b']' => self.begin(State::OscNumber, &[ESC, b]),
            b'P' => self.begin(State::DcsHeader, &[ESC, b]),
            b'X' | b'^' | b'_' => {
                self.reset();
                out.extend_from_slice(&[ESC, b]);
                self.state = State::Str { kind: StringKind::Other, pass: true };
            }
            0x20..=0x2f => {
                self.seq.push(b);
                self.state = State::EscIntermediate { discard: false };
            }
            0x30..=0x7e => {
                out.extend_from_slice(&[ESC, b]);
                // DECID (`ESC Z`) is answered like DA.
                self.query_relayed |= b == b'Z';
                self.reset();
            }
            _ => self.interrupt(b, out),
        }
    }

    /// What every held sequence does with ESC, CAN, SUB, DEL, other C0 controls and bytes from
    /// 80 up (DEC parser).
    fn interrupt(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            ESC => self.begin_escape(None),
            CAN | SUB => {
                self.reset();
                out.push(b);
            }
            DEL => {}
            // Executed by the terminal without ending the sequence, so passed now; the
            // sequence itself is still held (and later passed or dropped).
            0x00..=0x1f => out.push(b),
            _ => self.abandon(b, out),
        }
    }

    fn esc_intermediate(&mut self, discard: bool, b: u8, out: &mut Vec<u8>) {
        match b {
            0x20..=0x2f if !discard && self.seq.len() < MAX_SEQUENCE => self.seq.push(b),
            0x20..=0x2f => {
                self.seq.clear();
                self.state = State::EscIntermediate { discard: true };
            }
            0x30..=0x7e => {
                if !discard {
                    out.extend_from_slice(&self.seq);
                    out.push(b);
                }
                self.reset();
            }
            _ => self.interrupt(b, out),
        }
    }

    fn csi(&mut self, discard: bool, b: u8, out: &mut Vec<u8>) {
        match b {
            0x20..=0x3f if !discard && self.seq.len() < MAX_SEQUENCE => self.seq.push(b),
            0x20..=0x3f => {
                self.seq.clear();
                self.state = State::Csi { discard: true };
            }
            0x40..=0x7e => {
                if !discard && let Some(query) = csi_verdict(&self.seq[self.intro..], b) {
                    out.extend_from_slice(&self.seq);
                    out.push(b);
                    self.query_relayed |= query;
                }
                self.reset();
            }
            _ => self.interrupt(b, out),
        }
    }

    fn osc_number(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            b'0'..=b'9' if self.seq.len() - self.intro < MAX_OSC_PREFIX => self.seq.push(b),
            // A number this long names no OSC anyone implements.
            b'0'..=b'9' => self.osc_payload(false),
            b';' => self.osc_decide(true, out),
            // Ignored inside an OSC by terminals (DEC parser), so ignored while deciding: `5`,
            // LF, `2` is OSC 52 to them.
            DEL | 0x00..=0x06 | 0x08..=0x17 | 0x19 | 0x1c..=0x1f => {}
            // Decided by the number so far; `b` is then the payload's (or its terminator).
            _ => {
                self.osc_decide(false, out);
                self.step(b, out);
            }
        }
    }

    fn osc_decide(&mut self, semicolon: bool, out: &mut Vec<u8>) {
        let number = leading_number(&self.seq[self.intro..]);
        if number == OSC_CLIPBOARD && semicolon && self.policy.clipboard == Clipboard::Allow {
            self.seq.push(b';');
            self.state = State::OscClipboard { data: false };
            return;
        }
        if number == OSC_CLIPBOARD || DROPPED_OSC.contains(&number) {
            return self.osc_payload(false);
        }
        out.extend_from_slice(&self.seq);
        if semicolon {
            out.push(b';');
        }
        self.osc_payload(true);
    }

    fn osc_payload(&mut self, pass: bool) {
        self.seq.clear();
        self.state = State::Str { kind: StringKind::Osc, pass };
    }

    /// OSC 52 with the clipboard allowed: a write (`52 ; Pc ; base64`) passes; the read form
    /// (`?` as data) and anything malformed are dropped.
    fn osc_clipboard(&mut self, data: bool, b: u8, out: &mut Vec<u8>) {
        let selections = self.seq.len() - self.intro;
        match (data, b) {
            // Ignored by terminals here too (see `osc_number`).
            (_, DEL | 0x00..=0x06 | 0x08..=0x17 | 0x19 | 0x1c..=0x1f) => {}
            (false, b';') => {
                self.seq.push(b);
                self.state = State::OscClipboard { data: true };
            }
            (false, _) if SELECTIONS.contains(&b) && selections < MAX_OSC_PREFIX => {
                self.seq.push(b)
            }
            (true, b'?') => self.osc_payload(false),
            (true, _) => {
                out.extend_from_slice(&self.seq);
                self.osc_payload(true);
                self.step(b, out);
            }
            (false, _) => {
                self.osc_payload(false);
                self.step(b, out);
            }
        }
    }

    fn dcs_header(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            0x20..=0x3f if self.seq.len() < MAX_SEQUENCE => self.seq.push(b),
            0x20..=0x3f => self.dcs_payload(false),
            0x40..=0x7e => match dcs_verdict(&self.seq[self.intro..], b) {
                Some(query) => {
                    out.extend_from_slice(&self.seq);
                    out.push(b);
                    self.query_relayed |= query;
                    self.dcs_payload(true);
                }
                None => self.dcs_payload(false),
            },
            // The DCS was never passed, so an `ESC \` after it is dropped too.
            ESC => self.begin_escape(Some(false)),
            // Ignored inside a DCS header (DEC parser), so not passed either.
            DEL | 0x00..=0x17 | 0x19 | 0x1c..=0x1f => {}
            _ => self.interrupt(b, out),
        }
    }

    fn dcs_payload(&mut self, pass: bool) {
        self.seq.clear();
        self.state = State::Str { kind: StringKind::Other, pass };
    }

    fn string(&mut self, kind: StringKind, pass: bool, b: u8, out: &mut Vec<u8>) {
        if self.utf8.continues(b) {
            if pass {
                out.push(b);
            }
            return;
        }
        match b {
            // Ends the string; `ESC \` is its ST, anything else a new sequence (DEC parser).
            ESC => self.begin_escape(Some(pass)),
            BEL if kind == StringKind::Osc => {
                if pass {
                    out.push(b);
                }
                self.reset();
            }
            CAN | SUB => {
                if pass {
                    out.push(b);
                }
                self.reset();
            }
            0x80..=0x9f => self.c1(b, &[b], out),
            C1_LEAD => self.pending_lead = true,
            _ => {
                self.utf8.start(b);
                if pass {
                    // A colour query (`OSC 11 ; ?`) and its kin are answered.
                    self.query_relayed |= kind == StringKind::Osc && b == b'?';
                    out.push(b);
                }
            }
        }
    }
}

/// A CSI's parameters split as ECMA-48 §5.4 orders them: an optional private marker
/// (`< = > ?`), parameters (digits, `;`, `:`), intermediates. `None` when malformed (a
/// parameter byte out of place): terminals ignore such a sequence, so it is dropped rather
/// than guessed at.
fn split_params(body: &[u8]) -> Option<(Option<u8>, &[u8], &[u8])> {
    let (private, rest) = match body.split_first() {
        Some((&p @ 0x3c..=0x3f, rest)) => (Some(p), rest),
        _ => (None, body),
    };
    let split = rest.iter().position(|b| (0x20..=0x2f).contains(b)).unwrap_or(rest.len());
    let (params, intermediates) = rest.split_at(split);
    let params_ok = params.iter().all(|b| matches!(b, b'0'..=b'9' | b';' | b':'));
    let intermediates_ok = intermediates.iter().all(|b| (0x20..=0x2f).contains(b));
    (params_ok && intermediates_ok).then_some((private, params, intermediates))
}

/// The first parameter's value as a terminal reads it (leading zeros and all; empty is 0).
fn leading_number(params: &[u8]) -> u32 {
    params
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u32, |n, d| n.saturating_mul(10).saturating_add(u32::from(d - b'0')))
}

/// Whether a control sequence passes (`Some`, with whether the terminal answers it).
fn csi_verdict(body: &[u8], final_byte: u8) -> Option<bool> {
    let (private, params, intermediates) = split_params(body)?;
    let first = leading_number(params);
    let plain = private.is_none() && intermediates.is_empty();
    // XTWINOPS 20 and 21 report the icon label and window title, which the agent can set:
    // the terminal would type text of its choosing back as input.
    if plain && final_byte == b't' && matches!(first, 20 | 21) {
        return None;
    }
    let answered = match (private, intermediates, final_byte) {
        // DA1/DA2/DA3, DSR/DECDSR, DECRQM, XTVERSION, kitty's keyboard-flags query.
        (_, [], b'c') | (_, [], b'n') | (_, b"$", b'p') | (Some(b'>'), [], b'q') => true,
        (Some(b'?'), [], b'u') => true,
        // DECREQTPARM, and the XTWINOPS reports of sizes and positions (numbers only).
        (None, [], b'x') => true,
        (None, [], b't') => matches!(first, 11 | 13 | 14 | 15 | 16 | 18 | 19),
        _ => false,
    };
    Some(answered)
}

/// Whether a DCS passes (`Some`, with whether the terminal answers it).
fn dcs_verdict(body: &[u8], final_byte: u8) -> Option<bool> {
    let (_, _, intermediates) = split_params(body)?;
    match (intermediates, final_byte) {
        // DECRQSS (`DCS $ q Pt ST`): the answer quotes the setting named by Pt, and terminals
        // have echoed an unrecognised Pt back verbatim: agent-chosen text typed as input.
        (i, b'q') if i.contains(&b'$') => None,
        // XTGETTCAP (`DCS + q`) is answered.
        (i, b'q') => Some(i.contains(&b'+')),
        _ => Some(false),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const DENY: TerminalPolicy = TerminalPolicy { clipboard: Clipboard::Deny };
    const ALLOW: TerminalPolicy = TerminalPolicy { clipboard: Clipboard::Allow };

    fn run(policy: TerminalPolicy, input: &[u8]) -> (Vec<u8>, bool) {
        let mut f = TermFilter::new(policy);
        let mut out = Vec::new();
        f.feed(input, &mut out);
        f.finish(&mut out);
        (out, f.relayed_a_query())
    }

    fn filter(input: &[u8]) -> Vec<u8> {
        run(DENY, input).0
    }

    /// The 7-bit, UTF-8 C1 and raw C1 spellings of a sequence written with 7-bit introducers
    /// and `ESC \` as ST.
    fn spellings(seven_bit: &[u8]) -> Vec<Vec<u8>> {
        let c1 = |utf8: bool| {
            let mut out = Vec::new();
            let mut i = 0;
            while i < seven_bit.len() {
                let b = seven_bit[i];
                if b == ESC
                    && let Some(&next) = seven_bit.get(i + 1)
                    && matches!(next, b'[' | b']' | b'P' | b'\\' | b'^' | b'_' | b'X')
                {
                    if utf8 {
                        out.push(C1_LEAD);
                    }
                    out.push(next + 0x40);
                    i += 2;
                } else {
                    out.push(b);
                    i += 1;
                }
            }
            out
        };
        vec![seven_bit.to_vec(), c1(true), c1(false)]
    }

    #[track_caller]
    fn assert_dropped(policy: TerminalPolicy, seq: &[u8]) {
        for form in spellings(seq) {
            let mut input = b"<a>".to_vec();
            input.extend_from_slice(&form);
            input.extend_from_slice(b"<b>");
            let (out, _) = run(policy, &input);
            assert_eq!(out, b"<a><b>", "{:?} passed as {:?}", form.escape_ascii().to_string(), {
                out.escape_ascii().to_string()
            });
        }
    }

    #[track_caller]
    fn assert_passed(policy: TerminalPolicy, seq: &[u8], query: bool) {
        for form in spellings(seq) {
            let (out, answered) = run(policy, &form);
            assert_eq!(out, form, "{} was altered", form.escape_ascii());
            assert_eq!(answered, query, "{}: query flag", form.escape_ascii());
        }
    }

    #[test]
    fn text_passes_byte_exact() {
        // '𝄞' is F0 9D 84 9E and 'Ā' C4 80: continuation bytes in the C1 range are text.
        let text = "plain ascii\r\n\ttabs, é, €, 𝄞, Ā, 日本語, \u{a0}nbsp\u{7}".as_bytes();
        assert_eq!(filter(text), text);
        // Invalid UTF-8 that holds no C1 control passes too, a trailing lead byte included.
        for bytes in [&b"\xff\xfe\xc0\xa0"[..], b"\xc2", b"\xc2\xc2\xa9", b"\xe2\x82"] {
            assert_eq!(filter(bytes), bytes);
        }
    }

    #[test]
    fn what_tuis_need_passes() {
        for (seq, query) in [
            (&b"\x1b[c"[..], true),
            (b"\x1b[0c", true),
            (b"\x1b[>c", true),
            (b"\x1b[=c", true),
            (b"\x1b[5n", true),
            (b"\x1b[6n", true),
            (b"\x1b[?6n", true),
            (b"\x1b[?2026$p", true),
            (b"\x1b[>q", true),
            (b"\x1b[?u", true),
            (b"\x1b[18t", true),
            (b"\x1b]11;?\x07", true),
            (b"\x1b]10;?\x1b\\", true),
            (b"\x1b]4;1;?\x07", true),
            (b"\x1b]12;?\x07", true),
            (b"\x1b]11;rgb:0000/0000/0000\x07", false),
            (b"\x1b]0;my title\x07", false),
            (b"\x1b]2;t\xc3\xa9tle \xf0\x9d\x84\x9e\x1b\\", false),
            (b"\x1b]1;icon\x07", false),
            (b"\x1b]8;;https://example.test/\x1b\\link\x1b]8;;\x1b\\", false),
            (b"\x1b[1;38;2;255;0;0m", false),
            (b"\x1b[38:2::255:0:0m", false),
            (b"\x1b[H\x1b[2J\x1b[10;20H\x1b[3A", false),
            (b"\x1b[?2004h\x1b[?2004l", false),
            (b"\x1b[?1000h\x1b[?1006h", false),
            (b"\x1b[?1049h\x1b[?25l", false),
            (b"\x1b[8;40;120t\x1b[22;0t\x1b[23;0t", false),
            (b"\x1b[5 q", false),
            (b"\x1b7\x1b8\x1b(B\x1b=\x1b>\x1bc", false),
            (b"\x1bP+q544e\x1b\\", true),
            (b"\x1bP0;1;0q#0;2;0;0;0#0!10~-\x1b\\", false),
            (b"\x1b_Ga=T,f=100;AAAA\x1b\\", false),
            (b"\x1b^private\x1b\\", false),
        ] {
            assert_passed(DENY, seq, query);
        }
    }

    #[test]
    fn title_reports_are_dropped() {
        for seq in [
            &b"\x1b[21t"[..],
            b"\x1b[20t",
            b"\x1b[021t",
            b"\x1b[21;0t",
            b"\x1b[21:1t",
            b"\x1b[2\x7f1t",
        ] {
            assert_dropped(DENY, seq);
        }
        // Malformed sequences are dropped rather than guessed at.
        assert_dropped(DENY, b"\x1b[2?1t");
        assert_dropped(DENY, b"\x1b[ 21t");
        // A C0 control inside is executed by the terminal, so it stays.
        assert_eq!(filter(b"a\x1b[2\n1tb"), b"a\nb");
    }

    #[test]
    fn decrqss_is_dropped_and_other_dcs_pass() {
        assert_dropped(DENY, b"\x1bP$qm\x1b\\");
        assert_dropped(DENY, b"\x1bP$q\"p\x1b\\");
        assert_passed(DENY, b"\x1bP1$r0m\x1b\\", false);
        assert_eq!(filter(b"\x1bP1$r0m\x1bP$qr\x1b\\"), b"\x1bP1$r0m\x1b\\");
    }

    #[test]
    fn the_clipboard_is_never_read_and_written_only_when_allowed() {
        let write = b"\x1b]52;c;aGVsbG8=\x07";
        let read = b"\x1b]52;c;?\x07";
        for policy in [DENY, ALLOW] {
            assert_dropped(policy, read);
            assert_dropped(policy, b"\x1b]52;;?\x1b\\");
            assert_dropped(policy, b"\x1b]52;?\x07");
            assert_dropped(policy, b"\x1b]0052;c;?\x07");
            assert_dropped(policy, b"\x1b]52;x;aGVsbG8=\x07");
            assert_dropped(policy, b"\x1b]52\x07");
        }
        assert_dropped(DENY, write);
        assert_dropped(DENY, b"\x1b]52;pc;aGVsbG8=\x1b\\");
        assert_passed(ALLOW, write, false);
        assert_passed(ALLOW, b"\x1b]52;pc;aGVsbG8=\x1b\\", false);
        assert_passed(ALLOW, b"\x1b]52;;\x07", false);
    }

    #[test]
    fn font_iterm2_kitty_and_log_file_oscs_are_dropped() {
        for seq in [
            &b"\x1b]50;?\x07"[..],
            b"\x1b]50;fixed\x1b\\",
            b"\x1b]1337;File=name=eA==;inline=0:aGk=\x07",
            b"\x1b]1337;RequestUpload=format=tgz\x07",
            b"\x1b]5113;ac=send;id=x\x1b\\",
            b"\x1b]5522;type=read\x1b\\",
            b"\x1b]46;/tmp/log\x07",
        ] {
            assert_dropped(DENY, seq);
            assert_dropped(ALLOW, seq);
        }
    }

    #[test]
    fn an_escape_inside_a_passed_string_is_filtered_as_a_new_sequence() {
        // The terminal ends the OSC at ESC and runs `ESC [ 21 t`: so does the filter, which
        // ends the string with an ST of its own.
        assert_eq!(filter(b"\x1b]0;a\x1b[21tb"), b"\x1b]0;a\x1b\\b");
        assert_eq!(filter(b"\x1b]0;a\xc2\x9b21tb"), b"\x1b]0;a\x1b\\b");
        assert_eq!(filter(b"\x1b]0;a\x9b21tb"), b"\x1b]0;a\x1b\\b");
        assert_eq!(filter(b"\x1b_x\x1b]52;c;?\x07y"), b"\x1b_x\x1b\\y");
        assert_eq!(filter(b"\x1b]0;a\x1b[mb"), b"\x1b]0;a\x1b\\\x1b[mb");
        // A dropped string's ST goes with it; a passed one keeps it.
        assert_eq!(filter(b"\x1b]52;c;QQ==\x1b\\z"), b"z");
        assert_eq!(filter(b"\x1b]2;t\x1b\\z"), b"\x1b]2;t\x1b\\z");
        // CAN and SUB cancel.
        assert_eq!(filter(b"\x1b]52;c;?\x18after"), b"after");
        assert_eq!(filter(b"\x1b[21\x18t"), b"\x18t");
    }

    #[test]
    fn over_long_sequences_are_dropped_and_memory_stays_bounded() {
        let mut csi = b"\x1b[".to_vec();
        csi.extend(std::iter::repeat_n(b'1', 10 * MAX_SEQUENCE));
        csi.extend_from_slice(b"mtext");
        assert_eq!(filter(&csi), b"text");
        let mut dcs = b"\x1bP".to_vec();
        dcs.extend(std::iter::repeat_n(b';', 10 * MAX_SEQUENCE));
        dcs.extend_from_slice(b"$qpayload\x1b\\text");
        assert_eq!(filter(&dcs), b"text");
        assert_eq!(filter(b"\x1b]0000000000000000000000000000000000000052;c;?\x07x"), b"x");
        // A long title is streamed as it arrives, not held.
        let mut f = TermFilter::new(DENY);
        let mut out = Vec::new();
        f.feed(b"\x1b]2;", &mut out);
        for _ in 0..10_000 {
            f.feed(b"long title ", &mut out);
            assert!(f.seq.len() <= MAX_SEQUENCE);
        }
        assert_eq!(out.len(), 4 + 10_000 * 11);
    }

    #[test]
    fn a_sequence_split_anywhere_is_decided_the_same() {
        let input = b"a\x1b]52;c;?\x07b\xc2\x9b21tc\xf0\x9d\x84\x9e\x1b]11;?\x1b\\\x1bP$qm\x9c\
                      d\x1b[6ne\xc2\x9d0;t\xc2\x9cf\x1b]1337;File=x\x07g";
        let whole = filter(input);
        let expected: &[&[u8]] =
            &[b"ab", b"c\xf0\x9d\x84\x9e\x1b]11;?\x1b\\", b"d\x1b[6ne\xc2\x9d0;t\xc2\x9cfg"];
        assert_eq!(whole, expected.concat());
        for cut in 0..=input.len() {
            let mut f = TermFilter::new(DENY);
            let mut out = Vec::new();
            f.feed(&input[..cut], &mut out);
            f.feed(&input[cut..], &mut out);
            f.finish(&mut out);
            assert_eq!(out, whole, "split at {cut}");
        }
    }

    #[test]
    fn an_unfinished_sequence_is_dropped_at_the_end() {
        assert_eq!(filter(b"x\x1b[2"), b"x");
        assert_eq!(filter(b"x\x1b]52;c;aGVs"), b"x");
        assert_eq!(filter(b"x\x1b"), b"x");
        assert_eq!(filter(b"x\x1b]0;tit"), b"x\x1b]0;tit");
    }

    #[test]
    fn a_dropped_sequence_cannot_leave_a_passed_string_open() {
        // Were the ST not written, the terminal would read `ESC ] 5` + `2;c;?` as OSC 52.
        for interrupted in [
            &b"\x1b]5\x1b]52;c;?\x07"[..],
            b"\x1b]5\xc2\x9d52;c;?\x07",
            b"\x1b]5\x9d52;c;?\x07",
            b"\x1b]5\x1b\xc2\x9d52;c;?\x07",
            b"\x1b]5\x1b\n\x1b]52;c;?\x07",
        ] {
            let mut input = interrupted.to_vec();
            input.extend_from_slice(b"2;c;?\x07");
            let out = filter(&input);
            assert!(out.starts_with(b"\x1b]5\x1b\\"), "{}", out.escape_ascii());
            assert!(out.ends_with(b"2;c;?\x07"), "{}", out.escape_ascii());
        }
        // C0 controls terminals ignore inside an OSC do not hide its number.
        assert_eq!(filter(b"\x1b]5\n2;c;?\x07x"), b"x");
        assert_eq!(filter(b"\x1b]5\x7f2;c;?\x07x"), b"x");
        assert_eq!(run(ALLOW, b"\x1b]52;c;\n?\x07x").0, b"x");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    const DENY: TerminalPolicy = TerminalPolicy { clipboard: Clipboard::Deny };
    const ALLOW: TerminalPolicy = TerminalPolicy { clipboard: Clipboard::Allow };

    /// Pieces that exercise every state, to be glued together with random bytes.
    const FRAGMENTS: &[&[u8]] = &[
        b"\x1b",
        b"\x1b[",
        b"\x1b]",
        b"\x1bP",
        b"\x1b_",
        b"\x1b^",
        b"\x1bX",
        b"\x1b\\",
        b"\x1b(",
        b"\xc2",
        b"\xc2\x9b",
        b"\xc2\x9d",
        b"\xc2\x90",
        b"\xc2\x9c",
        b"\x9b",
        b"\x9d",
        b"\x90",
        b"\x9c",
        b"\x07",
        b"\x18",
        b"\x1a",
        b"\x7f",
        b"\n",
        b";",
        b"?",
        b"$q",
        b"+q",
        b"52;c;",
        b"21t",
        b"20t",
        b"6n",
        b"c",
        b"11;?",
        b"0;",
        b"1337;",
        b"m",
        b"\xe2\x82\xac",
        b"\xf0\x9d\x84\x9e",
        b"\xe0",
        b"\xed\x9b",
    ];

    fn stream() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            proptest::sample::select(FRAGMENTS).prop_map(<[u8]>::to_vec),
            proptest::collection::vec(any::<u8>(), 0..8),
        ];
        proptest::collection::vec(piece, 0..40).prop_map(|p| p.concat())
    }

    fn filter_in_chunks(policy: TerminalPolicy, input: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut f = TermFilter::new(policy);
        let mut out = Vec::new();
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        cuts.sort_unstable();
        let mut start = 0;
        for cut in cuts {
            f.feed(&input[start..cut], &mut out);
            start = cut;
            assert!(f.seq.len() <= MAX_SEQUENCE, "held {} bytes", f.seq.len());
        }
        f.feed(&input[start..], &mut out);
        f.finish(&mut out);
        out
    }

    /// Sequences the filter must drop, spelled with 7-bit and UTF-8 C1 introducers (a raw C1
    /// byte right after a UTF-8 lead byte is that character's continuation, not a control).
    /// Each payload carries `MARK`, which the random bytes between them cannot spell.
    fn dropped(clipboard: Clipboard) -> Vec<Vec<u8>> {
        let mut seqs: Vec<&[u8]> = vec![
            b"\x1b]52;c;?MARK\x07",
            b"\xc2\x9d52;;?MARK\xc2\x9c",
            b"\x1bP$qMARK\x1b\\",
            b"\xc2\x90$qMARK\xc2\x9c",
            b"\x1b]50;?MARK\x07",
            b"\x1b]1337;File=MARK\x1b\\",
            b"\x1b]5113;MARK\x07",
        ];
        if clipboard == Clipboard::Deny {
            seqs.push(b"\x1b]52;c;TUFSSw==MARK\x07");
        }
        seqs.into_iter().map(<[u8]>::to_vec).collect()
    }

    /// Byte strings no output may hold: the dropped sequences' heads, in 7-bit and UTF-8 form.
    const FORBIDDEN: &[&[u8]] = &[
        b"MARK",
        b"\x1b[21t",
        b"\x1b[20t",
        b"\xc2\x9b21t",
        b"\xc2\x9b20t",
        b"\x1bP$q",
        b"\xc2\x90$q",
        b"\x1b]50;",
        b"\xc2\x9d50;",
        b"\x1b]1337;",
        b"\x1b]5113;",
    ];

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    proptest! {
        #[test]
        fn chunking_never_changes_the_output(
            input in stream(),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
            allow in any::<bool>(),
        ) {
            let policy = if allow { ALLOW } else { DENY };
            let whole = filter_in_chunks(policy, &input, &[]);
            prop_assert_eq!(filter_in_chunks(policy, &input, &cuts), whole);
        }

        #[test]
        fn text_without_escapes_or_c1_is_unchanged(
            text in "[^\u{1b}\u{80}-\u{9f}]{0,200}",
            bytes in proptest::collection::vec(
                prop_oneof![0x00u8..0x1b, 0x1cu8..0x80, 0xa0u8..=0xff], 0..200),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            prop_assert_eq!(filter_in_chunks(DENY, text.as_bytes(), &cuts), text.as_bytes());
            prop_assert_eq!(filter_in_chunks(DENY, &bytes, &cuts), bytes);
        }

        #[test]
        fn no_dropped_sequence_reaches_the_terminal(
            filler in proptest::collection::vec(stream(), 1..8),
            picks in proptest::collection::vec(any::<proptest::sample::Index>(), 1..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
            allow in any::<bool>(),
        ) {
            let clipboard = if allow { Clipboard::Allow } else { Clipboard::Deny };
            let seqs = dropped(clipboard);
            let mut input = Vec::new();
            for (fill, pick) in filler.iter().zip(&picks) {
                // The random bytes may not spell the marker themselves.
                let fill: Vec<u8> = fill.iter().map(|&b| if b == b'M' { b'm' } else { b }).collect();
                input.extend_from_slice(&fill);
                let seq: &Vec<u8> = pick.get(&seqs);
                input.extend_from_slice(seq);
                input.extend_from_slice(b"\x1b[21t\xc2\x9b20t");
            }
            let out = filter_in_chunks(TerminalPolicy { clipboard }, &input, &cuts);
            for needle in FORBIDDEN {
                prop_assert!(
                    !contains(&out, needle),
                    "{} in {}", needle.escape_ascii(), out.escape_ascii()
                );
            }
            if clipboard == Clipboard::Deny {
                prop_assert!(!contains(&out, b"\x1b]52;") && !contains(&out, b"\xc2\x9d52;"));
            }
        }
    }
}
