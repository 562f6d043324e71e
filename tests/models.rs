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

mod cache_model {
    use orbite::transport::ipc::cache::RelocationCache;
    use orbite::{Error, Status};
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A cached import as the model observes it.
    struct Val {
        users: AtomicU32,
        native_closed: AtomicBool,
        receipt_done: AtomicBool,
    }

    struct World {
        cache: RelocationCache<u8, Val>,
        opened: AtomicU64,
        lose_next_ack: AtomicBool,
    }

    impl World {
        fn close(&self, v: &Val, already_native_closed: bool) -> std::result::Result<(), (Error, bool)> {
            assert_eq!(v.users.load(Ordering::SeqCst), 0, "closed while in use");
            if already_native_closed {
                assert!(v.native_closed.load(Ordering::SeqCst), "receipt-only retry without a native close");
            } else {
                assert!(!v.native_closed.swap(true, Ordering::SeqCst), "native close repeated");
            }
            if self.lose_next_ack.swap(false, Ordering::SeqCst) {
                return Err((Error::Unavailable("lost ACK".into()), true));
            }
            assert!(!v.receipt_done.swap(true, Ordering::SeqCst), "receipt acknowledged twice");
            Ok(())
        }

        fn use_key(&self, k: u8) {
            let far = Instant::now() + Duration::from_secs(3600);
            let close = |v: &Val, nc: bool| self.close(v, nc);
            let open = || {
                self.opened.fetch_add(1, Ordering::SeqCst);
                Ok(Val {
                    users: AtomicU32::new(0),
                    native_closed: AtomicBool::new(false),
                    receipt_done: AtomicBool::new(false),
                })
            };
            match self.cache.acquire(&k, far, &|| "model".into(), open, &close, &|_| true) {
                Ok((v, _)) => {
                    assert!(!v.native_closed.load(Ordering::SeqCst), "handed out a closed import");
                    v.users.fetch_add(1, Ordering::SeqCst);
                    assert!(self.cache.live_entries() <= 2, "capacity exceeded");
                    shuttle::thread::yield_now();
                    v.users.fetch_sub(1, Ordering::SeqCst);
                    self.cache.release(&k);
                }
                // Full with nothing idle, or a retained entry for this key.
                Err(e) => assert!(matches!(e.status(), Status::ResourceExhausted | Status::Unavailable), "{e}"),
            }
        }
    }

    pub fn model() {
        let w = Arc::new(World {
            cache: RelocationCache::new(2),
            opened: AtomicU64::new(0),
            lose_next_ack: AtomicBool::new(true),
        });
        let users: Vec<_> = [[0u8, 1, 2, 0], [2u8, 1, 0, 2]]
            .into_iter()
            .map(|keys| {
                let w = w.clone();
                shuttle::thread::spawn(move || {
                    for k in keys {
                        w.use_key(k);
                    }
                })
            })
            .collect();
        let flusher = {
            let w = w.clone();
            shuttle::thread::spawn(move || {
                let far = Instant::now() + Duration::from_secs(3600);
                let close = |v: &Val, nc: bool| w.close(v, nc);
                w.cache.flush(far, &close);
            })
        };
        for h in users {
            h.join().unwrap();
        }
        flusher.join().unwrap();
        // A final flush retries owed receipts and empties the cache.
        let far = Instant::now() + Duration::from_secs(3600);
        let close = |v: &Val, nc: bool| w.close(v, nc);
        assert!(w.cache.flush(far, &close).is_empty());
        assert!(w.cache.entries().is_empty());
        assert!(w.opened.load(Ordering::SeqCst) >= 2);
    }
}

#[test]
fn relocation_cache_random_interleavings() {
    shuttle::check_random(cache_model::model, 3000);
}

#[test]
fn relocation_cache_pct_interleavings() {
    shuttle::check_pct(cache_model::model, 1000, 3);
}

/// The grant board (`transport/ipc/board.rs`): two requester threads copy
/// through a cached import whenever they can enter its slot; the source
/// revokes the slot and, once its revocation returns, reuses the memory.
/// In every explored interleaving no copy touches the memory after the
/// revocation returned, a revoked slot lets nobody in, and the source's
/// wait ends (shuttle's atomics are scheduling points: every order of the
/// words' reads and writes is tried).
mod board_model {
    use orbite::transport::ipc::board::{self, Words};
    use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;

    #[derive(Default)]
    struct Slot {
        generation: AtomicU64,
        ops: AtomicU32,
        in_flight: AtomicU32,
    }

    impl Words for Slot {
        fn generation(&self) -> u64 {
            self.generation.load(SeqCst)
        }
        fn set_generation(&self, g: u64) {
            self.generation.store(g, SeqCst)
        }
        fn ops(&self) -> u32 {
            self.ops.load(SeqCst)
        }
        fn set_ops(&self, ops: u32) {
            self.ops.store(ops, SeqCst)
        }
        fn in_flight(&self) -> u32 {
            self.in_flight.load(SeqCst)
        }
        fn add_in_flight(&self, d: i32) {
            if d >= 0 {
                self.in_flight.fetch_add(d as u32, SeqCst);
            } else {
                self.in_flight.fetch_sub(d.unsigned_abs(), SeqCst);
            }
        }
    }

