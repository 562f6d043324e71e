//! `orbite-peer --import`: a hostile importer, for the tests of a source's
//! export table (`tests/hostile_exports.rs`) and for measuring a source
//! that holds many exports. It opens the source's SHM channel itself (no
//! engine, no thread of its own), asks for N exports of one range and
//! accepts each, maps the first and keeps that mapping (the others'
//! descriptors are closed at once, or kept with `--keep`), and sends no
//! close receipt unless told to.
//!
//! ```text
//! orbite-peer --import ENDPOINT --grant ADDR:LEN[:w] [--count N] [--keep 1]
//! -> "held H" (H exports held), or "held H refused STATUS MESSAGE" when a
//!    request was refused (no more are asked for on that channel)
//! commands:
//!   more N [ADDR:LEN[:w]]
//!               asks for N more (of another range when given) on a new
//!               channel of this process -> as above
//!   hangup      closes every channel without a receipt -> "ok"
//!   main_exits  the main thread exits alone; another thread of the process
//!               answers the next commands -> "ok"
//!   fork        forks; the child (holding the mapping) answers the next
//!               commands, the parent exits at once -> "forked PID"
//!   holder      forks a child that only holds the mapping (and no
//!               channel) until `drop_holder` or this process's end
//!               -> "holder PID"
//!   drop_holder lets the holder exit -> "ok"
//!   close       unmaps its own mapping, then sends the close receipt of
//!               every export held, on the last channel -> "closed K"
//!   poke OFF B  writes byte B at offset OFF of the mapping (with :w) -> "ok"
//!   exit        exits (no answer)
//! ```

use super::{die, reply};
use orbite::control::frame::MsgKind;
use orbite::control::io::{self, HeaderRead};
use orbite::control::message::Describe;
use orbite::control::Identity;
use orbite::memory::owners;
use orbite::transport::ipc::channel::Channel;
use orbite::transport::ipc::messages::{
    decode_reject, ExportOffer, ExportRef, ExportRequest, Hello, OP_READ, OP_WRITE,
};
use orbite::TransportKind;
use std::io::Write;
use std::time::{Duration, Instant};

/// What the importer holds.
struct Importer {
    /// The source as its Describe says (IPC name, epoch, regions).
    source: Describe,
    region_epoch: u64,
    addr: u64,
    len: u64,
    writable: bool,
    /// Channels not hung up yet.
    channels: Vec<Channel>,
    /// The first export's mapping (address, length).
    mapping: Option<(u64, u64)>,
    /// Every export accepted.
    held: Vec<ExportRef>,
    /// The write end of the pipe a `holder` child waits on.
    holder: Option<std::os::fd::OwnedFd>,
    /// The descriptors received, with `--keep`.
    kept: Option<Vec<std::os::fd::OwnedFd>>,
    next_tag: u64,
}

impl Importer {
    /// Aims the next requests at `ADDR:LEN[:w]`, in a region the source
    /// published.
    fn aim(&mut self, grant: &str) {
        let g: Vec<&str> = grant.split(':').collect();
        let field = |i: usize| -> u64 { g.get(i).and_then(|x| x.parse().ok()).unwrap_or_else(|| die("a grant")) };
        (self.addr, self.len, self.writable) = (field(0), field(1), g.get(2) == Some(&"w"));
        let region = self.source.regions.iter().find(|r| r.contains(self.addr, self.len));
        self.region_epoch = region.unwrap_or_else(|| die(&format!("no region holds {grant}"))).epoch;
    }

