//! The IPC channel between a requester and a source. On one host it is a
//! Unix stream socket: it carries the IPC protocol frames and file
//! descriptors (the SHM and POSIX-fd handles) with `SCM_RIGHTS`; the source
//! listens on an abstract socket name advertised in its Describe, and the
//! kernel tells it who connected (`SO_PEERCRED`), which is how the
//! requester's process identity is checked. For MNNVL with fabric handles
//! and a fabric domain the same protocol runs over a TCP connection to the
//! source's endpoint (peers on other hosts of the NVLink partition): no
//! descriptor can cross it, and the source checks the fabric domain and
//! epochs instead of the kernel's word. With a shared key such a fabric
//! channel is sealed after its authentication, as a control connection is
//! (`control::seal`, `control::wire`): every frame travels in records checked
//! before anything in them is acted on.

use crate::control::auth::FrameIo;
use crate::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use crate::control::io::{self, Tick, TICK};
use crate::control::seal::{Opener, Sealer};
use crate::control::wire::{self, Wire};
use crate::error::{Error, Result};
use crate::sync::deadline::{never_stop, Deadline};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::Instant;

/// One received frame.
pub struct Frame {
    /// Kind.
    pub kind: MsgKind,
    /// Body.
    pub body: Vec<u8>,
    /// A file descriptor that arrived with the frame.
    pub fd: Option<OwnedFd>,
    /// A second one (only a Welcome carries two: the grant board and the
    /// source's liveness page).
    pub second_fd: Option<OwnedFd>,
}

/// The socket under a channel.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

/// A connected IPC channel.
pub struct Channel {
    stream: Stream,
    /// A sealed fabric channel's sending half: what this handle sends
    /// leaves in records made here.
    sealer: Option<Box<Sealer>>,
    /// A sealed fabric channel's receiving half: what this handle receives
    /// is checked here before it is returned.
    opener: Option<Box<Opener>>,
}

/// The most descriptors one frame carries (a Welcome's two).
pub const MAX_FDS: usize = 2;

/// Binds the abstract socket `name`.
pub fn listen(name: &str) -> Result<UnixListener> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| Error::io("abstract socket name", &e))?;
    UnixListener::bind_addr(&addr).map_err(|e| Error::Unavailable(format!("cannot listen on IPC socket @{name}: {e}")))
}

impl Channel {
    /// A duplicate of a Unix channel's socket, to watch for the peer
    /// hanging up without touching the channel (`None` over TCP).
    pub fn watch_fd(&self) -> Option<std::os::fd::OwnedFd> {
        match &self.stream {
            Stream::Unix(u) => u.try_clone().ok().map(std::os::fd::OwnedFd::from),
            Stream::Tcp(_) => None,
        }
    }

    /// A second handle on the same socket (a duplicated descriptor): one
    /// thread may send on one while another receives on the other.
    pub fn try_clone(&self) -> Result<Channel> {
        let stream = match &self.stream {
            Stream::Unix(u) => u.try_clone().map(Stream::Unix),
            Stream::Tcp(t) => t.try_clone().map(Stream::Tcp),
        }
        .map_err(|e| Error::io("duplicating the IPC channel's socket", &e))?;
        Ok(Channel::over(stream))
    }

    fn over(stream: Stream) -> Channel {
        Channel { stream, sealer: None, opener: None }
    }

    /// Seals a fabric channel from here on, with the halves of the key's
    /// session (`control::auth`): what it sends leaves in records, what it
    /// receives must check. Over a Unix channel `NotSupported` (the kernel
    /// joins its ends; nothing is sealed there).
    pub fn seal(&mut self, (tx, rx): (Sealer, Opener)) -> Result<()> {
        if !self.is_tcp() {
            return Err(Error::NotSupported("only a fabric (TCP) channel is sealed".into()));
        }
        self.sealer = Some(Box::new(tx));
        self.opener = Some(Box::new(rx));
        Ok(())
    }

    /// A second handle on the socket that receives for this one: it takes
    /// the receiving half of the seal (this handle keeps sending).
    pub fn receiver(&mut self) -> Result<Channel> {
        let mut rx = self.try_clone()?;
        rx.opener = self.opener.take();
        Ok(rx)
    }

