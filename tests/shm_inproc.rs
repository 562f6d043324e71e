//! SHM between two engines of one process: the basic protocol.

use orbite::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);
/// The block of the window tests.
const WBLOCK: u64 = 4096;

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
    // By default the import stays cached (one, writable: the READ-only one
    // it replaced was given back), charged once on each side.
    assert_eq!((st.ipc["shm"].imports.cached, st.ipc["shm"].mapping_bytes_charged), (1, 4 << 20));
    let ss = src.stats();
    assert_eq!((ss.ipc["shm"].exports.open, ss.ipc["shm"].mapping_bytes_charged), (1, 4 << 20));
    // A READ now takes the cached writable import: none is opened for it.
    let opened = st.ipc["shm"].imports.opened;
    let read = [Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr() + 7, len: 4096 }];
    req.submit(peer, &read, opts).unwrap().wait(T).unwrap();
    assert!((0..4096).all(|i| local[i] == ((i + 7) % 251) as u8));
    assert_eq!(req.stats().ipc["shm"].imports.opened, opened, "the READ opened an import of its own");
    req.flush_nvlink_cache(Some(T)).unwrap();
    assert_eq!(req.stats().ipc["shm"].mapping_bytes_charged, 0);
    assert_eq!(src.stats().ipc["shm"].exports.open, 0);
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
        assert_eq!(req.stats().ipc["shm"].imports.cached, 1);
        std::thread::scope(|s| {
            let closing = s.spawn(|| src.close(Some(T)));
            req.close(Some(T)).unwrap_or_else(|e| panic!("round {round}: requester close: {e}"));
            closing.join().unwrap().unwrap_or_else(|e| panic!("round {round}: source close: {e}"));
        });
        drop(src);
        a.free().unwrap();
    }
}

/// The grant board: a cached import is used without a round trip while the
/// source's published grant holds; an unregistration revokes it and asks
/// the import back (`Revoke`): reads are refused once the region is
/// closing (then gone), and the unregistration ends OK once the import is
/// given back. The source counts
/// what the board's groups moved when the export ends. (An unregistration
/// that gives up publishes the grant again:
/// `tests/hostile_ipc_imports.rs`, with a frozen importer.) Guards
/// `transport/ipc/requester/mod.rs` `run_group`'s `imp.enter(ops)` and
/// `engine/regions.rs` `unregister_memory`'s suspend.
#[test]
fn cached_grants_skip_the_round_trip_until_the_source_revokes_them() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::from_json(r#"{"shm_cache_entries": 4}"#).unwrap();
    let a = allocate_shared_host(2 << 20).unwrap();
    let rid = src.register_memory(a.addr(), 2 << 20, Access::READ_WRITE).unwrap();
    let local = vec![0u8; 8192];
    req.register_memory(local.as_ptr() as u64, 8192, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts =
        SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(Duration::from_millis(500)) };
    let read = |off: u64| {
        let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr() + off, len: 4096 };
        let b = req.submit(peer, &[r], opts).unwrap();
        let _ = b.wait(T);
        b.results()[0].status
    };
    let trips = || {
        let s = req.stats().ipc["shm"].clone();
        (s.imports.groups_without_round_trip, s.imports.groups_with_round_trips)
    };
    for off in [0, 4096, 8192] {
        assert_eq!(read(off), Status::Ok);
    }
    assert_eq!(trips(), (3, 0), "the grant, then two cached groups, all on the board");
    // While the source unregisters the region, nothing enters the board:
    // reads are refused (the region is closing, or gone once the import
    // was given back), and the unregistration ends by itself.
    std::thread::scope(|s| {
        let u = s.spawn(|| src.unregister_memory(rid, Some(T)));
        let until = std::time::Instant::now() + T;
        let refused = loop {
            let st = read(8192);
            if st != Status::Ok {
                break st;
            }
            assert!(std::time::Instant::now() < until, "the unregistration never revoked the grant");
        };
        assert!(matches!(refused, Status::Unavailable | Status::NotFound), "{refused:?}");
        u.join().unwrap().unwrap();
    });
    // The round-trip groups the source served, the board's the requester
    // claims: together, every request.
    let shm = src.stats().transports["shm"].clone();
    assert_eq!(
        shm.served_requests + shm.claimed_requests,
        req.stats().transports["shm"].requests_completed,
        "the source counted the board's groups as claims"
    );
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
    a.free().unwrap();
}

/// Groups of at least 8 MiB are copied by the copy pool after `submit`
/// returned (the completion follows on the progress worker): sixteen 1 MiB
/// READs at scattered offsets, then sixteen WRITEs back in reverse order,
/// with and without the relocation cache; every byte checked. Guards
/// `transport/ipc/backends/shm.rs` `copy`/`query`/`wait` for started groups and the
/// progress worker's wait for them.
#[test]
fn large_groups_copied_after_submit_returns_move_every_byte() {
    const MIB: u64 = 1 << 20;
    for cfg in ["{}", r#"{"shm_cache_entries": 2}"#] {
        let src = Engine::new(EngineConfig::default()).unwrap();
        let req = Engine::from_json(cfg).unwrap();
        let a = allocate_shared_host(32 * MIB).unwrap();
        // SAFETY: the allocation maps 32 MiB.
        let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, (32 * MIB) as usize) };
        for (i, b) in remote.iter_mut().enumerate() {
            *b = (i % 253) as u8;
        }
        src.register_memory(a.addr(), 32 * MIB, Access::READ_WRITE).unwrap();
        let mut local = vec![0u8; (16 * MIB) as usize];
        req.register_memory(local.as_mut_ptr() as u64, 16 * MIB, Access::NONE).unwrap();
        let peer = req.connect(&src.endpoint(), None).unwrap();
        let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(T) };
        let at = |k: u64| (k * 7 % 16) * 2 * MIB + 13;
        let reads: Vec<Request> = (0..16u64)
            .map(|k| Request {
                op: Op::Read,
                local_addr: local.as_ptr() as u64 + k * MIB,
                remote_addr: a.addr() + at(k),
                len: MIB,
            })
            .collect();
        req.submit(peer, &reads, opts).unwrap().wait(T).unwrap();
        for k in 0..16u64 {
            let chunk = &local[(k * MIB) as usize..((k + 1) * MIB) as usize];
            assert!(chunk.iter().enumerate().all(|(i, b)| *b == ((at(k) as usize + i) % 253) as u8), "{cfg} read {k}");
        }
        for (i, b) in local.iter_mut().enumerate() {
            *b = (i % 241) as u8;
        }
        let writes: Vec<Request> = (0..16u64)
            .rev()
            .map(|k| Request {
                op: Op::Write,
                local_addr: local.as_ptr() as u64 + k * MIB,
                remote_addr: a.addr() + k * 2 * MIB,
                len: MIB,
            })
            .collect();
        req.submit(peer, &writes, opts).unwrap().wait(T).unwrap();
        for k in 0..16u64 {
            let chunk = &remote[(k * 2 * MIB) as usize..(k * 2 * MIB + MIB) as usize];
            assert!(
                chunk.iter().enumerate().all(|(i, b)| *b as usize == ((k * MIB) as usize + i) % 241),
                "{cfg} write {k}"
            );
        }
        assert_eq!(req.stats().transports["shm"].requests_completed, 32);
        req.close(Some(T)).unwrap();
        src.close(Some(T)).unwrap();
        a.free().unwrap();
    }
}

