//! The lifecycle lines operators read: a source logs the exports a lost
//! channel leaves retained and their reclaim once the importer exited; a
//! requester logs its connection to a killed source as lost; a source
//! logs each incoming connection and channel accepted and ended. One process
//! per test binary: the log sink is process-wide.

mod common;

use common::*;
use orbite::log::{set_sink, Level};
use orbite::*;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

#[test]
fn exports_retained_and_reclaimed_and_a_lost_connection_are_logged() {
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
