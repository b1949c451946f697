//! One connection that completed hello, and its requests.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use super::ClientError;
use crate::protocol::{
    self, Capabilities, FrameBuf, FrameError, Request, Response, StatusReply, VersionRange,
};
use crate::sys::fdpass;

/// A connection that completed hello.
#[derive(Debug)]
pub struct Client {
    pub(super) stream: UnixStream,
    pub(super) frames: FrameBuf,
    /// The shared protocol version; `None` if the daemon shares none.
    pub version: Option<u32>,
    pub daemon_protocol: VersionRange,
    pub daemon_version: String,
    pub daemon_sessions: usize,
    pub daemon_pid: u32,
    pub boot: String,
    /// The optional features in force on this connection (none under version 1).
    pub capabilities: Capabilities,
}

impl Client {
    /// Sends one request (with its fds attached to the first byte, if any) and reads its reply.
    pub fn call(
        &mut self,
        req: &Request,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<Response, FrameError> {
        let bytes = protocol::encode(req)?;
        let mut sent = 0;
        if !fds.is_empty() {
            sent = fdpass::send_with_fds(self.stream.as_fd(), &bytes, fds)?;
        }
        self.stream.write_all(&bytes[sent..])?;
        self.read_reply()
    }

    fn read_reply(&mut self) -> Result<Response, FrameError> {
        loop {
            if let Some(resp) = self.frames.next_message::<Response>()? {
                return Ok(resp);
            }
            let mut buf = [0u8; 16 * 1024];
            let n = self.stream.read(&mut buf)?;
            if n == 0 {
                return Err(FrameError::Closed);
            }
            self.frames.extend(&buf[..n]);
        }
    }

    /// `status`.
    pub fn status(&mut self) -> Result<StatusReply, ClientError> {
        match self.call(&Request::Status, &[])? {
            Response::Status(s) => Ok(*s),
            Response::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `gate_list` (capability `gates`): the book's version and its pending gates; with
    /// `after`, once the book changed past that version or `wait_ms` ran out.
    pub fn gate_list(
        &mut self,
        after: Option<u64>,
        wait_ms: Option<u64>,
    ) -> Result<(u64, Vec<protocol::GateInfo>), ClientError> {
        self.require(protocol::GATES)?;
        match self.call(&Request::GateList { after, wait_ms }, &[])? {
            Response::Gates { version, gates } => Ok((version, gates)),
            Response::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `gate_decide`: `(state, self)` of the decided gate.
    pub fn gate_decide(
        &mut self,
        decision: protocol::GateDecision,
    ) -> Result<(protocol::GateState, bool), ClientError> {
        self.require(protocol::GATES)?;
        match self.call(&Request::GateDecide(decision), &[])? {
            Response::GateDecided { state, self_decided, .. } => Ok((state, self_decided)),
            Response::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `phase_set` (capability `phases`): `(phase, previous, seq)` of the switch made.
    pub fn phase_set(
        &mut self,
        session: &str,
        phase: Option<&str>,
    ) -> Result<(Option<String>, Option<String>, u64), ClientError> {
        self.require(protocol::PHASES)?;
        let req =
            Request::PhaseSet { session: session.to_owned(), phase: phase.map(str::to_owned) };
        match self.call(&req, &[])? {
            Response::PhaseSet { phase, previous, seq, .. } => Ok((phase, previous, seq)),
            Response::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    fn require(&self, capability: &str) -> Result<(), ClientError> {
        if self.capabilities.contains(capability) {
            return Ok(());
        }
        Err(ClientError::Unexpected(format!(
            "the running airlockd v{} does not offer `{capability}`; restart it from this airlock \
             build (it restarts on the next connection once idle: `airlock status`)",
            self.daemon_version
        )))
    }

    /// `quit_if_idle`: `(quitting, sessions)`. When quitting, waits until the daemon closes.
    pub(super) fn quit_if_idle(mut self) -> Result<(bool, usize), ClientError> {
        match self.call(&Request::QuitIfIdle, &[])? {
            Response::QuitIfIdle { quitting, sessions } => {
                if quitting {
                    // The daemon drains and closes us; wait for that so the retry meets the
                    // next instance.
                    let mut sink = [0u8; 256];
                    while matches!(self.stream.read(&mut sink), Ok(n) if n > 0) {}
                }
                Ok((quitting, sessions))
            }
            Response::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// The raw stream (for tests and benchmarks).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }
}