    pub fn model() {
        const READ: u32 = 1;
        let slot = Arc::new(Slot::default());
        board::publish(&*slot, 7, READ);
        let reused = Arc::new(AtomicBool::new(false));
        let requesters: Vec<_> = (0..2)
            .map(|_| {
                let (slot, reused) = (slot.clone(), reused.clone());
                shuttle::thread::spawn(move || {
                    for _ in 0..2 {
                        if board::enter(&*slot, 7, READ) {
                            // The copy: the memory must still be the export's.
                            assert!(!reused.load(SeqCst), "copied from memory the source reused");
                            shuttle::thread::yield_now();
                            assert!(!reused.load(SeqCst), "copied from memory the source reused");
                            board::leave(&*slot);
                        }
                    }
                })
            })
            .collect();
        let source = {
            let (slot, reused) = (slot.clone(), reused.clone());
            shuttle::thread::spawn(move || {
                let drained = board::revoke(&*slot, 8, || {
                    shuttle::thread::yield_now();
                    true
                });
                assert!(drained);
                reused.store(true, SeqCst);
                assert!(!board::enter(&*slot, 7, READ) && !board::enter(&*slot, 8, READ), "a revoked slot let one in");
            })
        };
        for h in requesters {
            h.join().unwrap();
        }
        source.join().unwrap();
        assert_eq!(slot.in_flight(), 0);
    }
}

#[test]
fn grant_board_random_interleavings() {
    shuttle::check_random(board_model::model, 5000);
}

#[test]
fn grant_board_pct_interleavings() {
    shuttle::check_pct(board_model::model, 2000, 3);
}

/// Closing the requester side while submissions post their subbatches:
/// the engine's `SubbatchAdmission` (`sync/admission.rs`) over the
/// requester gate, and the relocation cache each subbatch takes its import
/// from. One submission posts three windows of one group, another a
/// single subbatch; a third thread is `close_requester`: it closes the
/// gate, waits for the work inside, flushes the cache. In every explored
/// interleaving the close leaves the cache empty: no subbatch opens (and
/// caches) an import after the flush. Two past races, switched back on
/// (`AdmissionMutations`), must be found: no hold between windows (a later
/// window then ran after the flush), and a single subbatch run with no
/// entry once the gate closed behind the submission's check.
mod close_model {
    use orbite::sync::admission::{AdmissionMutations, Gate, SubbatchAdmission};
    use orbite::transport::ipc::cache::RelocationCache;
    use orbite::Error;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    struct World {
        gate: Arc<Gate>,
        cache: RelocationCache<u8, ()>,
        mutations: AdmissionMutations,
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    fn close(_: &(), _: bool) -> std::result::Result<(), (Error, bool)> {
        Ok(())
    }

    impl World {
        /// One submission of `subbatches` subbatches through region `key`'s
        /// import, as `IpcExecutor::run` posts them; a refused one fails the rest.
        fn submit(&self, key: u8, subbatches: usize) {
            let mut admission = SubbatchAdmission::new(&self.gate);
            admission.mutations = self.mutations;
            for i in 0..subbatches {
                let Ok(entry) = admission.admit(i + 1 < subbatches) else { return };
                let (import, _) = self
                    .cache
                    .acquire(&key, far(), &|| "model".into(), || Ok(()), &close, &|_| true)
                    .expect("an import");
                shuttle::thread::yield_now();
                drop(import);
                self.cache.release(&key);
                drop(entry);
            }
        }
    }

    pub fn model(mutations: AdmissionMutations) {
        let w = Arc::new(World { gate: Gate::new("requester side"), cache: RelocationCache::new(4), mutations });
        let submitters: Vec<_> = [(1u8, 3usize), (2, 1)]
            .into_iter()
            .map(|(key, n)| {
                let w = w.clone();
                shuttle::thread::spawn(move || w.submit(key, n))
            })
            .collect();
        let w2 = w.clone();
        let closer = shuttle::thread::spawn(move || {
            assert_eq!(w2.gate.close_and_wait(far()), 0);
            assert!(w2.cache.flush(far(), &close).is_empty());
        });
        for h in submitters {
            h.join().unwrap();
        }
        closer.join().unwrap();
        let left: Vec<u8> = w.cache.entries().into_iter().map(|e| e.0).collect();
        assert!(left.is_empty(), "imports of regions {left:?} cached after the close flushed");
    }
}

#[test]
fn close_and_subbatches_random_interleavings() {
    shuttle::check_random(|| close_model::model(Default::default()), 3000);
}

#[test]
fn close_and_subbatches_pct_interleavings() {
    shuttle::check_pct(|| close_model::model(Default::default()), 1000, 3);
}

/// Whether the model, with `bug` switched on, fails in some interleaving.
fn close_model_finds(bug: orbite::sync::admission::AdmissionMutations) -> bool {
    let found = std::panic::catch_unwind(|| shuttle::check_random(move || close_model::model(bug), 3000));
    found.is_err()
}

#[test]
fn the_model_finds_a_close_between_two_windows() {
    let bug = orbite::sync::admission::AdmissionMutations { no_hold: true, run_unentered: true };
    assert!(close_model_finds(bug), "no interleaving left an import cached");
}

#[test]
fn the_model_finds_a_subbatch_run_after_the_gate_closed() {
    let bug = orbite::sync::admission::AdmissionMutations { run_unentered: true, ..Default::default() };
    assert!(close_model_finds(bug), "no interleaving left an import cached");
}