/// A large independent SHM submission moves in windows of 4096 requests
/// (each at least 8 MiB), every window a group of its own: 12 388
/// scattered 4 KiB READs into a wrapped ring of local blocks make three
/// groups, then as many WRITEs to distinct remote blocks three more, every
/// byte checked; a submission as large whose first and last READ land in
/// one local block stays one group, run in order (the last READ's bytes
/// win). Guards `transport/ipc/executor.rs` `IpcExecutor::run`'s windows (and their
/// independence check) and `plan.rs`'s runs.
#[test]
fn a_large_independent_submission_moves_in_windows() {
    const BLOCK: u64 = 4096;
    const N: u64 = 3 * 4096 + 100;
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::from_json(r#"{"shm_cache_entries": 2}"#).unwrap();
    let remote_len = 2 * N * BLOCK;
    let a = allocate_shared_host(remote_len).unwrap();
    // SAFETY: the allocation maps `remote_len` bytes.
    let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, remote_len as usize) };
    // Every block distinct: its index, then a pattern.
    let fill = |b: &mut [u8], seed: u64| {
        for (i, x) in b.iter_mut().enumerate() {
            *x = ((seed * 131 + i as u64) % 251) as u8;
        }
    };
    for k in 0..2 * N {
        fill(&mut remote[(k * BLOCK) as usize..((k + 1) * BLOCK) as usize], k);
    }
    src.register_memory(a.addr(), remote_len, Access::READ_WRITE).unwrap();
    let mut local = vec![0u8; (N * BLOCK) as usize];
    let base = local.as_mut_ptr() as u64;
    req.register_memory(base, N * BLOCK, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(T) };
    let groups = || {
        let s = req.stats().ipc["shm"].clone();
        s.imports.groups_without_round_trip + s.imports.groups_with_round_trips
    };
    // Local block j (in a ring starting a third of the way in) gets
    // remote block (7j mod 2N), scattered.
    let local_of = |k: u64| (k + N / 3) % N;
    let remote_of = |j: u64| j * 7 % (2 * N);
    let reads: Vec<Request> = (0..N)
        .map(|k| Request {
            op: Op::Read,
            local_addr: base + local_of(k) * BLOCK,
            remote_addr: a.addr() + remote_of(local_of(k)) * BLOCK,
            len: BLOCK,
        })
        .collect();
    req.submit(peer, &reads, opts).unwrap().wait(T).unwrap();
    let mut want = vec![0u8; BLOCK as usize];
    for j in 0..N {
        fill(&mut want, remote_of(j));
        assert!(local[(j * BLOCK) as usize..((j + 1) * BLOCK) as usize] == want[..], "read into block {j}");
    }
    assert_eq!(groups(), 3, "three windows of READs");
    // WRITEs: local block j to remote block 2j + 1, in the ring's order.
    for j in 0..N {
        fill(&mut local[(j * BLOCK) as usize..((j + 1) * BLOCK) as usize], 10_000 + j);
    }
    let writes: Vec<Request> = (0..N)
        .map(|k| Request {
            op: Op::Write,
            local_addr: base + local_of(k) * BLOCK,
            remote_addr: a.addr() + (2 * local_of(k) + 1) * BLOCK,
            len: BLOCK,
        })
        .collect();
    req.submit(peer, &writes, opts).unwrap().wait(T).unwrap();
    for j in 0..N {
        fill(&mut want, 10_000 + j);
        let at = ((2 * j + 1) * BLOCK) as usize;
        assert!(remote[at..at + BLOCK as usize] == want[..], "write to remote block {}", 2 * j + 1);
    }
    assert_eq!(groups(), 6, "three windows of WRITEs");
    // The first and the last READ land in local block 0: dependent, one
    // group in input order.
    let mut dependent = reads.clone();
    dependent[0].local_addr = base;
    dependent[N as usize - 1].local_addr = base;
    dependent[0].remote_addr = a.addr();
    // (Even remote blocks kept their pattern: the WRITEs went to odd ones.)
    dependent[N as usize - 1].remote_addr = a.addr() + 2 * BLOCK;
    req.submit(peer, &dependent, opts).unwrap().wait(T).unwrap();
    fill(&mut want, 2);
    assert!(local[..BLOCK as usize] == want[..], "the last READ into block 0 won");
    assert_eq!(groups(), 7, "a dependent submission is one group");
    assert_eq!(req.stats().transports["shm"].requests_completed, 3 * N);
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
    a.free().unwrap();
}

/// 8192 scattered 4 KiB READs, then (with `mixed`) half of them turned
/// into WRITEs to distinct remote blocks, from a `remote_len` allocation,
/// with the requester's config `cfg`. Returns the failed requests, the
/// requests moved to TCP, the groups through cached imports and the
/// imports opened; every request counted once, every OK READ's bytes
/// checked.
fn two_windows(cfg: &str, remote_len: u64, transport: Transport, mixed: bool) -> (usize, u64, u64, u64) {
    const BLOCK: u64 = 4096;
    const N: u64 = 2 * 4096;
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::from_json(cfg).unwrap();
    let a = allocate_shared_host(remote_len).unwrap();
    // SAFETY: the allocation maps `remote_len` >= 2N blocks; only those are touched.
    let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, (2 * N * BLOCK) as usize) };
    for (i, b) in remote.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    src.register_memory(a.addr(), remote_len, Access::READ_WRITE).unwrap();
    let mut local = vec![0u8; (N * BLOCK) as usize];
    let base = local.as_mut_ptr() as u64;
    req.register_memory(base, N * BLOCK, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let reqs: Vec<Request> = (0..N)
        .map(|k| match mixed && k >= N / 2 {
            false => Request {
                op: Op::Read,
                local_addr: base + k * BLOCK,
                remote_addr: a.addr() + (k * 7 % N) * BLOCK,
                len: BLOCK,
            },
            true => Request {
                op: Op::Write,
                local_addr: base + k * BLOCK,
                remote_addr: a.addr() + (N + k) * BLOCK,
                len: BLOCK,
            },
        })
        .collect();
    let b = req.submit(peer, &reqs, SubmitOptions { transport, timeout: Some(T) }).unwrap();
    let _ = b.wait(T);
    let results = b.results();
    for (k, _) in results.iter().enumerate().filter(|(_, r)| r.status == Status::Ok) {
        if reqs[k].op == Op::Read {
            let at = ((k as u64 * 7 % N) * BLOCK) as usize;
            assert!(
                local[k * BLOCK as usize..(k + 1) * BLOCK as usize] == remote[at..at + BLOCK as usize],
                "{cfg} {k}"
            );
        }
    }
    let st = req.stats();
    let (shm, tcp, ipc) = (&st.transports["shm"], &st.transports["tcp"], &st.ipc["shm"]);
    let counted = shm.requests_completed + shm.requests_failed + tcp.requests_completed + tcp.requests_failed;
    assert_eq!(counted, N, "every request counted once: {}", st.to_json());
    let out = (
        results.iter().filter(|r| r.status != Status::Ok).count(),
        shm.requests_fell_through,
        ipc.imports.groups_without_round_trip + ipc.imports.groups_with_round_trips,
        ipc.imports.opened,
    );
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
    drop(local);
    a.free().unwrap();
    out
}

