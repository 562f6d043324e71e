//! The lifecycle lines operators read: a source logs the exports a lost
//! channel leaves retained and their reclaim once the importer exited; a
//! requester logs its connection to a killed source as lost. One process
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
    set_sink(None).unwrap();
    src.close(Some(LONG)).unwrap();
    a.free().map_err(|(_, e)| e).unwrap();
}
