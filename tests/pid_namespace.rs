//! Engines on one host in different PID namespaces (containers on the
//! host's network): the kernel cannot say which process holds an IPC
//! channel across them, so the pair uses TCP, says why once, and neither
//! fails a request nor gives the peer up; a channel held by another
//! process than the one a visible source names is still refused.

mod common;

use common::*;
use orbite::*;

const LEN: u64 = 65536;

fn read_of(local: &[u8], remote: u64) -> [Request; 1] {
    [Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: remote, len: LEN }]
}

fn shm() -> SubmitOptions {
    SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(LONG) }
}

/// The status a submission ended with: refused at once, or its request's.
fn outcome(e: &Engine, p: u64, reqs: &[Request], opts: SubmitOptions) -> (Status, String) {
    match e.submit(p, reqs, opts) {
        Err(err) => (err.status(), err.message().to_string()),
        Ok(b) => {
            let _ = b.wait(LONG);
            match b.error(0) {
                Some(err) => (err.status(), err.message().to_string()),
                None => (Status::Ok, String::new()),
            }
        }
    }
}

fn namespace_notes(e: &Engine) -> usize {
    e.stats().notes.iter().filter(|n| n.contains("another PID namespace")).count()
}

/// A source in a PID namespace of its own (shared memory SHM would carry):
/// the peer's transports are TCP alone from the connect on, an AUTO READ
/// moves over TCP with its bytes, a forced SHM one is refused with the
/// reason and the peer stays; the stats' notes say why, once for any
/// number of such peers. Before, the AUTO READ failed PERMISSION_DENIED
/// ("the IPC channel … is held by process P") and the peer was killed.
/// Guards the `elsewhere` branch of `Inner::ipc_links` (engine/peers.rs).
#[test]
fn a_peer_in_another_pid_namespace_is_reached_over_tcp() {
    let src = PeerProc::spawn_in_pid_namespace(&["--shared", "--size", &LEN.to_string(), "--seed", "9"]);
    let e = Engine::from_json("{}").unwrap();
    let mut local = vec![0u8; LEN as usize];
    e.register_memory(local.as_ptr() as u64, LEN, Access::NONE).unwrap();
    let p = e.connect(&src.endpoint, None).unwrap();
    let (status, why) = outcome(&e, p, &read_of(&local, src.addr), SubmitOptions::default());
    assert_eq!(status, Status::Ok, "{why}");
    assert_eq!(local, pattern_vec(9, LEN as usize));
    assert_eq!(e.peer_transports(p).unwrap(), vec![TransportKind::Tcp]);
    assert_eq!(namespace_notes(&e), 1, "{:?}", e.stats().notes);

    let (status, why) = outcome(&e, p, &read_of(&local, src.addr), shm());
    assert_eq!(status, Status::Unavailable, "{why}");
    assert!(why.contains("another PID namespace"), "{why}");

    // The peer stays, and a second connection adds no second note.
    local.fill(0);
    let q = e.connect(&src.endpoint, None).unwrap();
    assert_eq!(e.peer_transports(q).unwrap(), vec![TransportKind::Tcp]);
    let b = e.submit(p, &read_of(&local, src.addr), SubmitOptions::default()).unwrap();
    b.wait(LONG).unwrap();
    assert_eq!(b.transport(0).unwrap(), Some(TransportKind::Tcp));
    assert_eq!(local, pattern_vec(9, LEN as usize));
    let st = e.stats();
    assert_eq!((st.peers, st.peers_alive), (2, 2));
    assert_eq!(st.transports["tcp"].requests_completed, 2);
    assert_eq!(st.transports["shm"].requests_completed + st.transports["shm"].requests_fell_through, 0);
    assert_eq!(namespace_notes(&e), 1, "{:?}", st.notes);

    // The same source program in this PID namespace is reached over SHM.
    let here = PeerProc::spawn(&["--shared", "--size", &LEN.to_string(), "--seed", "9"]);
    let h = e.connect(&here.endpoint, None).unwrap();
    assert!(e.peer_transports(h).unwrap().contains(&TransportKind::Shm));
    assert_eq!(outcome(&e, h, &read_of(&local, here.addr), shm()).0, Status::Ok);
    e.close(Some(LONG)).unwrap();
    src.close();
    here.close();
}

/// An impostor is still refused: a peer that names a source of this PID
/// namespace (its process is here) while the channel its Describe points
/// to is held by another process (here one in a PID namespace of its
/// own) gets `PERMISSION_DENIED` before a frame is sent, as
/// docs/security.md says, not a quiet move to TCP.
#[test]
fn a_channel_held_by_another_process_than_a_visible_source_is_still_refused() {
    let real = PeerProc::spawn(&["--shared", "--size", &LEN.to_string(), "--seed", "4"]);
    let squatter = PeerProc::spawn_in_pid_namespace(&["--shared", "--size", &LEN.to_string()]);
    let mut d = describe_of(&real.endpoint);
    d.ipc_name = describe_of(&squatter.endpoint).ipc_name;
    let e = Engine::from_json("{}").unwrap();
    let local = vec![0u8; LEN as usize];
    e.register_memory(local.as_ptr() as u64, LEN, Access::NONE).unwrap();
    let p = connect_fake_source_as(&e, &d, |mut s| {
        let _ = std::io::copy(&mut s, &mut std::io::sink());
    });
    assert!(e.peer_transports(p).unwrap().contains(&TransportKind::Shm));
    assert_eq!(namespace_notes(&e), 0);
    let (status, why) = outcome(&e, p, &read_of(&local, real.addr), shm());
    assert_eq!(status, Status::PermissionDenied, "{why}");
    assert!(why.contains("not by the source's process"), "{why}");
    e.close(Some(LONG)).unwrap();
    real.close();
    squatter.close();
}