/// Windows share one cached import: without a relocation cache a large
/// group stays whole (one import, not one per window each charged for the
/// whole allocation: with a 600 MiB allocation and the default 1 GiB
/// budget a second window's import would not fit); with one, both windows
/// of READs, and both of a group mixing READs and WRITEs, go through one
/// import, even with a single cache entry. Found by a hostile review of
/// the first windows, which failed or fell through to TCP in each case.
/// Guards `IpcExecutor::run`'s `caches()` condition and `GroupLocal::group_ops`.
#[test]
fn windows_share_one_cached_import() {
    const MIB: u64 = 1 << 20;
    let shm = Transport::Only(TransportKind::Shm);
    let none = r#"{"shm_cache_entries": 0}"#;
    assert_eq!(two_windows(none, 600 * MIB, shm, false), (0, 0, 0, 1), "no cache, forced SHM");
    // Without a cache AUTO takes TCP (every SHM subbatch would map the
    // whole allocation): nothing is imported, nothing falls through.
    assert_eq!(two_windows(none, 600 * MIB, Transport::Auto, false), (0, 0, 0, 0), "no cache, AUTO");
    let cached = r#"{"shm_cache_entries": 2}"#;
    assert_eq!(two_windows(cached, 600 * MIB, shm, false), (0, 0, 2, 1), "READs");
    assert_eq!(two_windows(r#"{"shm_cache_entries": 1}"#, 64 * MIB, shm, true), (0, 0, 2, 1), "mixed, one entry");
    assert_eq!(two_windows(cached, 600 * MIB, shm, true), (0, 0, 2, 1), "mixed, a large allocation");
}

/// WRITE windows with a notification: when the source takes the
/// notification, every window's bytes are in its memory (the outbox waits
/// for every window's completion). From a hostile review of the windows.
#[test]
fn notification_follows_every_window() {
    const N: u64 = 3 * 4096 + 17;
    let cfg = r#"{"shm_cache_entries": 2}"#;
    let src = Engine::from_json("{}").unwrap();
    let req = Engine::from_json(cfg).unwrap();
    let remote_len = 2 * N * WBLOCK;
    let a = allocate_shared_host(remote_len).unwrap();
    // SAFETY: the allocation maps remote_len bytes.
    let remote = unsafe { std::slice::from_raw_parts(a.addr() as *const u8, remote_len as usize) };
    src.register_memory(a.addr(), remote_len, Access::READ_WRITE).unwrap();
    let mut local = vec![0u8; (N * WBLOCK) as usize];
    let base = local.as_mut_ptr() as u64;
    req.register_memory(base, N * WBLOCK, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(T) };
    for round in 0..4u64 {
        for (i, b) in local.iter_mut().enumerate() {
            *b = ((i as u64 / WBLOCK * 31 + round * 7 + i as u64) % 253) as u8;
        }
        // A wrapped ring of remote destinations: 2 runs.
        let writes: Vec<Request> = (0..N)
            .map(|k| {
                let j = (k + N / 2) % N;
                Request {
                    op: Op::Write,
                    local_addr: base + j * WBLOCK,
                    remote_addr: a.addr() + (2 * j + (round & 1)) * WBLOCK,
                    len: WBLOCK,
                }
            })
            .collect();
        let b = req.submit_with_notification(peer, &writes, opts, b"done").unwrap();
        src.take_notification(T).unwrap();
        for j in 0..N {
            let at = ((2 * j + (round & 1)) * WBLOCK) as usize;
            assert!(
                remote[at..at + WBLOCK as usize] == local[(j * WBLOCK) as usize..((j + 1) * WBLOCK) as usize],
                "{cfg} round {round}: block {j} not visible when the notification arrived"
            );
        }
        b.wait(T).unwrap();
    }
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
    drop(local);
    a.free().unwrap();
}

/// Two threads submit large windowed READs at once (sharing the copy
/// pool's bounded queues), then the requester closes while a third
/// submission's windows are in flight: every byte arrives, the local
/// region cannot be unregistered under the copies, and close waits for
/// them. From a hostile review of the windows.
#[test]
fn concurrent_windowed_submissions_and_close() {
    const N: u64 = 3 * 4096;
    let cfg = r#"{"shm_cache_entries": 2}"#;
    let src = Engine::from_json("{}").unwrap();
    let req = Engine::from_json(cfg).unwrap();
    let remote_len = N * WBLOCK;
    let a = allocate_shared_host(remote_len).unwrap();
    // SAFETY: the allocation maps remote_len bytes.
    let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, remote_len as usize) };
    for (i, b) in remote.iter_mut().enumerate() {
        *b = ((i as u64 / WBLOCK * 13 + i as u64) % 251) as u8;
    }
    src.register_memory(a.addr(), remote_len, Access::READ).unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; (N * WBLOCK) as usize]).collect();
    let mut ids = Vec::new();
    for b in &mut bufs {
        ids.push(req.register_memory(b.as_mut_ptr() as u64, N * WBLOCK, Access::NONE).unwrap());
    }
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(T) };
    let reads = |base: u64, m: u64| -> Vec<Request> {
        (0..N)
            .map(|k| Request {
                op: Op::Read,
                local_addr: base + k * WBLOCK,
                remote_addr: a.addr() + (k * m % N) * WBLOCK,
                len: WBLOCK,
            })
            .collect()
    };
    let bases: Vec<u64> = bufs.iter_mut().map(|b| b.as_mut_ptr() as u64).collect();
    for _ in 0..3 {
        std::thread::scope(|s| {
            let h: Vec<_> = [0usize, 1]
                .iter()
                .map(|&t| {
                    let (req, reads) = (&req, &reads);
                    let base = bases[t];
                    s.spawn(move || {
                        let b = req.submit(peer, &reads(base, 7 + 4 * t as u64), opts).unwrap();
                        b.wait(T).unwrap();
                    })
                })
                .collect();
            for x in h {
                x.join().unwrap();
            }
        });
    }
    for (t, m) in [(0usize, 7u64), (1, 11)] {
        for k in 0..N {
            let at = ((k * m % N) * WBLOCK) as usize;
            assert!(bufs[t][(k * WBLOCK) as usize..((k + 1) * WBLOCK) as usize] == remote[at..at + WBLOCK as usize]);
        }
    }
    // Windows in flight while the local region is unregistered (must
    // not succeed before the copies end) and the requester closes.
    let b = req.submit(peer, &reads(bases[2], 5), opts).unwrap();
    let early = req.unregister_memory(ids[2], Some(Duration::from_millis(0)));
    let at_unregister = b.poll();
    assert!(early.is_err() || at_unregister == Status::Ok, "unregistered under copies: {early:?} {at_unregister:?}");
    req.close(Some(T)).unwrap();
    assert_eq!(b.poll(), Status::Ok, "{cfg}: after close, {:?}", b.results().iter().find(|r| r.status != Status::Ok));
    for k in 0..N {
        let at = ((k * 5 % N) * WBLOCK) as usize;
        assert!(bufs[2][(k * WBLOCK) as usize..((k + 1) * WBLOCK) as usize] == remote[at..at + WBLOCK as usize]);
    }
    assert_eq!(req.stats().transports["shm"].requests_completed, 7 * N);
    src.close(Some(T)).unwrap();
    drop(bufs);
    a.free().unwrap();
}

