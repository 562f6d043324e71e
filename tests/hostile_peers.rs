//! Hostile peers against the control port and the IPC channel: slow-loris,
//! connection floods, receipts for grants that never existed, lying
//! identities. Each is cut off (or refused) with a typed answer within a
//! bounded time while a well-behaved peer keeps being served, and threads and
//! memory stay within a stated bound.

use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::message::{self, DataRequest, Describe};
use orbite::control::{io, Identity};
use orbite::transport::ipc::channel::{deadline_tick, Channel};
use orbite::transport::ipc::messages::{decode_reject, ExportRef, Hello, Revalidate};
use orbite::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

fn proc_status(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn describe_bytes() -> Vec<u8> {
    let d = Describe {
        identity: Identity::fresh(),
        capabilities: 1,
        fabric_domain: [0; 16],
        endpoint: "127.0.0.1:1".into(),
        ipc_name: String::new(),
        regions: vec![],
    };
    let body = d.encode();
    let mut v = FrameHeader::encode(MsgKind::Describe, body.len() as u32).to_vec();
    v.extend(body);
    v
}

/// Reads until EOF (or 60 s); returns the Error frame's text if one came.
fn error_text(s: &mut TcpStream) -> Option<String> {
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    // Skip a Describe reply if the handshake happened.
    let mut at = 0;
    while all.len() >= at + FRAME_HEADER_LEN {
        let h = FrameHeader::decode(all[at..at + FRAME_HEADER_LEN].try_into().unwrap()).ok()?;
        let body = &all[at + FRAME_HEADER_LEN..(at + FRAME_HEADER_LEN + h.body_len as usize).min(all.len())];
        if h.kind == MsgKind::Error {
            return message::decode_error(body).ok().map(|(_, t)| t);
        }
        at += FRAME_HEADER_LEN + h.body_len as usize;
    }
    None
}

struct Good {
    src: Engine,
    req: Engine,
    peer: u64,
    remote: Vec<u8>,
    local: Vec<u8>,
}

impl Good {
    fn new(cfg: &str) -> Good {
        let src = Engine::from_json(cfg).unwrap();
        let req = Engine::from_json("").unwrap();
        let mut remote = vec![7u8; 65536];
        let mut local = vec![0u8; 65536];
        src.register_memory(remote.as_mut_ptr() as u64, 65536, Access::READ).unwrap();
        req.register_memory(local.as_mut_ptr() as u64, 65536, Access::NONE).unwrap();
        let peer = req.connect(&src.endpoint(), None).unwrap();
        Good { src, req, peer, remote, local }
    }

    fn transfer(&mut self) {
        self.local.iter_mut().for_each(|b| *b = 0);
        let r = Request {
            op: Op::Read,
            local_addr: self.local.as_ptr() as u64,
            remote_addr: self.remote.as_ptr() as u64,
            len: 65536,
        };
        let b = self.req.submit(self.peer, &[r], SubmitOptions::default()).unwrap();
        b.wait(LONG).unwrap();
        assert!(self.local.iter().all(|b| *b == 7));
    }
}

#[test]
fn slow_loris_is_cut_off_during_and_after_the_handshake() {
    let mut g = Good::new(r#"{"handshake_timeout_ms": 1000}"#);
    let ep = g.src.endpoint();
    let trickle = |bytes: Vec<u8>, prefix: Vec<u8>| {
        let mut s = TcpStream::connect(&ep).unwrap();
        s.write_all(&prefix).unwrap();
        let t0 = Instant::now();
        for b in bytes {
            // One byte every 100 ms: the attack itself, not synchronisation.
            if s.write_all(&[b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (error_text(&mut s), t0.elapsed())
    };
    std::thread::scope(|sc| {
        let during = sc.spawn(|| trickle(describe_bytes(), vec![]));
        let mut req = FrameHeader::encode(MsgKind::ReadRequest, 32).to_vec();
        req.extend_from_slice(&DataRequest { tag: 1, region_epoch: 1, addr: 1, len: 1 }.encode());
        let after = sc.spawn(|| trickle(req, describe_bytes()));
        // The well-behaved peer is served meanwhile.
        for _ in 0..20 {
            g.transfer();
        }
        let (text, took) = during.join().unwrap();
        assert!(text.as_deref().unwrap_or("").contains("handshake timeout"), "{text:?}");
        assert!(took < Duration::from_secs(30), "{took:?}");
        let (text, took) = after.join().unwrap();
        assert!(text.as_deref().unwrap_or("").contains("too slow"), "{text:?}");
        assert!(took < Duration::from_secs(30), "{took:?}");
    });
    g.transfer();
    assert!(g.src.stats().protocol_errors >= 2);
}

#[test]
fn a_connection_flood_is_refused_at_the_limit_with_bounded_threads_and_memory() {
    let mut g = Good::new(r#"{"max_incoming_connections": 16, "handshake_timeout_ms": 1000}"#);
    g.transfer();
    let threads0 = proc_status("Threads:");
    let rss0 = proc_status("VmRSS:");
    let ep = g.src.endpoint();
    let mut flood: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(&ep).unwrap()).collect();
    // The existing peer keeps working during the flood.
    for _ in 0..10 {
        g.transfer();
    }
    let threads = proc_status("Threads:");
    // One serving thread per admitted connection, at most the limit.
    assert!(threads <= threads0 + 16 + 2, "threads {threads0} -> {threads}");
    let refused: Vec<String> = flood.iter_mut().filter_map(error_text).collect();
    assert!(refused.iter().filter(|t| t.contains("connection limit")).count() >= 200 - 16, "{}", refused.len());
    assert!(refused.iter().all(|t| t.contains("connection limit") || t.contains("handshake timeout")));
    drop(flood);
    // Every flood connection ends (refused, or timed out in its handshake).
    let t0 = Instant::now();
    while g.src.stats().incoming_connections > 1 {
        assert!(t0.elapsed() < LONG, "flood connections linger: {}", g.src.stats().incoming_connections);
        std::thread::sleep(Duration::from_millis(20));
    }
    g.transfer();
    assert!(g.src.stats().connections_refused >= 184);
    let rss = proc_status("VmRSS:");
    assert!(rss < rss0 + 64 * 1024, "RSS grew from {rss0} kB to {rss} kB");
}

#[test]
fn ipc_receipts_for_grants_that_never_existed_are_refused() {
    let g = Good::new("");
    // Learn the source's IPC channel name from its Describe.
    let mut s = TcpStream::connect(g.src.endpoint()).unwrap();
    s.write_all(&describe_bytes()).unwrap();
    s.set_read_timeout(Some(io::TICK)).unwrap();
    let h = match io::read_header(&mut s, &mut || Ok(())).unwrap() {
        io::HeaderRead::Frame(h) => h,
        io::HeaderRead::Eof => panic!("no describe"),
    };
    let d = Describe::decode(&io::read_body(&mut s, h.body_len, &mut || Ok(())).unwrap()).unwrap();
    let deadline = || Instant::now() + LONG;

    // A Hello that lies about its pid is refused as stale.
    let mut liar = Channel::connect(&d.ipc_name).unwrap();
    let mut me = Identity::fresh();
    me.process.pid = 1;
    let hello = Hello { identity: me, expected_source_epoch: d.identity.engine_epoch, transport: 1 };
    let f = liar.call(MsgKind::IpcHello, &hello.encode(), deadline(), "hello").unwrap();
    assert_eq!(f.kind, MsgKind::ExportReject);
    assert_eq!(decode_reject(&f.body).unwrap().1.status(), Status::StalePeer);

    // An honest Hello is welcome; receipts for unknown exports are refused
    // with NOT_FOUND and the channel stays usable.
    let mut ch = Channel::connect(&d.ipc_name).unwrap();
    let hello = Hello { identity: Identity::fresh(), expected_source_epoch: d.identity.engine_epoch, transport: 1 };
    assert_eq!(ch.call(MsgKind::IpcHello, &hello.encode(), deadline(), "hello").unwrap().kind, MsgKind::IpcWelcome);
    let bogus = ExportRef { export_id: 12345, token: 999, value: 0, extra: 0 };
    for kind in [MsgKind::CloseReceipt, MsgKind::OpComplete, MsgKind::ExportAnswer] {
        let v = ExportRef { value: 1, ..bogus };
        let f = ch.call(kind, &v.encode(), deadline(), "receipt").unwrap();
        assert_eq!(f.kind, MsgKind::ExportReject, "{kind:?}");
        assert_eq!(decode_reject(&f.body).unwrap().1.status(), Status::NotFound, "{kind:?}");
    }
    let rv = Revalidate { tag: 5, export_id: 12345, token: 999, region_epoch: 1, addr: 4096, len: 8, ops: 1 };
    let f = ch.call(MsgKind::Revalidate, &rv.encode(), deadline(), "revalidate").unwrap();
    assert_eq!(decode_reject(&f.body).unwrap().1.status(), Status::NotFound);
    // A malformed frame is a protocol error: refused, then the channel closes.
    let f = ch.call(MsgKind::ExportRequest, b"garbage", deadline(), "garbage").unwrap();
    assert_eq!(decode_reject(&f.body).unwrap().1.status(), Status::ProtocolError);
    let mut tick = || deadline_tick(deadline(), "eof");
    assert!(ch.recv(&mut tick).is_err(), "the channel must be closed");
    assert_eq!(g.src.stats().ipc["shm"].exports_open, 0);
}