    /// How the channel's bytes travel, for a driver that moves them itself
    /// (non-blocking, through [`Channel::tcp`]): the seal's halves move to
    /// the `Wire`; `Wire::Plain` when the channel is not sealed.
    pub fn take_wire(&mut self) -> Wire {
        match (self.sealer.take(), self.opener.take()) {
            (Some(tx), Some(rx)) => Wire::sealed((*tx, *rx)),
            _ => Wire::Plain,
        }
    }

    /// The TCP connection of a fabric channel (`None` for a Unix one).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match &self.stream {
            Stream::Tcp(s) => Some(s),
            Stream::Unix(_) => None,
        }
    }

    /// Wraps an accepted Unix stream.
    pub fn from_stream(stream: UnixStream) -> Result<Channel> {
        stream.set_read_timeout(Some(TICK)).map_err(|e| Error::io("set_read_timeout", &e))?;
        stream.set_write_timeout(Some(TICK)).map_err(|e| Error::io("set_write_timeout", &e))?;
        Ok(Channel::over(Stream::Unix(stream)))
    }

    /// Wraps a TCP connection (a fabric channel).
    pub fn from_tcp(stream: TcpStream) -> Result<Channel> {
        let _ = stream.set_nodelay(true);
        stream.set_read_timeout(Some(TICK)).map_err(|e| Error::io("set_read_timeout", &e))?;
        stream.set_write_timeout(Some(TICK)).map_err(|e| Error::io("set_write_timeout", &e))?;
        Ok(Channel::over(Stream::Tcp(stream)))
    }

    /// Connects a fabric channel to the source's TCP endpoint.
    pub fn connect_tcp(endpoint: &str, deadline: Instant) -> Result<Channel> {
        let addr = crate::control::endpoint::parse(endpoint)?;
        let wait = deadline.saturating_duration_since(Instant::now()).max(std::time::Duration::from_millis(1));
        let s = TcpStream::connect_timeout(&addr, wait).map_err(|e| match e.kind() {
            ErrorKind::ConnectionRefused => {
                Error::StalePeer(format!("no engine listens at {endpoint} any more (gone or restarted)"))
            }
            ErrorKind::TimedOut | ErrorKind::WouldBlock => {
                Error::TimedOut(format!("fabric channel to {endpoint}: no answer within {wait:?}"))
            }
            _ => Error::Unavailable(format!("cannot open a fabric channel to {endpoint}: {e}")),
        })?;
        Channel::from_tcp(s)
    }

    /// Whether the channel runs over TCP (no descriptors, no kernel identity).
    pub fn is_tcp(&self) -> bool {
        matches!(self.stream, Stream::Tcp(_))
    }

    /// Connects to the abstract socket `name`, waiting at most a minute
    /// (tools and tests; the engine bounds its connects by their deadline
    /// with [`Channel::connect_until`]).
    pub fn connect(name: &str) -> Result<Channel> {
        Channel::connect_until(name, Instant::now() + std::time::Duration::from_secs(60))
    }

    /// Connects to the abstract socket `name`, waiting until `deadline` at
    /// most: a Unix connect waits while the listener's backlog is full (a
    /// frozen source, or a process on its name that never accepts), bounded
    /// here by the socket's send timeout (`SO_SNDTIMEO`). `TIMED_OUT` then.
    pub fn connect_until(name: &str, deadline: Instant) -> Result<Channel> {
        if name.is_empty() || name.len() > crate::control::message::MAX_IPC_NAME {
            return Err(Error::InvalidArgument(format!("{name:?} is not an abstract socket name")));
        }
        // SAFETY: a new socket; the result is checked before it is owned.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(Error::io("socket", &std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just made and belongs to nothing else.
        let s = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let wait = deadline.saturating_duration_since(Instant::now()).max(std::time::Duration::from_millis(1));
        s.set_write_timeout(Some(wait)).map_err(|e| Error::io("set_write_timeout", &e))?;
        // SAFETY: all zeros is a valid sockaddr_un.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        // An abstract name: a NUL, then the name's bytes (no terminator).
        for (to, b) in addr.sun_path[1..].iter_mut().zip(name.bytes()) {
            *to = b as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
        loop {
            // SAFETY: `addr` is a sockaddr_un whose first `len` bytes are
            // set; the descriptor is the socket made above.
            let r = unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len as libc::socklen_t) };
            if r == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted && Instant::now() < deadline {
                continue;
            }
            return Err(match e.kind() {
                ErrorKind::ConnectionRefused | ErrorKind::NotFound => {
                    Error::StalePeer(format!("no IPC channel @{name}: the source process is gone or was restarted"))
                }
                ErrorKind::WouldBlock | ErrorKind::Interrupted => Error::TimedOut(format!(
                    "IPC channel @{name}: its listener took no connection within {wait:?} (its backlog is full)"
                )),
                _ => Error::Unavailable(format!("cannot connect to IPC channel @{name}: {e}")),
            });
        }
        Channel::from_stream(s)
    }

    /// The pid and uid of the process at the other end (kernel-verified).
    pub fn peer_cred(&self) -> Result<(u32, u32)> {
        if self.is_tcp() {
            return Err(Error::NotSupported("a TCP channel has no kernel-verified peer process".into()));
        }
        let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `cred`.
        let r = unsafe {
            libc::getsockopt(
                self.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(Error::io("SO_PEERCRED", &std::io::Error::last_os_error()));
        }
        Ok((cred.pid as u32, cred.uid))
    }

    /// Shuts the channel down (wakes a blocked reader).
    pub fn shutdown(&self) {
        let _ = match &self.stream {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }

    /// Sends a frame, with `fds` (at most [`MAX_FDS`]) attached.
    pub fn send(&mut self, kind: MsgKind, body: &[u8], fds: &[RawFd], tick: Tick<'_>) -> Result<()> {
        let h = FrameHeader::encode(kind, body.len() as u32);
        if fds.is_empty() {
            return match (&mut self.sealer, &mut self.stream) {
                (Some(tx), Stream::Tcp(s)) => wire::write_frame(s, tx, kind, body, tick),
                (_, s) => io::write_frame(s, kind, body, tick),
            };
        }
        match fds {
            _ if self.is_tcp() => Err(Error::NotSupported(format!(
                "{kind:?} carries a file descriptor, which cannot cross a TCP (fabric) channel"
            ))),
            _ => {
                let mut msg = h.to_vec();
                msg.extend_from_slice(body);
                self.send_with_fds(&msg, fds, tick)
            }
        }
    }

    fn send_with_fds(&mut self, msg: &[u8], fds: &[RawFd], tick: Tick<'_>) -> Result<()> {
        // The fds ride on the first byte of the message; the rest may follow.
        let sent = loop {
            match self.sendmsg_fds(msg, fds, 0) {
                Ok(n) => break n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => tick()?,
                Err(e) => return Err(Error::Unavailable(format!("IPC channel lost: {e}"))),
            }
        };
        let mut w = 0;
        io::write_all_parts(&mut self.stream, &[&msg[sent..]], tick, &mut w)
    }

    /// The socket's descriptor (to register with an event loop).
    pub fn raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Switches the socket to non-blocking mode (served by an I/O thread).
    pub fn set_nonblocking(&self) -> Result<()> {
        match &self.stream {
            Stream::Unix(s) => s.set_nonblocking(true),
            Stream::Tcp(s) => s.set_nonblocking(true),
        }
        .map_err(|e| Error::io("set_nonblocking", &e))
    }

    /// One non-blocking receive into `buf`: the bytes, the end of the
    /// stream, or nothing for now; and whether descriptors came along
    /// (they are closed here: the caller only needs to know).
    pub fn recv_some(&self, buf: &mut [u8]) -> Result<(crate::control::pipe::Got, bool)> {
        use crate::control::pipe::Got;
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32 * 4) } as usize;
        let mut cbuf = [0u64; 8];
        let space = space.min(std::mem::size_of_val(&cbuf));
        loop {
            let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
            // SAFETY: an all-zero msghdr is valid; the fields are set below.
            let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
            mh.msg_iov = &mut iov;
            mh.msg_iovlen = 1;
            mh.msg_control = cbuf.as_mut_ptr().cast();
            mh.msg_controllen = space as _;
            // SAFETY: mh describes valid buffers for the duration of the call.
            let n =
                unsafe { libc::recvmsg(self.stream.as_raw_fd(), &mut mh, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    ErrorKind::WouldBlock => return Ok((Got::Drained, false)),
                    ErrorKind::Interrupted => continue,
                    _ => return Err(Error::Unavailable(format!("IPC channel lost: {e}"))),
                }
            }
            // SAFETY: the kernel filled the control buffer of `mh`.
            let fds = !unsafe { received_fds(&mh) }.is_empty();
            return Ok((if n == 0 { Got::Eof } else { Got::Bytes(n as usize) }, fds));
        }
    }

    /// One non-blocking send of `bytes`, with `fd` attached (on a Unix
    /// channel) when given: how many bytes the socket took.
    pub fn send_some(&self, bytes: &[u8], fd: Option<RawFd>) -> std::io::Result<usize> {
        self.sendmsg_fds(bytes, fd.as_slice(), libc::MSG_DONTWAIT)
    }

    /// One `sendmsg` of `bytes` with `fds` (at most [`MAX_FDS`]) attached
    /// (never a SIGPIPE; `flags` added), retried when interrupted.
    fn sendmsg_fds(&self, bytes: &[u8], fds: &[RawFd], flags: i32) -> std::io::Result<usize> {
        assert!(fds.len() <= MAX_FDS, "at most {MAX_FDS} descriptors per frame");
        let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
        let mut cbuf = [0u64; 4];
        // SAFETY: an all-zero msghdr is valid; the fields are set below.
        let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        if !fds.is_empty() {
            let payload = std::mem::size_of_val(fds) as u32;
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
            mh.msg_control = cbuf.as_mut_ptr().cast();
            mh.msg_controllen = space as _;
            // SAFETY: mh points at cbuf, which has room for one cmsg
            // carrying MAX_FDS fds (space <= 24 bytes <= 32).
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&mh);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(payload) as _;
                for (k, fd) in fds.iter().enumerate() {
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>().add(k), *fd);
                }
            }
        }
        loop {
            // SAFETY: mh describes valid buffers for the duration of the call.
            let n = unsafe { libc::sendmsg(self.stream.as_raw_fd(), &mh, libc::MSG_NOSIGNAL | flags) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives one frame (and an fd if one came with it).
    pub fn recv(&mut self, tick: Tick<'_>) -> Result<Frame> {
        self.recv_bounded(tick, None)
    }

    /// Like [`Channel::recv`], but once a frame has started it must be
    /// complete within `frame_timeout` (a slow peer is a protocol error).
    pub fn recv_bounded(&mut self, tick: Tick<'_>, frame_timeout: Option<std::time::Duration>) -> Result<Frame> {
        if let Some(rx) = &mut self.opener {
            // Sealed: a whole frame in checked records (no descriptor can
            // come over TCP). A record that does not check ends the call.
            let (h, body) = wire::read_frame(&mut self.stream, rx, &[], tick)?;
            return Ok(Frame { kind: h.kind, body, fd: None, second_fd: None });
        }
        let started: std::cell::Cell<Option<Instant>> = std::cell::Cell::new(None);
        let mut tick = || {
            tick()?;
            if let (Some(t0), Some(limit)) = (started.get(), frame_timeout) {
                if t0.elapsed() >= limit {
                    return Err(Error::Protocol(format!("IPC frame not completed within {limit:?} (peer too slow)")));
                }
            }
            Ok(())
        };
        let mut h = [0u8; FRAME_HEADER_LEN];
        let mut got = 0usize;
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut arrived = 0usize;
        while got < FRAME_HEADER_LEN {
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32 * 4) } as usize;
            let mut cbuf = vec![0u8; space];
            let mut iov = libc::iovec { iov_base: h[got..].as_mut_ptr().cast(), iov_len: FRAME_HEADER_LEN - got };
            // SAFETY: an all-zero msghdr is valid; the fields are set below.
            let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
            mh.msg_iov = &mut iov;
            mh.msg_iovlen = 1;
            mh.msg_control = cbuf.as_mut_ptr().cast();
            mh.msg_controllen = space as _;
            // SAFETY: mh describes valid buffers for the duration of the call.
            let n = unsafe { libc::recvmsg(self.stream.as_raw_fd(), &mut mh, libc::MSG_CMSG_CLOEXEC) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                        tick()?;
                        continue;
                    }
                    ErrorKind::Interrupted => continue,
                    _ => return Err(Error::Unavailable(format!("IPC channel lost: {e}"))),
                }
            }
            if n == 0 {
                return Err(Error::Unavailable("the IPC channel was closed by the peer".into()));
            }
            // Every fd that came along: the first MAX_FDS are kept, others closed.
            // SAFETY: the kernel filled the control buffer of `mh`.
            for owned in unsafe { received_fds(&mh) } {
                arrived += 1;
                if fds.len() < MAX_FDS {
                    fds.push(owned);
                }
            }
            got += n as usize;
            if started.get().is_none() {
                started.set(Some(Instant::now()));
            }
        }
        let header = FrameHeader::decode(&h)?;
        if header.body_len > crate::control::frame::MAX_CONTROL_BODY {
            return Err(Error::Protocol(format!("IPC frame of {} bytes is too large", header.body_len)));
        }
        let body = io::read_body(&mut self.stream, header.body_len, &mut tick)?;
        // Descriptors come only with an export's handle or a POSIX-fd MNNVL
        // probe (one) and with the Welcome (the source's grant board and
        // liveness page).
        let allowed = match header.kind {
            MsgKind::ExportHandle | MsgKind::MnnvlProbeAnswer => 1,
            MsgKind::IpcWelcome => MAX_FDS,
            _ => 0,
        };
        if arrived > allowed {
            return Err(Error::Protocol(format!("{arrived} file descriptors arrived with {:?}", header.kind)));
        }
        let mut fds = fds.into_iter();
        Ok(Frame { kind: header.kind, body, fd: fds.next(), second_fd: fds.next() })
    }

    /// Sends a request and receives its answer, within `deadline`.
    pub fn call(&mut self, kind: MsgKind, body: &[u8], deadline: Instant, what: &str) -> Result<Frame> {
        let mut tick = || deadline_tick(deadline, what);
        self.send(kind, body, &[], &mut tick)?;
        self.recv(&mut tick)
    }
}

