//! SHM between two engines of one process: the basic protocol.

use orbite::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

#[test]
fn shm_read_write_in_process() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let a = allocate_shared_host(3 << 20).unwrap();
    // SAFETY: the allocation maps 3 MiB.
    let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, 3 << 20) };
    for (i, b) in remote.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let rid = src.register_memory(a.addr(), 3 << 20, Access::READ_WRITE).unwrap();
    let mut local = vec![0u8; 1 << 20];
    req.register_memory(local.as_mut_ptr() as u64, local.len() as u64, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: None };
    let b = req
        .submit(
            peer,
            &[Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr() + 7, len: 1 << 20 }],
            opts,
        )
        .unwrap();
    b.wait(T).unwrap();
    assert!((0..1 << 20).all(|i| local[i] == ((i + 7) % 251) as u8));
    local.iter_mut().for_each(|b| *b = 0xEE);
    let b = req
        .submit(
            peer,
            &[Request {
                op: Op::Write,
                local_addr: local.as_ptr() as u64,
                remote_addr: a.addr() + (2 << 20),
                len: 4096,
            }],
            SubmitOptions::default(),
        )
        .unwrap();
    b.wait(T).unwrap();
    assert_eq!(b.results()[0].remote_effect, RemoteEffect::Applied);
    assert!(remote[2 << 20..(2 << 20) + 4096].iter().all(|b| *b == 0xEE));
    let st = req.stats();
    assert_eq!(st.transports["shm"].requests_completed, 2, "{}", st.to_json());
    assert_eq!(st.transports["tcp"].requests_completed, 0);
    assert_eq!(st.ipc["shm"].mapping_bytes_charged, 0);
    let ss = src.stats();
    assert_eq!(ss.ipc["shm"].exports_open, 0);
    req.close(Some(T)).unwrap();
    src.unregister_memory(rid, None).unwrap();
    src.close(Some(T)).unwrap();
    a.free().unwrap();
}

/// A source closing while its requester flushes a cached import: the source
/// waits for the close receipt and only then tears its channels down, so the
/// receipt's ACK always reaches the requester (the release used to come
/// first, and a close racing it could cut the channel before the ACK).
#[test]
fn source_close_racing_the_requesters_flush_loses_no_ack() {
    let cfg = r#"{"shm_cache_entries": 2}"#;
    for round in 0..40 {
        let src = Engine::from_json("{}").unwrap();
        let req = Engine::from_json(cfg).unwrap();
        let a = allocate_shared_host(4096).unwrap();
        src.register_memory(a.addr(), 4096, Access::READ).unwrap();
        let local = vec![0u8; 4096];
        req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
        let peer = req.connect(&src.endpoint(), None).unwrap();
        let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr(), len: 4096 };
        let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: None };
        req.submit(peer, &[r], opts).unwrap().wait(T).unwrap();
        assert_eq!(req.stats().ipc["shm"].imports_cached, 1);
        std::thread::scope(|s| {
            let closing = s.spawn(|| src.close(Some(T)));
            req.close(Some(T)).unwrap_or_else(|e| panic!("round {round}: requester close: {e}"));
            closing.join().unwrap().unwrap_or_else(|e| panic!("round {round}: source close: {e}"));
        });
        drop(src);
        a.free().unwrap();
    }
}
