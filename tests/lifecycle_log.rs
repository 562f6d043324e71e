//! The lifecycle lines operators read: a source logs the exports a lost
//! channel leaves retained and their reclaim once the importer exited; a
//! requester logs its connection to a killed source as lost; a source
//! logs each incoming connection and channel accepted and ended; a
//! requester warns of its first fall-through to TCP, not of every one. One
//! process per test binary: the log sink is process-wide.

mod common;

use common::*;
use orbite::log::{set_sink, Level};
use orbite::*;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// Held by each test while it has its sink installed: the sink is
/// process-wide and the tests of this binary run on parallel threads.
static SINK: Mutex<()> = parking_lot::const_mutex(());

#[test]
fn exports_retained_and_reclaimed_and_a_lost_connection_are_logged() {
    let _one = SINK.lock();
    let lines: Arc<Mutex<Vec<(Level, String)>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    set_sink(Some(Box::new(move |l, m| sink.lock().push((l, m.to_string()))))).unwrap();

    // A source whose importer dies: retained (WARN) on the lost channel
    // unless the process had already exited, reclaimed (INFO) once it has.
    let src = Engine::from_json(r#"{"log_level": "info"}"#).unwrap();
    let a = allocate_shared_host(2 << 20).unwrap();
    src.register_memory(a.addr(), 2 << 20, Access::READ).unwrap();
    let req = PeerProc::spawn_requester(&src.endpoint(), &format!("{}:4096", a.addr()), r#"{"shm_cache_entries": 1}"#);
    assert_eq!(src.stats().ipc["shm"].exports.open, 1);
    req.kill();
    eventually("the export is reclaimed", || src.stats().ipc["shm"].exports.reclaimed_after_exit == 1);
    eventually("the reclaim is logged", || {
        lines.lock().iter().any(|(l, m)| *l == Level::Info && m.contains("reclaimed: their importing process exited"))
    });
    let logged: Vec<(Level, String)> = lines.lock().clone();
    let ep = src.endpoint();
    assert!(logged.iter().all(|(_, m)| !m.contains("reclaimed") || m.contains(&ep)), "{logged:?}");

    // A requester whose source is killed: its connection is lost (WARN).
    let peer = PeerProc::spawn(&["--size", "65536"]);
    let e = Engine::from_json(r#"{"log_level": "warn"}"#).unwrap();
    let p = e.connect(&peer.endpoint, None).unwrap();
    assert!(e.peer_transports(p).unwrap().contains(&TransportKind::Tcp));
    peer.kill();
    eventually("the lost connection is logged", || {
        lines
            .lock()
            .iter()
            .any(|(l, m)| *l == Level::Warn && m.contains("connection lost") && m.contains(&e.endpoint()))
    });
    // Its own close is not a loss.
    let before = lines.lock().iter().filter(|(_, m)| m.contains("connection lost")).count();
    e.close(Some(LONG)).unwrap();
    assert_eq!(lines.lock().iter().filter(|(_, m)| m.contains("connection lost")).count(), before);
    src.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();

    // A source logs each incoming connection once it is handshaken, and
    // its end, naming the peer: its TCP address, its IPC process.
    let src = Engine::from_json(r#"{"log_level": "info"}"#).unwrap();
    let b = allocate_shared_host(4096).unwrap();
    src.register_memory(b.addr(), 4096, Access::READ).unwrap();
    let ep = src.endpoint();
    let of_src = |what: &str| -> Vec<String> {
        let lines = lines.lock();
        let mine = lines.iter().filter(|(l, m)| *l == Level::Info && m.contains(&ep) && m.contains("incoming "));
        mine.filter(|(_, m)| m.contains(what)).map(|(_, m)| m.clone()).collect()
    };
    let req = Engine::from_json("").unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = req.connect(&ep, Some(LONG)).unwrap();
    let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: b.addr(), len: 4096 };
    let shm = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(LONG) };
    req.submit(peer, &[r], shm).unwrap().wait(LONG).unwrap();
    let tcp = of_src("incoming TCP connection from 127.0.0.1:");
    assert_eq!(tcp.len(), 1, "{tcp:?}");
    assert!(tcp[0].ends_with(" accepted"), "{tcp:?}");
    let ipc = of_src(&format!("incoming IPC channel from process {} accepted", std::process::id()));
    assert_eq!(ipc.len(), 1, "{:?}", of_src(""));
    req.disconnect(peer, Some(LONG)).unwrap();
    req.close(Some(LONG)).unwrap();
    let tcp_end = tcp[0].replace(" accepted", " ended");
    eventually("the connection's end is logged", || of_src(" ended").contains(&tcp_end));
    eventually("the channel's end is logged", || {
        of_src(&format!("incoming IPC channel from process {} ended", std::process::id())).len() == 1
    });
    assert_eq!(of_src(" accepted").len(), 2, "{:?}", of_src(""));
    assert_eq!(of_src(" ended").len(), 2, "{:?}", of_src(""));

    set_sink(None).unwrap();
    src.close(Some(LONG)).unwrap();
    b.free().map_err(|(_, e)| e).unwrap();
}

/// A source that ends the connection with an Error frame whose reason
/// holds a carriage return and a newline, each followed by text made to
/// look like a log line of its own: the requester's WARN for the lost
/// connection is one line, the peer's reason in it with a space for each.
/// Guards `msg.replace(['\n', '\r'], " ")` in `log::emit` (round 10 J4:
/// with only '\n' replaced, the peer's '\r' stayed and on a terminal or
/// in a line-based collector overwrote or forged a line).
#[test]
fn a_peers_error_reason_is_logged_on_one_line() {
    use orbite::control::frame::{FrameHeader, MsgKind};
    use orbite::control::message::encode_error;
    use std::io::Write;
    let _one = SINK.lock();
    let lines: Arc<Mutex<Vec<(Level, String)>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    set_sink(Some(Box::new(move |l, m| sink.lock().push((l, m.to_string()))))).unwrap();
    let src = Engine::from_json("").unwrap();
    let req = Engine::from_json(r#"{"log_level": "warn"}"#).unwrap();
    let forged = "out of room\r2026-01-01T00:00:00.000000Z orbite INFO all is well\nERROR forged";
    connect_fake_source(&req, &src.endpoint(), move |mut c| {
        let body = encode_error(Status::ResourceExhausted, forged);
        let mut f = FrameHeader::encode(MsgKind::Error, body.len() as u32).to_vec();
        f.extend_from_slice(&body);
        c.write_all(&f).unwrap();
        // Held open until the requester shuts it: its end is the Error's.
        let _ = std::io::Read::read(&mut c, &mut [0u8; 1]);
    });
    let lost = || -> Vec<String> {
        let lines = lines.lock();
        let mine = lines.iter().filter(|(l, m)| *l == Level::Warn && m.contains("connection lost"));
        mine.filter(|(_, m)| m.contains("out of room")).map(|(_, m)| m.clone()).collect()
    };
    eventually("the lost connection is logged", || !lost().is_empty());
    let lost = lost();
    assert_eq!(lost.len(), 1, "{lost:?}");
    let said = "out of room 2026-01-01T00:00:00.000000Z orbite INFO all is well ERROR forged";
    assert!(lost[0].ends_with(said), "{lost:?}");
    assert!(!lost[0].contains(['\r', '\n']), "{lost:?}");
    set_sink(None).unwrap();
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
}

/// A source whose 2 MiB shared allocation is more than its mapping budget
/// (`max_inflight_bytes` 1 MiB) refuses every SHM grant of it
/// RESOURCE_EXHAUSTED; a requester reading it three times under AUTO moves
/// each to TCP and logs each move, the first at WARN and the two later
/// ones (same transport, same status) at DEBUG: a steady fall-back does
/// not flood the log. Guards `engine/submit.rs` `fall_through`'s
/// `let level = if first {` (round 11 K12: with every move at WARN, the
/// log had one WARN per submission).
#[test]
fn a_fall_through_to_tcp_is_warned_once_then_logged_at_debug() {
    let _one = SINK.lock();
    let lines: Arc<Mutex<Vec<(Level, String)>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    set_sink(Some(Box::new(move |l, m| sink.lock().push((l, m.to_string()))))).unwrap();
    let src = Engine::from_json(r#"{"max_inflight_bytes": 1048576, "max_transfer_bytes": 1048576}"#).unwrap();
    let a = allocate_shared_host(2 << 20).unwrap();
    src.register_memory(a.addr(), 2 << 20, Access::READ).unwrap();
    let req = Engine::from_json(r#"{"log_level": "debug"}"#).unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), Some(LONG)).unwrap();
    let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr(), len: 4096 };
    for n in 0..3 {
        let b = req.submit(peer, &[r], SubmitOptions { transport: Transport::Auto, timeout: Some(LONG) }).unwrap();
        b.wait(LONG).unwrap();
        assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Tcp), "read {n}");
    }
    assert_eq!(req.stats().transports["shm"].requests_fell_through, 3);
    let ep = req.endpoint();
    let moved: Vec<Level> = lines
        .lock()
        .iter()
        .filter(|(_, m)| m.contains(&ep) && m.contains("1 requests moved from shm to tcp"))
        .map(|(l, _)| *l)
        .collect();
    assert_eq!(moved, [Level::Warn, Level::Debug, Level::Debug], "{:?}", lines.lock());
    set_sink(None).unwrap();
    req.close(Some(LONG)).unwrap();
    src.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();
}
