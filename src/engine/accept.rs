//! The two listeners of an engine: the TCP control socket and the IPC
//! channel (abstract Unix socket). Each accepted connection gets a serving
//! thread; finished ones are reaped so limits count live connections. A TCP
//! connection that opens with an `IpcHello` is an MNNVL fabric channel and
//! is served by the IPC source (which accepts it only for its fabric domain).

use crate::control::frame::{FrameHeader, FRAME_HEADER_LEN};
use crate::transport::ipc::channel::Channel;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::Inner;
use crate::control::frame::MsgKind;
use crate::control::io;
use crate::control::message;
use crate::error::{Error, Status};
use crate::transport::ipc::source::IpcSourceContext;
use crate::transport::tcp::{self, SourceContext};
use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A served connection: a handle to shut it down and its thread.
pub(crate) enum ConnHandle {
    Tcp(TcpStream),
    Unix(UnixStream),
}

pub(crate) struct Incoming {
    pub(crate) conn: ConnHandle,
    pub(crate) thread: Option<JoinHandle<()>>,
}

impl Incoming {
    /// Whether its serving thread is still running.
    pub(crate) fn is_live(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    pub(crate) fn stop(&mut self) {
        match &self.conn {
            ConnHandle::Tcp(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            ConnHandle::Unix(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn reap(inc: &mut HashMap<u64, Incoming>) {
    let done: Vec<u64> =
        inc.iter().filter(|(_, v)| v.thread.as_ref().is_some_and(|t| t.is_finished())).map(|(k, _)| *k).collect();
    for k in done {
        if let Some(mut v) = inc.remove(&k) {
            if let Some(t) = v.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Waits for the next connection; `None` once the engine stops.
/// Transient failures (e.g. EMFILE) back off briefly instead of spinning.
fn next_conn<S>(inner: &Inner, accept: impl Fn() -> std::io::Result<S>) -> Option<S> {
    loop {
        match accept() {
            Ok(s) => return (!inner.stopping.load(Ordering::Acquire)).then_some(s),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) if inner.stopping.load(Ordering::Acquire) => return None,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Serves an admitted connection on its own thread and records it.
fn serve_in_thread(
    inner: &Inner,
    inc: &mut HashMap<u64, Incoming>,
    conn: ConnHandle,
    name: &str,
    serve: impl FnOnce(u64) + Send + 'static,
) {
    let id = inner.next_incoming.fetch_add(1, Ordering::Relaxed);
    match std::thread::Builder::new().name(name.into()).spawn(move || serve(id)) {
        Ok(t) => {
            inc.insert(id, Incoming { conn, thread: Some(t) });
        }
        Err(_) => Incoming { conn, thread: None }.stop(),
    }
}

/// Whether a TCP connection opens with an `IpcHello` (a fabric channel):
/// peeks at the first frame header for up to `within`.
fn opens_with_ipc_hello(stream: &TcpStream, within: Duration, stopping: &AtomicBool) -> bool {
    let _ = stream.set_read_timeout(Some(io::TICK));
    let deadline = Instant::now() + within;
    let mut h = [0u8; FRAME_HEADER_LEN];
    loop {
        match stream.peek(&mut h) {
            Ok(n) if n >= FRAME_HEADER_LEN => {
                return FrameHeader::decode(&h).is_ok_and(|f| f.kind == MsgKind::IpcHello);
            }
            Ok(0) => return false,
            // A partial header: wait for the rest without spinning.
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
        if Instant::now() >= deadline || stopping.load(Ordering::Acquire) {
            return false;
        }
    }
}

/// Accepts TCP control connections (and fabric channels) until the engine stops.
pub(crate) fn tcp_accept_loop(inner: Arc<Inner>, ctx: Arc<SourceContext>, ipc: Arc<IpcSourceContext>) {
    while let Some(stream) = next_conn(&inner, || inner.listener.accept().map(|(s, _)| s)) {
        let mut inc = inner.incoming.lock();
        reap(&mut inc);
        let limit = inner.config.max_incoming_connections as usize;
        if inc.len() >= limit || !inner.source_gate.is_open() {
            drop(inc);
            inner.stats.connections_refused.fetch_add(1, Ordering::Relaxed);
            let why = if inner.source_gate.is_open() {
                (Status::ResourceExhausted, format!("connection limit of {limit} reached"))
            } else {
                (Status::Unavailable, "the source side is closed".to_string())
            };
            let mut s = stream;
            let _ = s.set_write_timeout(Some(io::TICK));
            let mut tick = || Err(Error::TimedOut("refusal".into()));
            let _ = io::write_frame(&mut s, MsgKind::Error, &message::encode_error(why.0, &why.1), &mut tick);
            let _ = s.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(handle) = stream.try_clone() else { continue };
        let (c, fabric) = (ctx.clone(), ipc.clone());
        serve_in_thread(&inner, &mut inc, ConnHandle::Tcp(handle), "orbite-serve", move |id| {
            if opens_with_ipc_hello(&stream, fabric.handshake_timeout, &fabric.stopping) {
                if let Ok(ch) = Channel::from_tcp(stream) {
                    crate::transport::ipc::source::serve(fabric, ch, id);
                }
                return;
            }
            tcp::serve(c, stream)
        });
    }
}

/// Accepts IPC channel connections until the engine stops.
pub(crate) fn ipc_accept_loop(inner: Arc<Inner>, ctx: Arc<IpcSourceContext>) {
    let Some(listener) = inner.ipc_listener.as_ref() else { return };
    while let Some(stream) = next_conn(&inner, || listener.accept().map(|(s, _)| s)) {
        let mut inc = inner.incoming.lock();
        reap(&mut inc);
        if inc.len() >= inner.config.max_incoming_connections as usize {
            drop(inc);
            inner.stats.connections_refused.fetch_add(1, Ordering::Relaxed);
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(handle) = stream.try_clone() else { continue };
        let c = ctx.clone();
        serve_in_thread(&inner, &mut inc, ConnHandle::Unix(handle), "orbite-ipc-serve", move |id| {
            if let Ok(ch) = Channel::from_stream(stream) {
                crate::transport::ipc::source::serve(c, ch, id)
            }
        });
    }
}