/// The requester closes while another thread is inside a windowed
/// submit (32 768 READs of 2 KiB: eight windows of 8 MiB): when close
/// returns Ok, no import is left open or cached, and the source then
/// closes cleanly; every request is counted once and every OK one has its
/// bytes. Before the submission held the requester side open, close could
/// flush the cache between two windows and the next window opened an
/// import after it (a hostile review saw it 9 rounds in 12; the source's
/// close was then Unquiesced). Guards `IpcExecutor::run`'s `requester_gate` guard.
#[test]
fn close_racing_a_windowed_submit_leaves_nothing_open() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const BLOCK: u64 = 2048;
    const N: u64 = 8 * 4096;
    const M: u64 = 4096;
    for round in 0..8u64 {
        let src = Engine::new(EngineConfig::default()).unwrap();
        let req = Engine::from_json(r#"{"shm_cache_entries": 2}"#).unwrap();
        let a = allocate_shared_host(M * BLOCK).unwrap();
        // SAFETY: the allocation maps M blocks.
        let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, (M * BLOCK) as usize) };
        for (i, b) in remote.iter_mut().enumerate() {
            *b = ((i as u64 / BLOCK * 13 + i as u64) % 251) as u8;
        }
        src.register_memory(a.addr(), M * BLOCK, Access::READ).unwrap();
        let mut local = vec![0u8; (N * BLOCK) as usize];
        let base = local.as_mut_ptr() as u64;
        req.register_memory(base, N * BLOCK, Access::NONE).unwrap();
        let peer = req.connect(&src.endpoint(), None).unwrap();
        let transport = if round % 2 == 0 { Transport::Only(TransportKind::Shm) } else { Transport::Auto };
        let reads: Vec<Request> = (0..N)
            .map(|k| Request {
                op: Op::Read,
                local_addr: base + k * BLOCK,
                remote_addr: a.addr() + (k * 7 % M) * BLOCK,
                len: BLOCK,
            })
            .collect();
        let started = AtomicBool::new(false);
        let (submitted, closed) = std::thread::scope(|s| {
            let h = s.spawn(|| {
                started.store(true, Ordering::SeqCst);
                req.submit(peer, &reads, SubmitOptions { transport, timeout: Some(T) })
            });
            while !started.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            // Into the windows: the first import is open.
            let until = std::time::Instant::now() + T;
            while req.stats().ipc["shm"].imports.opened == 0 && std::time::Instant::now() < until {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_micros(300 * (round % 4)));
            let closed = req.close(Some(T));
            (h.join().unwrap(), closed)
        });
        closed.unwrap();
        let ipc = req.stats().ipc["shm"].clone();
        assert_eq!((ipc.imports.cached, ipc.mapping_bytes_charged), (0, 0), "round {round}: left open");
        assert_eq!(ipc.imports.opened, ipc.imports.closed, "round {round}");
        if let Ok(b) = &submitted {
            let _ = b.wait(T);
            for (k, _) in b.results().iter().enumerate().filter(|(_, r)| r.status == Status::Ok) {
                let at = ((k as u64 * 7 % M) * BLOCK) as usize;
                assert!(local[k * BLOCK as usize..(k + 1) * BLOCK as usize] == remote[at..at + BLOCK as usize]);
            }
        }
        let st = req.stats();
        let (shm, tcp) = (&st.transports["shm"], &st.transports["tcp"]);
        let counted = shm.requests_completed + shm.requests_failed + tcp.requests_completed + tcp.requests_failed;
        assert_eq!(counted, if submitted.is_ok() { N } else { 0 }, "round {round}: every request counted once");
        src.close(Some(T)).unwrap();
        drop(local);
        a.free().unwrap();
    }
}

/// Twenty requester engines READ one source over SHM: their IPC channels,
/// like their control connections, are served by the source's I/O threads
/// (no thread per channel), and every byte arrives.
#[test]
fn ipc_channels_are_served_by_the_io_threads() {
    let src = Engine::from_json(r#"{"io_threads": 2}"#).unwrap();
    let a = allocate_shared_host(1 << 20).unwrap();
    // SAFETY: the allocation maps 1 MiB.
    let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, 1 << 20) };
    remote.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 241) as u8);
    let rid = src.register_memory(a.addr(), 1 << 20, Access::READ).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: None };
    let reqs: Vec<(Engine, u64, Vec<u8>)> = (0..20)
        .map(|_| {
            let e = Engine::from_json(r#"{"shm_cache_entries": 0}"#).unwrap();
            let local = vec![0u8; 65536];
            e.register_memory(local.as_ptr() as u64, local.len() as u64, Access::NONE).unwrap();
            let p = e.connect(&src.endpoint(), None).unwrap();
            (e, p, local)
        })
        .collect();
    for (n, (e, p, local)) in reqs.iter().enumerate() {
        let off = n as u64 * 4096;
        let r = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr() + off, len: 65536 };
        e.submit(*p, &[r], opts).unwrap().wait(T).unwrap();
        assert!((0..65536).all(|i| local[i] == ((i + off as usize) % 241) as u8), "requester {n}");
    }
    // 20 control connections and 20 IPC channels (a control connection
    // joins its I/O thread just after it answered the handshake).
    let t0 = std::time::Instant::now();
    while src.stats().io.connections_per_thread.iter().sum::<usize>() != 40 {
        assert!(t0.elapsed() < T, "{:?}", src.stats().io);
        std::thread::yield_now();
    }
    assert_eq!(src.stats().io.threads, 2);
    for (e, _, _) in reqs {
        e.close(Some(T)).unwrap();
    }
    src.unregister_memory(rid, None).unwrap();
    src.close(Some(T)).unwrap();
    a.free().unwrap();
}