/// The descriptors a `recvmsg` received, owned (closed when dropped).
///
/// # Safety
/// `mh` must be the header of a `recvmsg` that succeeded, its control
/// buffer still alive.
unsafe fn received_fds(mh: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    // SAFETY: the caller guarantees the control buffer is the kernel's,
    // so every SCM_RIGHTS entry holds descriptors now owned by us.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for k in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(k))));
                }
            }
            c = libc::CMSG_NXTHDR(mh, c);
        }
    }
    fds
}

/// A channel within the deadline of its handshake, for the authentication
/// exchange (`control::auth`).
pub struct ChannelIo<'a> {
    /// The channel.
    pub ch: &'a mut Channel,
    /// When the handshake must be over, and what stops it.
    pub bound: Deadline<'a>,
}

fn handshake_late() -> Error {
    late("IPC handshake")
}

impl FrameIo for ChannelIo<'_> {
    fn send_frame(&mut self, kind: MsgKind, body: &[u8]) -> Result<()> {
        self.ch.send(kind, body, &[], &mut self.bound.ticker(handshake_late))
    }
    fn recv_frame(&mut self) -> Result<(MsgKind, Vec<u8>)> {
        let f = self.ch.recv(&mut self.bound.ticker(handshake_late))?;
        Ok((f.kind, f.body))
    }
}

/// Why a wait for `what` failed: its deadline passed.
fn late(what: &str) -> Error {
    Error::TimedOut(format!("{what}: no answer before the deadline"))
}

/// A tick that fails once `deadline` has passed.
pub fn deadline_tick(deadline: Instant, what: &str) -> Result<()> {
    Deadline { at: deadline, stop: &never_stop }.tick(|| late(what))
}

/// Whether a peer running as `uid` (from [`Channel::peer_cred`]) may open a
/// Unix channel: this process's own user, or one of `allowed`.
pub fn admits_uid(uid: u32, allowed: &[u32]) -> bool {
    // SAFETY: geteuid has no memory effects.
    uid == unsafe { libc::geteuid() } || allowed.contains(&uid)
}

#[cfg(test)]
#[path = "channel_tests.rs"]
mod tests;
