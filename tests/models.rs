//! Concurrency models (shuttle) of the CUDA stream pool's slot states, built
//! with `--features model-check` so that the pool runs on shuttle's
//! primitives. Shuttle explores thread interleavings at random (and with
//! PCT); time does not pass in a model, so a lost wakeup is reported as a
//! deadlock.
#![cfg(feature = "model-check")]

use orbite::cuda::stream_pool::{StreamFactory, StreamPool};
use orbite::{Error, Result};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Hands out unique handles; counts destroys of quarantine-free slots.
#[derive(Default)]
struct Factory {
    next: AtomicU64,
    live: shuttle::sync::Mutex<HashSet<u64>>,
}

impl StreamFactory for Factory {
    type Handle = u64;
    fn create(&self, ctx: u64) -> Result<u64> {
        let h = ctx * 1_000_000 + self.next.fetch_add(1, Ordering::SeqCst);
        assert!(self.live.lock().unwrap().insert(h), "handle created twice");
        Ok(h)
    }
    fn destroy(&self, _ctx: u64, h: u64) -> Result<()> {
        assert!(self.live.lock().unwrap().remove(&h), "destroyed a handle that is not live");
        Ok(())
    }
}

/// Three threads on two contexts lease and release from a pool of two
/// slots; some releases are uncertain (quarantine). Checks, in every
/// explored interleaving: no slot is lent to two holders at once, a lease
/// always matches its context, the bound holds, and nothing deadlocks.
fn pool_model() {
    let pool = StreamPool::new(Factory::default(), 2);
    let lent = std::sync::Arc::new(shuttle::sync::Mutex::new(HashSet::new()));
    let far = || Instant::now() + Duration::from_secs(3600);
    let hs: Vec<_> = (0..3u64)
        .map(|t| {
            let (pool, lent) = (pool.clone(), lent.clone());
            shuttle::thread::spawn(move || {
                for i in 0..2u64 {
                    let ctx = 1 + (t + i) % 2;
                    match pool.lease(ctx, far()) {
                        Ok(l) => {
                            assert_eq!(l.ctx, ctx);
                            let h = l.handle.expect("a leased pair");
                            assert!(lent.lock().unwrap().insert(h), "slot lent twice");
                            assert!(pool.counts().stream_slots <= 2, "bound exceeded");
                            shuttle::thread::yield_now();
                            lent.lock().unwrap().remove(&h);
                            pool.release(l, !(t == 2 && i == 1));
                        }
                        Err(Error::ResourceExhausted(_)) => {}
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let c = pool.counts();
    assert_eq!(c.active_streams, 0);
    assert!(c.stream_slots <= 2 && c.retained_streams <= 1, "{c:?}");
}

#[test]
fn stream_pool_random_interleavings() {
    shuttle::check_random(pool_model, 3000);
}

#[test]
fn stream_pool_pct_interleavings() {
    shuttle::check_pct(pool_model, 1000, 3);
}