/// `unregister_memory(T)` returns within T even when a cached import's
/// board slot is pinned by a group in flight (its completion held back by
/// the fault switch): the wait for the slot and the wait for the region's
/// leases share one deadline, so the answer is TIMED_OUT after about T,
/// not 2T, and the region stays registered and served. Guards
/// `engine/regions.rs` `unregister_memory`'s `deadline` passed to the
/// region table (a second full timeout doubled it).
#[test]
fn unregister_returns_within_its_timeout_with_a_pinned_board_slot() {
    use std::sync::atomic::Ordering;
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let a = allocate_shared_host(2 << 20).unwrap();
    let rid = src.register_memory(a.addr(), 2 << 20, Access::READ_WRITE).unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(T) };
    let read = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr(), len: 4096 };
    // The first group opens and caches the import; the second runs inside
    // its board slot and stays there, its completion "not ready".
    req.submit(peer, &[read], opts).unwrap().wait(T).unwrap();
    let in_slot = req.stats().ipc["shm"].imports.groups_without_round_trip;
    req.faults().pending_polls.store(u32::MAX, Ordering::SeqCst);
    let pinned = req.submit(peer, &[read], opts).unwrap();
    assert_eq!(pinned.poll(), Status::Pending);
    let st = req.stats().ipc["shm"].clone();
    assert_eq!(st.imports.groups_without_round_trip, in_slot + 1, "the group did not enter the slot: {st:?}");
    const BOUND: Duration = Duration::from_secs(2);
    let t0 = std::time::Instant::now();
    let e = src.unregister_memory(rid, Some(BOUND)).unwrap_err();
    let took = t0.elapsed();
    assert_eq!(e.status(), Status::TimedOut, "{e}");
    // About BOUND; the doubled wait took 2 * BOUND.
    assert!(took < BOUND + BOUND * 3 / 4, "unregister({BOUND:?}) took {took:?}");
    req.faults().pending_polls.store(0, Ordering::SeqCst);
    pinned.wait(T).unwrap();
    assert!(src.regions().iter().any(|r| r.id == rid), "the region was unregistered after all");
    req.submit(peer, &[read], opts).unwrap().wait(T).unwrap();
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
}

/// An independent submission over more remote regions than the relocation
/// cache has entries: its subbatches are posted ahead (each still copying
/// holds its entry), and one refused for want of an idle entry waits for
/// an earlier one of its own to end instead of failing. Eight 8 MiB
/// regions, one cache entry: every request Ok, every byte exact. Guards
/// `transport/ipc/executor.rs` `IpcExecutor::run`'s `in_flight.wait_for_one` (without it the
/// later subbatches fail `RESOURCE_EXHAUSTED`, relocation cache full).
#[test]
fn subbatches_posted_ahead_wait_for_cache_room_they_hold() {
    const REGIONS: u64 = 8;
    const LEN: u64 = 8 << 20;
    let src = Engine::from_json("{}").unwrap();
    let req = Engine::from_json(r#"{"shm_cache_entries": 1}"#).unwrap();
    let a = allocate_shared_host(REGIONS * LEN).unwrap();
    // SAFETY: the allocation maps REGIONS * LEN bytes, 8-byte aligned.
    let words = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u64, (REGIONS * LEN / 8) as usize) };
    for (i, w) in words.iter_mut().enumerate() {
        *w = i as u64;
    }
    for r in 0..REGIONS {
        src.register_memory(a.addr() + r * LEN, LEN, Access::READ).unwrap();
    }
    let local = allocate_shared_host(REGIONS * LEN).unwrap();
    req.register_memory(local.addr(), REGIONS * LEN, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    // Region r lands at local slot REGIONS-1-r: independent requests.
    let reqs: Vec<Request> = (0..REGIONS)
        .map(|r| Request {
            op: Op::Read,
            local_addr: local.addr() + (REGIONS - 1 - r) * LEN,
            remote_addr: a.addr() + r * LEN,
            len: LEN,
        })
        .collect();
    for round in 0..3 {
        let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: None };
        let b = req.submit(peer, &reqs, opts).unwrap();
        let _ = b.wait(T);
        let failed: Vec<String> = (0..reqs.len()).filter_map(|i| b.error(i).map(|e| format!("{i}: {e}"))).collect();
        assert!(failed.is_empty(), "round {round}: {failed:?}");
        // SAFETY: the local allocation maps REGIONS * LEN bytes; the batch ended.
        let got = unsafe { std::slice::from_raw_parts(local.addr() as *const u64, (REGIONS * LEN / 8) as usize) };
        for r in 0..REGIONS {
            let at = ((REGIONS - 1 - r) * LEN / 8) as usize;
            let first = r * LEN / 8;
            assert_eq!((got[at], got[at + (LEN / 8) as usize - 1]), (first, first + LEN / 8 - 1), "region {r}");
        }
    }
    req.close(Some(T)).unwrap();
    src.close(Some(T)).unwrap();
    a.free().unwrap();
    local.free().unwrap();
}

/// Under AUTO, a submission whose requests name a shared-host region and a
/// plain one moves the first over SHM and the second over TCP, each with
/// its bytes; when a request depends on one of the other part (here a WRITE
/// from the block a READ fills), the whole submission stays on TCP, as
/// before the split existed.
#[test]
fn auto_splits_a_mixed_submission_between_shm_and_tcp() {
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let shared = allocate_shared_host(2 << 20).unwrap();
    // SAFETY: the allocation maps 2 MiB.
    let shared_bytes = unsafe { std::slice::from_raw_parts_mut(shared.addr() as *mut u8, 2 << 20) };
    shared_bytes.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
    let mut plain = vec![0u8; 1 << 20];
    plain.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 241) as u8);
    src.register_memory(shared.addr(), 2 << 20, Access::READ_WRITE).unwrap();
    src.register_memory(plain.as_ptr() as u64, plain.len() as u64, Access::READ_WRITE).unwrap();
    let mut local = vec![0u8; 64 << 10];
    req.register_memory(local.as_mut_ptr() as u64, local.len() as u64, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let l = local.as_ptr() as u64;
    let read = |local_addr: u64, remote_addr: u64| Request { op: Op::Read, local_addr, remote_addr, len: 4096 };
    // Shared, plain, shared, plain: independent (distinct local blocks).
    let mixed = [
        read(l, shared.addr() + 5),
        read(l + 4096, plain.as_ptr() as u64 + 7),
        read(l + 8192, shared.addr() + (1 << 20)),
        read(l + 12288, plain.as_ptr() as u64 + 8192),
    ];
    let b = req.submit(peer, &mixed, SubmitOptions::default()).unwrap();
    b.wait(T).unwrap();
    let kinds: Vec<_> = (0..4).map(|i| b.transport(i).unwrap()).collect();
    let (shm, tcp) = (Some(TransportKind::Shm), Some(TransportKind::Tcp));
    assert_eq!(kinds, vec![shm, tcp, shm, tcp], "notes: {:?}", b.notes());
    assert!(b.results().iter().all(|r| r.status == Status::Ok));
    assert!((0..4096).all(|i| local[i] == ((i + 5) % 251) as u8));
    assert!((0..4096).all(|i| local[4096 + i] == ((i + 7) % 241) as u8));
    assert!((0..4096).all(|i| local[8192 + i] == ((i + (1 << 20)) % 251) as u8));
    assert!((0..4096).all(|i| local[12288 + i] == ((i + 8192) % 241) as u8));
    let notes = b.notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].starts_with("2 of 4 requests go over tcp: shm cannot carry their memory"), "{notes:?}");
    let st = req.stats();
    assert_eq!((st.transports["shm"].requests_completed, st.transports["tcp"].requests_completed), (2, 2));

    // A WRITE from the block a READ of the other part fills: dependent.
    let dependent = [
        read(l, shared.addr()),
        Request { op: Op::Write, local_addr: l, remote_addr: plain.as_ptr() as u64 + 65536, len: 4096 },
    ];
    let b = req.submit(peer, &dependent, SubmitOptions::default()).unwrap();
    b.wait(T).unwrap();
    assert_eq!((b.transport(0).unwrap(), b.transport(1).unwrap()), (tcp, tcp), "notes: {:?}", b.notes());
    assert!(b.results().iter().all(|r| r.status == Status::Ok));
    assert!(b.notes().is_empty(), "{:?}", b.notes());
}

