//! Sources that die under the same-host CMA path: killed (SIGKILL) while
//! this process READs and WRITEs their heap memory with cross-memory
//! attach, large copies split over the copy pool. Every request ends with
//! the source's exact bytes or a typed failure, none after the death
//! succeeds, this process never crashes or hangs, and its engine closes
//! promptly.

mod common;

use common::*;
use orbite::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Large enough to be split over the copy pool.
const LEN: u64 = 16 * MIB;

fn opts() -> SubmitOptions {
    SubmitOptions { transport: Transport::Only(TransportKind::Cma), timeout: Some(LONG) }
}

/// One outcome: whether the request began after the source was reaped,
/// its status and remote effect, and (READs) whether its bytes were the
/// source's exactly.
type Seen = (bool, Status, RemoteEffect, bool);

/// Guards the CMA copy's outcome when its source dies mid-copy
/// (`cma/vm.rs` `failure`: ESRCH is UNAVAILABLE "exited", a copy the
/// death cut short IO_ERROR, never an OK with wrong bytes): while a
/// thread READs and WRITEs the source's 16 MiB over CMA in a loop, the
/// source is killed with SIGKILL and reaped. Each READ ends OK with the
/// exact bytes or fails UNAVAILABLE / IO_ERROR with effect NONE; each
/// failed WRITE says UNKNOWN; every request begun after the reap fails;
/// the engine closes promptly afterwards.
#[test]
fn a_source_killed_mid_copy_fails_its_requests_exactly() {
    let src = PeerProc::spawn(&["--size", &LEN.to_string(), "--seed", "11"]);
    let e = Engine::from_json("").unwrap();
    let mut l = vec![0u8; 2 * LEN as usize];
    e.register_memory(l.as_mut_ptr() as u64, l.len() as u64, Access::NONE).unwrap();
    let (lr, lw) = (l.as_ptr() as u64, l.as_ptr() as u64 + LEN);
    let p = e.connect(&src.endpoint, None).unwrap();
    let addr = src.addr;
    let read = Request { op: Op::Read, local_addr: lr, remote_addr: addr, len: LEN };
    let b = e.submit(p, &[read], opts()).unwrap();
    b.wait(LONG).unwrap();
    assert!((0..LEN).all(|i| l[i as usize] == pattern(11, i)), "the first READ's bytes");
    // The WRITEs put back the source's own bytes, so a READ that ends OK
    // must see them exactly whichever WRITE landed before it.
    l.copy_within(..LEN as usize, LEN as usize);
    let (killed, after, rounds) = (AtomicBool::new(false), AtomicUsize::new(0), AtomicUsize::new(0));
    let l = &l;
    let seen: Vec<Seen> = std::thread::scope(|s| {
        let t = s.spawn(|| {
            let mut seen = Vec::new();
            // Until three rounds begun after the reap have ended.
            while after.load(SeqCst) < 3 {
                let late = killed.load(SeqCst);
                let write = Request { op: Op::Write, local_addr: lw, remote_addr: addr, len: LEN };
                let b = e.submit(p, &[read, write], opts());
                // A submission refused at once (the peer is gone) is a
                // failure too, with nothing moved.
                let r = match b {
                    Ok(b) => {
                        let _ = b.wait(LONG);
                        assert_ne!(b.poll(), Status::Pending);
                        b.results()
                    }
                    Err(err) => vec![RequestResult { status: err.status(), remote_effect: RemoteEffect::None }; 2],
                };
                let exact = r[0].status == Status::Ok && (0..LEN).all(|i| l[i as usize] == pattern(11, i));
                seen.push((late, r[0].status, r[0].remote_effect, exact));
                seen.push((late, r[1].status, r[1].remote_effect, true));
                rounds.fetch_add(1, SeqCst);
                after.fetch_add(late as usize, SeqCst);
            }
            seen
        });
        // The loop is copying: its first round ended.
        eventually("a first round of copies", || rounds.load(SeqCst) > 0);
        src.kill();
        killed.store(true, SeqCst);
        t.join().unwrap()
    });
    for (i, &(late, st, effect, exact)) in seen.iter().enumerate() {
        let is_read = i % 2 == 0;
        match st {
            Status::Ok => {
                assert!(!late, "request {i} begun after the reap succeeded: {seen:?}");
                assert!(exact, "READ {i} ended OK with wrong bytes");
            }
            // STALE_PEER: the link found the source's IPC channel gone (its
            // process died) before the TCP connection's end was seen.
            Status::Unavailable | Status::IoError | Status::NotFound | Status::StalePeer => {
                let want = if is_read { RemoteEffect::None } else { RemoteEffect::Unknown };
                // A request refused before it started moved nothing.
                assert!(effect == want || effect == RemoteEffect::None, "request {i}: {st:?} {effect:?}");
            }
            other => panic!("request {i} ended {other:?}: {seen:?}"),
        }
    }
    assert!(seen.iter().any(|s| s.0), "no request began after the reap");
    let t = Instant::now();
    e.close(Some(LONG)).unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "close took {:?}", t.elapsed());
}