    /// Opens a channel and asks for `n` exports on it; the answer line.
    fn take(&mut self, n: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut ch = Channel::connect(&self.source.ipc_name).unwrap_or_else(|e| die(&e.to_string()));
        let hello = Hello {
            identity: Identity::fresh().unwrap_or_else(|e| die(&e.to_string())),
            expected_source_epoch: self.source.identity.engine_epoch,
            transport: TransportKind::Shm as u32,
            fabric_domain: [0; 16],
        };
        let f = ch.call(MsgKind::IpcHello, &hello.encode(), deadline, "hello").unwrap_or_else(|e| die(&e.to_string()));
        if f.kind != MsgKind::IpcWelcome {
            die(&format!("the hello was answered {:?}", f.kind));
        }
        let ops = if self.writable { OP_READ | OP_WRITE } else { OP_READ };
        let mut held = 0;
        let mut refused = None;
        for _ in 0..n {
            self.next_tag += 1;
            let req = ExportRequest {
                tag: self.next_tag,
                region_epoch: self.region_epoch,
                addr: self.addr,
                len: self.len,
                ops,
                wait_ms: 1000,
            };
            let f = ch.call(MsgKind::ExportRequest, &req.encode(), deadline, "export request");
            let f = f.unwrap_or_else(|e| die(&e.to_string()));
            if f.kind == MsgKind::ExportReject {
                let (_, e) = decode_reject(&f.body).unwrap_or_else(|e| die(&e.to_string()));
                refused = Some(format!("{} {}", e.status(), e.message()));
                break;
            }
            let o = ExportOffer::decode(&f.body).unwrap_or_else(|e| die(&e.to_string()));
            let accept = ExportRef { export_id: o.export_id, token: o.token, value: 1, extra: 0 };
            let h = ch.call(MsgKind::ExportAnswer, &accept.encode(), deadline, "answer");
            let h = h.unwrap_or_else(|e| die(&e.to_string()));
            let fd = h.fd.unwrap_or_else(|| die(&format!("the accept was answered {:?} with no descriptor", h.kind)));
            if self.mapping.is_none() {
                let p = owners::map_shared_memory(&fd, o.physical, self.writable, "the export")
                    .unwrap_or_else(|e| die(&e.to_string()));
                self.mapping = Some((p, o.physical));
            }
            if let Some(k) = &mut self.kept {
                k.push(fd);
            }
            self.held.push(ExportRef { value: 0, ..accept });
            held += 1;
        }
        self.channels.push(ch);
        match refused {
            None => format!("held {held}"),
            Some(why) => format!("held {held} refused {why}"),
        }
    }

    /// Forks a child that holds the mapping, nothing else, until the pipe
    /// it waits on closes; the answer line.
    fn spawn_holder(&mut self) -> String {
        let mut ends = [0; 2];
        // SAFETY: pipe fills two descriptors into a valid array.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return format!("err {}", std::io::Error::last_os_error());
        }
        std::io::stdout().flush().ok();
        // SAFETY: this process runs one thread; the child only closes
        // descriptors, waits on the pipe and leaves with _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let mut b = [0u8; 1];
            // SAFETY: as above; `b` is a valid one-byte buffer.
            unsafe {
                libc::close(ends[1]);
                for ch in &self.channels {
                    libc::close(ch.raw_fd());
                }
                while libc::read(ends[0], b.as_mut_ptr().cast(), 1) < 0 {}
                libc::_exit(0)
            }
        }
        // SAFETY: the read end is the child's; the write end is owned here.
        unsafe { libc::close(ends[0]) };
        // SAFETY: a descriptor just made and owned here alone.
        self.holder = Some(unsafe { std::os::fd::FromRawFd::from_raw_fd(ends[1]) });
        if child < 0 {
            return format!("err {}", std::io::Error::last_os_error());
        }
        format!("holder {child}")
    }

    /// Unmaps this process's mapping and sends every close receipt; the
    /// answer line.
    fn close(&mut self) -> String {
        if let Some((p, len)) = self.mapping.take() {
            // SAFETY: unmapping exactly the mapping made in `take`.
            unsafe { libc::munmap(p as *mut libc::c_void, len as usize) };
        }
        let Some(ch) = self.channels.last_mut() else { return "err no channel".into() };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut acked = 0;
        for r in std::mem::take(&mut self.held) {
            match ch.call(MsgKind::CloseReceipt, &r.encode(), deadline, "close receipt") {
                Ok(f) if f.kind == MsgKind::Ack => acked += 1,
                Ok(f) => return format!("err the receipt was answered {:?}", f.kind),
                Err(e) => return format!("err {e}"),
            }
        }
        format!("closed {acked}")
    }

    /// Answers commands until one ends this thread's part: `Some(self)`
    /// when the main thread is to exit and leave the rest to another.
    fn serve(mut self) -> Option<Importer> {
        loop {
            let mut line = String::new();
            // One line at a time, the stdin lock released in between: the
            // thread that goes on after `main_exits` takes it next.
            if std::io::stdin().read_line(&mut line).unwrap_or(0) == 0 {
                std::process::exit(0);
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| -> u64 { w.get(i).and_then(|x| x.parse().ok()).unwrap_or(0) };
            match w.first().copied().unwrap_or("") {
                "more" => {
                    if let Some(g) = w.get(2) {
                        self.aim(g);
                    }
                    reply(&self.take(num(1)))
                }
                "hangup" => {
                    self.channels.clear();
                    reply("ok");
                }
                "main_exits" => return Some(self),
                "fork" => {
                    std::io::stdout().flush().ok();
                    // SAFETY: this process runs one thread (no engine, no
                    // thread of its own), so the child is a whole copy.
                    let child = unsafe { libc::fork() };
                    if child < 0 {
                        reply(&format!("err {}", std::io::Error::last_os_error()));
                    } else if child > 0 {
                        reply(&format!("forked {child}"));
                        // SAFETY: leaves at once; stdout was flushed.
                        unsafe { libc::_exit(0) };
                    }
                }
                "holder" => reply(&self.spawn_holder()),
                "drop_holder" => {
                    self.holder = None;
                    reply("ok");
                }
                "close" => reply(&self.close()),
                "poke" => match self.mapping {
                    Some((p, len)) if self.writable && num(1) < len => {
                        // SAFETY: a writable shared mapping of `len` bytes
                        // this process keeps; the offset is inside it.
                        unsafe { std::ptr::write_volatile((p + num(1)) as *mut u8, num(2) as u8) };
                        reply("ok");
                    }
                    _ => reply("err no writable mapping there"),
                },
                "exit" => std::process::exit(0),
                other => reply(&format!("unknown command {other:?}")),
            }
        }
    }
}