/// A source sharing a 1 MiB allocation (byte i holds i % 251) in one
/// region, and a requester (config `req_cfg`) with `local_len` bytes
/// registered, connected to it, submitting over SHM only.
struct OneAllocation {
    src: Engine,
    req: Engine,
    a: Allocation,
    local: Vec<u8>,
    peer: u64,
    opts: SubmitOptions,
}

impl OneAllocation {
    fn new(req_cfg: &str, access: Access, local_len: usize) -> OneAllocation {
        let src = Engine::new(EngineConfig::default()).unwrap();
        let req = Engine::from_json(req_cfg).unwrap();
        let a = allocate_shared_host(1 << 20).unwrap();
        // SAFETY: the allocation maps 1 MiB.
        let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, 1 << 20) };
        for (i, b) in remote.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        src.register_memory(a.addr(), 1 << 20, access).unwrap();
        let mut local = vec![0u8; local_len];
        req.register_memory(local.as_mut_ptr() as u64, local_len as u64, Access::NONE).unwrap();
        let peer = req.connect(&src.endpoint(), None).unwrap();
        let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(T) };
        OneAllocation { src, req, a, local, peer, opts }
    }

    /// A READ of `len` bytes from `remote_off` in the allocation into
    /// `local_off` of the local buffer.
    fn read(&self, local_off: u64, remote_off: u64, len: u64) -> Request {
        Request {
            op: Op::Read,
            local_addr: self.local.as_ptr() as u64 + local_off,
            remote_addr: self.a.addr() + remote_off,
            len,
        }
    }

    fn submit(&self, reqs: &[Request]) -> Batch {
        self.req.submit(self.peer, reqs, self.opts).unwrap()
    }

    /// Ends both engines, then frees the allocation.
    fn close(self) {
        drop(self.src);
        drop(self.req);
        self.a.free().unwrap();
    }
}

/// A request whose remote range starts in a published region and runs
/// past its end fails alone, OUT_OF_RANGE with no remote effect, before
/// anything moves: the cached import maps the region's allocation and no
/// more (the range here runs 5 MiB past it). Its sibling in the same
/// submission moves its bytes, and the import serves the next submission.
/// Guards `in_region` in `submit_inner`: without it the request reaches
/// the import's own check and fails PROTOCOL_ERROR, blaming the peer for
/// the caller's range; without both, the copy left the mapping and the
/// process died of SIGSEGV (checked).
#[test]
fn a_range_past_the_end_of_a_peers_region_fails_alone_out_of_range() {
    let mut p = OneAllocation::new("", Access::READ_WRITE, 8 << 20);
    let first = [p.read(0, 0, 4096)];
    p.submit(&first).wait(T).unwrap();
    let reqs = [p.read(4096, 8192, 4096), p.read(1 << 20, (1 << 20) - 4096, 6 << 20)];
    p.local[1 << 20..].iter_mut().for_each(|b| *b = 0xEE);
    let b = p.submit(&reqs);
    let _ = b.wait(T);
    let r = b.results();
    assert_eq!((r[0].status, r[1].status, r[1].remote_effect), (Status::Ok, Status::OutOfRange, RemoteEffect::None));
    assert!(b.error(1).unwrap().message().contains("crosses the end of region"), "{:?}", b.error(1));
    assert!((0..4096).all(|i| p.local[4096 + i] == ((8192 + i) % 251) as u8));
    assert!(p.local[1 << 20..].iter().all(|&b| b == 0xEE), "nothing moved for the refused request");
    p.submit(&first).wait(T).unwrap();
    assert_eq!(p.req.stats().ipc["shm"].imports.opened, 1);
    p.close();
}

