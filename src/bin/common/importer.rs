//! `orbite-peer --import`: a hostile importer, for the tests of a source's
//! export table (`tests/hostile_exports.rs`) and for measuring a source
//! that holds many exports. It opens the source's SHM channel itself (no
//! engine, no thread of its own), asks for N exports of one range and
//! accepts each, maps the first and keeps that mapping (the others'
//! descriptors are closed at once), and never sends a close receipt.
//!
//! ```text
//! orbite-peer --import IPC_NAME --source-epoch E --grant REGION_EPOCH:ADDR:LEN[:w] [--count N]
//! -> "held H" (H exports held), or "held H refused STATUS MESSAGE" when a
//!    request was refused (no more are asked for on that channel)
//! commands:
//!   more N [REGION_EPOCH:ADDR:LEN[:w]]
//!               asks for N more (of another range when given) on a new
//!               channel of this process -> as above
//!   hangup      closes every channel without a receipt -> "ok"
//!   main_exits  the main thread exits alone; another thread of the process
//!               answers the next commands -> "ok"
//!   fork        forks; the child (holding the mapping) answers the next
//!               commands, the parent exits at once -> "forked PID"
//!   poke OFF B  writes byte B at offset OFF of the mapping (with :w) -> "ok"
//!   exit        exits (no answer)
//! ```

use orbite::control::frame::MsgKind;
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
    name: String,
    source_epoch: u64,
    region_epoch: u64,
    addr: u64,
    len: u64,
    writable: bool,
    /// Channels not hung up yet.
    channels: Vec<Channel>,
    /// The first export's mapping (address, length).
    mapping: Option<(u64, u64)>,
    next_tag: u64,
}

fn die(msg: &str) -> ! {
    eprintln!("orbite-peer --import: {msg}");
    std::process::exit(2)
}

fn reply(line: &str) {
    println!("{line}");
    std::io::stdout().flush().ok();
}

impl Importer {
    /// Aims the next requests at `REGION_EPOCH:ADDR:LEN[:w]`.
    fn aim(&mut self, grant: &str) {
        let g: Vec<&str> = grant.split(':').collect();
        let field = |i: usize| -> u64 { g.get(i).and_then(|x| x.parse().ok()).unwrap_or_else(|| die("a grant")) };
        (self.region_epoch, self.addr, self.len) = (field(0), field(1), field(2));
        self.writable = g.get(3) == Some(&"w");
    }

    /// Opens a channel and asks for `n` exports on it; the answer line.
    fn take(&mut self, n: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut ch = Channel::connect(&self.name).unwrap_or_else(|e| die(&e.to_string()));
        let hello = Hello {
            identity: Identity::fresh().unwrap_or_else(|e| die(&e.to_string())),
            expected_source_epoch: self.source_epoch,
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
            held += 1;
        }
        self.channels.push(ch);
        match refused {
            None => format!("held {held}"),
            Some(why) => format!("held {held} refused {why}"),
        }
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

/// Runs the importer with the arguments after `--import`.
pub fn main(args: &[String]) -> ! {
    let mut it = args.iter();
    let name = it.next().cloned().unwrap_or_else(|| die("--import IPC_NAME"));
    let (mut source_epoch, mut grant, mut count) = (None, None, 1u64);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| die(&format!("{k} needs a value")));
        match k.as_str() {
            "--source-epoch" => source_epoch = v.parse().ok(),
            "--grant" => grant = Some(v.clone()),
            "--count" => count = v.parse().unwrap_or_else(|_| die("--count N")),
            other => die(&format!("unknown argument {other:?}")),
        }
    }
    let source_epoch = source_epoch.unwrap_or_else(|| die("--source-epoch E"));
    let grant = grant.unwrap_or_else(|| die("--grant REGION_EPOCH:ADDR:LEN[:w]"));
    let mut imp = Importer {
        name,
        source_epoch,
        region_epoch: 0,
        addr: 0,
        len: 0,
        writable: false,
        channels: Vec::new(),
        mapping: None,
        next_tag: 0,
    };
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