/// The Describe of the engine at `endpoint` (the control handshake, as a
/// fresh identity of this process).
fn describe(endpoint: &str) -> orbite::Result<Describe> {
    let mine = Describe {
        identity: Identity::fresh()?,
        capabilities: 1,
        fabric_domain: [0; 16],
        endpoint: "127.0.0.1:1".into(),
        ipc_name: String::new(),
        regions: vec![],
    };
    let mut s = std::net::TcpStream::connect(endpoint).map_err(|e| orbite::Error::io("connect", &e))?;
    s.set_read_timeout(Some(io::TICK)).map_err(|e| orbite::Error::io("set a read timeout", &e))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tick = || match Instant::now() < deadline {
        true => Ok(()),
        false => Err(orbite::Error::TimedOut("the handshake".into())),
    };
    io::write_frame(&mut s, MsgKind::Describe, &mine.encode(), &mut tick)?;
    match io::read_header(&mut s, &mut tick)? {
        HeaderRead::Frame(h) if h.kind == MsgKind::Describe => {
            Describe::decode(&io::read_body(&mut s, h.body_len, &mut tick)?)
        }
        _ => Err(orbite::Error::Protocol("the source did not answer with its Describe".into())),
    }
}

/// Runs the importer with the arguments after `--import`.
pub fn main(args: &[String]) -> ! {
    let mut it = args.iter();
    let endpoint = it.next().cloned().unwrap_or_else(|| die("--import ENDPOINT"));
    let (mut grant, mut count, mut keep) = (None, 1u64, false);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| die(&format!("{k} needs a value")));
        match k.as_str() {
            "--grant" => grant = Some(v.clone()),
            "--count" => count = v.parse().unwrap_or_else(|_| die("--count N")),
            "--keep" => keep = v == "1",
            other => die(&format!("unknown argument {other:?}")),
        }
    }
    let grant = grant.unwrap_or_else(|| die("--grant ADDR:LEN[:w]"));
    let mut imp = Importer {
        source: describe(&endpoint).unwrap_or_else(|e| die(&e.to_string())),
        region_epoch: 0,
        addr: 0,
        len: 0,
        writable: false,
        channels: Vec::new(),
        mapping: None,
        held: Vec::new(),
        holder: None,
        kept: keep.then(Vec::new),
        next_tag: 0,
    };
    if keep {
        // As many descriptors as this user may hold.
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit with a valid rlimit for the calls.
        unsafe {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
    imp.aim(&grant);
    reply(&imp.take(count));
    let Some(rest) = imp.serve() else { std::process::exit(0) };
    // The process goes on in another thread; this one, the thread-group
    // leader, exits alone (what `pthread_exit` in `main` does).
    std::thread::spawn(move || rest.serve());
    reply("ok");
    // SAFETY: exit(2) ends the calling thread only; nothing this thread
    // holds (no lock: the stdin and stdout locks are released) is used by
    // the thread that goes on.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    unreachable!("the thread has exited")
}