/// A copy that fails (fault `fail_copy`) fails its whole group, each
/// request TRANSFER_FAILED naming the cause: the READs with no remote
/// effect and nothing written locally, the WRITEs' effect on the peer's
/// memory unknown. The import is ended with its receipt (the source holds
/// no export of it after), the failures are counted, and the next
/// submission through a fresh import moves every byte. The copy path's
/// only failure a test can arm at will.
#[test]
fn a_failed_copy_fails_its_group_and_the_next_one_moves() {
    let mut p = OneAllocation::new(r#"{"shm_cache_entries": 0}"#, Access::READ_WRITE, 3 * 4096);
    p.local.iter_mut().for_each(|b| *b = 0xEE);
    let reads = [p.read(0, 0, 4096), p.read(4096, 4096, 4096), p.read(8192, 8192, 4096)];
    p.req.faults().fail_copy.store(1, std::sync::atomic::Ordering::SeqCst);
    let b = p.submit(&reads);
    assert!(b.wait(T).is_err());
    for (i, r) in b.results().iter().enumerate() {
        assert_eq!((r.status, r.remote_effect), (Status::TransferFailed, RemoteEffect::None), "read {i}");
        assert_eq!(b.error(i).unwrap().message(), "injected fault: copy failed", "read {i}");
    }
    assert!(p.local.iter().all(|&b| b == 0xEE), "nothing was read");
    let write = Request { op: Op::Write, ..p.read(0, 65536, 4096) };
    p.req.faults().fail_copy.store(1, std::sync::atomic::Ordering::SeqCst);
    let b = p.submit(&[write]);
    assert!(b.wait(T).is_err());
    let r = b.results()[0];
    assert_eq!((r.status, r.remote_effect), (Status::TransferFailed, RemoteEffect::Unknown), "{:?}", b.error(0));
    let st = p.req.stats();
    assert_eq!(st.transports["shm"].requests_failed, 4);
    let imports = st.ipc["shm"].imports.clone();
    assert_eq!((imports.opened, imports.closed, imports.retained), (2, 2, 0), "{imports:?}");
    assert_eq!(p.src.stats().ipc["shm"].exports.open, 0, "the source took each receipt");
    p.submit(&reads).wait(T).unwrap();
    assert!((0..3 * 4096).all(|i| p.local[i] == (i % 251) as u8));
    p.close();
}

/// A cached import serves later ranges of its region with no offer to
/// check them against. A source whose published region reaches past the
/// allocation it exports (fault `narrow_offer`: the first offer's
/// allocation ends with its grant, so the import maps 4 KiB) gets a later
/// READ of its region refused PROTOCOL_ERROR, never copied from outside
/// the mapping; the range the import maps still moves. Guards
/// `maps_range` in `run_group` (without it the READ copies from past the
/// 4 KiB mapping).
#[test]
fn a_cached_import_never_copies_outside_its_mapping() {
    let mut p = OneAllocation::new("", Access::READ, 8192);
    p.req.faults().narrow_offer.store(1, std::sync::atomic::Ordering::SeqCst);
    let near = [p.read(0, 16, 64)];
    p.submit(&near).wait(T).unwrap();
    assert!((0..64).all(|i| p.local[i] == ((16 + i) % 251) as u8));
    p.local[4096..].iter_mut().for_each(|b| *b = 0xEE);
    let b = p.submit(&[p.read(4096, 512 << 10, 4096)]);
    let _ = b.wait(T);
    let r = b.results()[0];
    assert_eq!((r.status, r.remote_effect), (Status::ProtocolError, RemoteEffect::None), "{:?}", b.error(0));
    assert!(b.error(0).unwrap().message().contains("does not map"), "{:?}", b.error(0));
    assert!(p.local[4096..].iter().all(|&b| b == 0xEE));
    // The mapped range still moves, through the same import.
    p.submit(&near).wait(T).unwrap();
    assert_eq!(p.req.stats().ipc["shm"].imports.opened, 1);
    p.close();
}

/// A region published WRITE-only: the requester's SHM READ of it is
/// refused by the source, PERMISSION_DENIED naming the remote READ the
/// region does not allow, nothing copied and no export left open; an SHM
/// WRITE into the same region is offered and lands. The export request's
/// operation bits become the access asked of the region. Guards
/// `access_of` (src/transport/ipc/messages.rs) `let read = if ops &
/// OP_READ != 0 {` (as `OP_WRITE`, a READ export asked no access and the
/// READ copied the region out; a WRITE export asked READ too and was
/// refused) (round 12 L11).
#[test]
fn an_shm_read_of_a_write_only_region_is_refused_and_a_write_lands() {
    let mut p = OneAllocation::new("", Access::WRITE, 8192);
    let region = p.src.regions()[0];
    assert_eq!(region.access, Access::WRITE);
    p.local.iter_mut().for_each(|b| *b = 0xEE);
    let b = p.submit(&[p.read(0, 64, 4096)]);
    assert_eq!(b.wait(T).unwrap_err().status(), Status::TransferFailed);
    let r = b.results()[0];
    assert_eq!((r.status, r.remote_effect), (Status::PermissionDenied, RemoteEffect::None), "{:?}", b.error(0));
    let why = format!("region {} (0x{:x}+{}) does not allow remote READ", region.id, p.a.addr(), 1 << 20);
    assert!(b.error(0).unwrap().message().ends_with(&why), "{:?}", b.error(0));
    assert!(p.local.iter().all(|&b| b == 0xEE), "the refused READ copied bytes");
    assert_eq!(p.src.stats().ipc["shm"].exports.open, 0);
    let write = Request { op: Op::Write, local_addr: p.local.as_ptr() as u64, remote_addr: p.a.addr() + 64, len: 4096 };
    let b = p.submit(&[write]);
    b.wait(T).unwrap();
    assert_eq!(b.results()[0].remote_effect, RemoteEffect::Applied);
    // SAFETY: the allocation maps 1 MiB; the WRITE above has completed.
    let remote = unsafe { std::slice::from_raw_parts(p.a.addr() as *const u8, 1 << 20) };
    assert!(remote[64..64 + 4096].iter().all(|&b| b == 0xEE), "the WRITE did not land");
    assert_eq!((remote[63], remote[64 + 4096]), (63, ((64 + 4096) % 251) as u8), "the WRITE spilled");
    p.close();
}

/// A receipt whose channel broke as its acknowledgement arrived: the
/// requester closed its mapping but cannot know the source took the
/// receipt, so it keeps the import as owing one. A flush right after,
/// while the link is re-establishing its channel in the background,
/// waits for the channel and sends the receipt again (the source
/// acknowledges a receipt it already took), and succeeds. Guards the
/// `settle_reconnect` in `flush_where`'s close (without it the flush
/// finds the channel still being re-established and fails, the import
/// still owed).
#[test]
fn a_receipt_owed_through_a_lost_channel_is_settled_by_the_next_flush() {
    let p = OneAllocation::new(r#"{"shm_cache_entries": 0}"#, Access::READ, 4096);
    let read = [p.read(0, 0, 4096)];
    p.req.faults().break_at_ack.store(1, std::sync::atomic::Ordering::SeqCst);
    let b = p.submit(&read);
    let _ = b.wait(T);
    // The close receipt's outcome is unknown: the group fails, its import
    // owed.
    assert_eq!(b.results()[0].status, Status::Unavailable, "{:?}", b.error(0));
    let imports = p.req.stats().ipc["shm"].imports.clone();
    assert_eq!((imports.opened, imports.retained, imports.closed), (1, 1, 0), "{imports:?}");
    assert_eq!(p.src.stats().ipc["shm"].exports.open, 0, "the source took the receipt");
    p.req.flush_nvlink_cache(Some(T)).unwrap();
    let imports = p.req.stats().ipc["shm"].imports.clone();
    assert_eq!((imports.retained, imports.closed), (0, 1), "{imports:?}");
    // The link works again.
    p.submit(&read).wait(T).unwrap();
    p.close();
}

/// A handle lost with its channel (the channel breaks as the handle
/// arrives): the requester mapped nothing, the source keeps the export
/// (it cannot know), and the requester's next flush releases it, so the
/// source's close is not held up by a live, honest requester. Guards
/// `open` recording the lost grant, and `release_lost_grant` waiting for
/// the channel to come back (without `settle_reconnect` the flush
/// right after the loss finds it still being re-established).
#[test]
fn a_handle_lost_with_its_channel_is_released_at_the_next_flush() {
    let p = OneAllocation::new(r#"{"shm_cache_entries": 0}"#, Access::READ, 4096);
    p.req.faults().lose_handle.store(1, std::sync::atomic::Ordering::SeqCst);
    let b = p.submit(&[p.read(0, 0, 4096)]);
    let _ = b.wait(T);
    let r = b.results()[0];
    assert_eq!((r.status, r.remote_effect), (Status::Unavailable, RemoteEffect::None), "{:?}", b.error(0));
    let held = |e: &Engine| {
        let s = e.stats();
        s.ipc["shm"].exports.open + s.ipc["shm"].exports.retained
    };
    assert_eq!(held(&p.src), 1, "the source keeps what it granted");
    assert_eq!(p.req.stats().ipc["shm"].imports.retained, 0, "nothing was mapped");
    // The link re-establishes its channel in the background; the flush
    // waits for it (within its deadline), then releases the grant.
    p.req.flush_nvlink_cache(Some(T)).unwrap();
    // The source acknowledges the receipt at once, but a handle that may
    // still sit in the lost channel's buffer keeps the export lingering
    // until the kernel lets go of it: its end is awaited. Without the
    // flush it never comes (the export is kept for the requester).
    let t0 = std::time::Instant::now();
    while held(&p.src) != 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the flush released the lost grant");
        std::thread::yield_now();
    }
    p.src.close_source(Some(Duration::from_millis(200))).unwrap();
    p.close();
}

/// Two regions of one shared allocation read through one peer: each gets
/// its own cached import (their cache keys differ by region), and each
/// maps the whole allocation, which this engine's mapping budget counts
/// once: `mapping_bytes_charged` is the allocation's 2 MiB, not 4. Guards
/// the charge key of `open` (`transport/ipc/requester/mod.rs`: source,
/// engine epoch and the allocation's base): keyed by export, the two
/// imports charge 4 MiB.
#[test]
fn two_imports_of_one_allocation_are_charged_once() {
    const LEN: u64 = 2 << 20;
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let a = allocate_shared_host(LEN).unwrap();
    // SAFETY: the allocation maps LEN bytes, written only here.
    let remote = unsafe { std::slice::from_raw_parts_mut(a.addr() as *mut u8, LEN as usize) };
    remote.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
    src.register_memory(a.addr(), LEN / 2, Access::READ).unwrap();
    src.register_memory(a.addr() + LEN / 2, LEN / 2, Access::READ).unwrap();
    let local = vec![0u8; 8192];
    req.register_memory(local.as_ptr() as u64, 8192, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(T) };
    let read = |local_off: u64, remote_off: u64| Request {
        op: Op::Read,
        local_addr: local.as_ptr() as u64 + local_off,
        remote_addr: a.addr() + remote_off,
        len: 4096,
    };
    req.submit(peer, &[read(0, 100), read(4096, LEN / 2 + 100)], opts).unwrap().wait(T).unwrap();
    assert!((0..4096).all(|i| local[i] == ((100 + i) % 251) as u8));
    assert!((0..4096).all(|i| local[4096 + i] == ((LEN as usize / 2 + 100 + i) % 251) as u8));
    let shm = req.stats().ipc["shm"].clone();
    assert_eq!((shm.imports.opened, shm.imports.cached), (2, 2), "one import per region: {shm:?}");
    assert_eq!(shm.mapping_bytes_charged, LEN, "the allocation charged once: {shm:?}");
    req.flush_nvlink_cache(Some(T)).unwrap();
    assert_eq!(req.stats().ipc["shm"].mapping_bytes_charged, 0, "the charge went with the imports");
    drop((req, src));
    a.free().unwrap();
}

/// A group that ran inside its cached import's board slot and was
/// reported UNQUIESCED at its deadline (its completion held back by the
/// fault switch) leaves the slot when its completion comes late: the
/// source's unregistration of the region then drains the slot and
/// succeeds at once. Guards `settle`'s `imp.leave(0, 0)` for an entered
/// group (`transport/ipc/requester/progress.rs`): without it the slot
/// stays entered for good and the unregistration times out.
#[test]
fn a_late_completion_leaves_its_board_slot_and_an_unregistration_goes_through() {
    use std::sync::atomic::Ordering;
    let src = Engine::new(EngineConfig::default()).unwrap();
    let req = Engine::new(EngineConfig::default()).unwrap();
    let a = allocate_shared_host(2 << 20).unwrap();
    let rid = src.register_memory(a.addr(), 2 << 20, Access::READ_WRITE).unwrap();
    let local = vec![0u8; 4096];
    req.register_memory(local.as_ptr() as u64, 4096, Access::NONE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts = |t| SubmitOptions { transport: Transport::Only(TransportKind::Shm), timeout: Some(t) };
    let read = Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: a.addr(), len: 4096 };
    // The first group opens and caches the import; the second enters its
    // board slot, is reported at its deadline, and completes late.
    req.submit(peer, &[read], opts(T)).unwrap().wait(T).unwrap();
    let in_slot = req.stats().ipc["shm"].imports.groups_without_round_trip;
    req.faults().pending_polls.store(u32::MAX, Ordering::SeqCst);
    let late = req.submit(peer, &[read], opts(Duration::from_millis(500))).unwrap();
    assert!(late.wait(T).is_err());
    assert_eq!(late.results()[0].status, Status::Unquiesced, "{:?}", late.error(0));
    let imports = req.stats().ipc["shm"].imports.clone();
    assert_eq!(imports.groups_without_round_trip, in_slot + 1, "the group did not enter the slot: {imports:?}");
    assert_eq!(imports.late_groups, 1, "{imports:?}");
    req.faults().pending_polls.store(0, Ordering::SeqCst);
    let deadline = std::time::Instant::now() + T;
    while req.stats().ipc["shm"].imports.late_completions == 0 {
        assert!(std::time::Instant::now() < deadline, "the late completion never came");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Well under the 10 s bound: the slot is drained, and the idle cached
    // import is given back at once.
    let t0 = std::time::Instant::now();
    src.unregister_memory(rid, Some(Duration::from_secs(10))).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "the unregistration took {:?}", t0.elapsed());
    let imports = req.stats().ipc["shm"].imports.clone();
    assert_eq!((imports.late_groups, imports.late_completions), (0, 1), "{imports:?}");
    drop((req, src));
    a.free().unwrap();
}

/// A shared allocation whose length, rounded up to 2 MiB, passes
/// `isize::MAX` (no mapping can hold it) is refused INVALID_ARGUMENT
/// "too large" before any memory file is made; so is one whose rounding
/// would overflow. Guards `memory/memfd.rs` `shared_physical`'s
/// `.filter(|p| *p <= isize::MAX as u64)` (round 13 M18): without it the
/// length reaches `ftruncate`'s `off_t` conversion instead.
#[test]
fn a_shared_allocation_rounding_past_isize_max_is_too_large() {
    const ROUNDING: u64 = 2 << 20;
    for len in [isize::MAX as u64, isize::MAX as u64 + 1, u64::MAX - (ROUNDING - 1), u64::MAX] {
        let Err(err) = allocate_shared_host(len) else { panic!("{len} bytes were allocated") };
        assert_eq!(err.status(), Status::InvalidArgument, "{len}: {err}");
        assert_eq!(err.message(), format!("length {len} is too large"), "{len}");
    }
}

/// A registration that starts in a shared allocation's rounding padding
/// (past its 4096 bytes, inside the 2 MiB mapped for it) is refused
/// INVALID_ARGUMENT "crosses the end of the library allocation", at the
/// padding's first byte and deep inside it, and nothing is registered;
/// the allocation's own bytes register as shared host memory. Guards
/// `memory/owners.rs` `kind_of`'s `addr < o.addr + o.physical` (round 15
/// O18: bounded by the logical length instead, such a range was taken for
/// memory the library did not allocate and registered as plain host).
#[test]
fn a_registration_in_a_shared_allocations_padding_is_refused() {
    let e = Engine::new(EngineConfig::default()).unwrap();
    let a = allocate_shared_host(4096).unwrap();
    assert_eq!(a.physical_len(), 2 << 20);
    for off in [4096u64, 1 << 20] {
        let at = a.addr() + off;
        let err = e.register_memory(at, 4096, Access::READ).unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument, "{off}: {err}");
        let said = format!("range 0x{at:x}+4096 crosses the end of the library allocation 0x{:x}+4096", a.addr());
        assert_eq!(err.message(), said, "{off}");
    }
    assert!(e.regions().is_empty(), "{:?}", e.regions());
    let id = e.register_memory(a.addr(), 4096, Access::READ).unwrap();
    let kinds: Vec<_> = e.regions().iter().map(|g| (g.id, g.kind)).collect();
    assert_eq!(kinds, vec![(id, MemoryKind::SharedHost)]);
    e.close(Some(T)).unwrap();
    drop(e);
    a.free().unwrap();
}
