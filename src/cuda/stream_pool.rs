//! `StreamPool`: the shared pool of (stream, event) slots that lends each
//! asynchronous copy group an exclusive handle matched to its native
//! context. `nvlink_stream_count` bounds the slots across all contexts; at
//! capacity an idle slot of another context is replaced; otherwise callers
//! wait until their deadline. Native calls (create, destroy) run outside the
//! pool mutex. A slot whose DMA, restoration or cleanup is uncertain is
//! quarantined (never destroyed again, never lent); a fully quarantined pool
//! answers `ResourceExhausted`.
//!
//! The pool is generic over [`StreamFactory`] so its logic is tested on CPU;
//! the CUDA build plugs in the driver.

use crate::error::{Error, Result};
use crate::sync::{Condvar, Mutex};
use std::sync::Arc;
use std::time::Instant;

/// Creates and destroys the native (stream, event) pair of a slot.
pub trait StreamFactory: Send + Sync {
    /// The native pair.
    type Handle: Send;
    /// Creates a pair in context `ctx` (called outside the pool mutex).
    fn create(&self, ctx: u64) -> Result<Self::Handle>;
    /// Destroys a pair (called outside the pool mutex).
    fn destroy(&self, ctx: u64, h: Self::Handle) -> Result<()>;
}

enum SlotState<H> {
    /// Being created or replaced by some caller.
    Busy,
    /// Free for its context.
    Idle(H),
    /// Lent out.
    Active,
    /// Uncertain: kept, never lent or destroyed again.
    Quarantined,
}

struct Slot<H> {
    ctx: u64,
    state: SlotState<H>,
}

/// Counts for `EngineStats.nvlink`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolCounts {
    /// Slots in existence (any state).
    pub stream_slots: u64,
    /// Slots lent out.
    pub active_streams: u64,
    /// Quarantined slots (retained).
    pub retained_streams: u64,
}

/// The pool.
pub struct StreamPool<F: StreamFactory> {
    factory: F,
    capacity: usize,
    slots: Mutex<Vec<Slot<F::Handle>>>,
    freed: Condvar,
}

/// An exclusive loan of one slot; give it back with [`StreamPool::release`].
pub struct StreamLease<H> {
    index: usize,
    /// The context the slot belongs to.
    pub ctx: u64,
    /// The native pair.
    pub handle: Option<H>,
}

impl<F: StreamFactory> Drop for StreamPool<F> {
    /// Destroys the idle pairs. Nothing is lent out then (a mapping with a
    /// lease holds the pool); quarantined slots keep no handle and are left
    /// alone (their work or cleanup is uncertain).
    fn drop(&mut self) {
        let idle: Vec<(u64, F::Handle)> = self
            .slots
            .lock()
            .drain(..)
            .filter_map(|s| match s.state {
                SlotState::Idle(h) => Some((s.ctx, h)),
                _ => None,
            })
            .collect();
        for (ctx, h) in idle {
            let _ = self.factory.destroy(ctx, h);
        }
    }
}

impl<F: StreamFactory> StreamPool<F> {
    /// A pool of at most `capacity` slots.
    pub fn new(factory: F, capacity: usize) -> Arc<StreamPool<F>> {
        Arc::new(StreamPool {
            factory,
            capacity: capacity.max(1),
            slots: Mutex::new(Vec::new()),
            freed: Condvar::new(),
        })
    }

    /// Lends a slot of context `ctx`, creating or replacing one if needed,
    /// waiting until `deadline` when every slot is busy.
    pub fn lease(&self, ctx: u64, deadline: Instant) -> Result<StreamLease<F::Handle>> {
        let mut slots = self.slots.lock();
        loop {
            // 1. An idle slot of this context.
            if let Some(i) = slots.iter().position(|s| s.ctx == ctx && matches!(s.state, SlotState::Idle(_))) {
                let SlotState::Idle(h) = std::mem::replace(&mut slots[i].state, SlotState::Active) else {
                    unreachable!("idle")
                };
                return Ok(StreamLease { index: i, ctx, handle: Some(h) });
            }
            // 2. Room for a new slot: reuse a vacated index or grow.
            let vacant = slots.iter().position(|s| matches!(s.state, SlotState::Busy) && s.ctx == u64::MAX);
            if vacant.is_some() || slots.len() < self.capacity {
                let i = match vacant {
                    Some(i) => {
                        slots[i] = Slot { ctx, state: SlotState::Busy };
                        i
                    }
                    None => {
                        slots.push(Slot { ctx, state: SlotState::Busy });
                        slots.len() - 1
                    }
                };
                drop(slots);
                return self.create_in(i, ctx);
            }
            // 3. At capacity: replace an idle slot of another context.
            if let Some(i) = slots.iter().position(|s| s.ctx != ctx && matches!(s.state, SlotState::Idle(_))) {
                let old_ctx = slots[i].ctx;
                let SlotState::Idle(old) = std::mem::replace(&mut slots[i].state, SlotState::Busy) else {
                    unreachable!("idle")
                };
                drop(slots);
                let destroyed = self.factory.destroy(old_ctx, old);
                let mut s = self.slots.lock();
                if destroyed.is_err() {
                    // Cleanup uncertain: quarantine, never retry the destroy.
                    s[i].state = SlotState::Quarantined;
                    slots = s;
                    continue;
                }
                s[i] = Slot { ctx, state: SlotState::Busy };
                drop(s);
                return self.create_in(i, ctx);
            }
            // 4. Nothing will ever free up.
            if slots.len() >= self.capacity && slots.iter().all(|s| matches!(s.state, SlotState::Quarantined)) {
                return Err(Error::ResourceExhausted(format!(
                    "every one of the {} stream-pool slots is quarantined after uncertain DMA or cleanup",
                    self.capacity
                )));
            }
            // 5. Wait for a release.
            if self.freed.wait_until(&mut slots, deadline).timed_out() {
                return Err(Error::TimedOut(format!(
                    "no stream-pool slot became free before the deadline ({} slots)",
                    self.capacity
                )));
            }
        }
    }

    /// Creates the native pair of slot `i` (reserved `Busy` for `ctx` by the
    /// caller) outside the mutex; on failure the place is vacated.
    fn create_in(&self, i: usize, ctx: u64) -> Result<StreamLease<F::Handle>> {
        let made = self.factory.create(ctx);
        let mut s = self.slots.lock();
        match made {
            Ok(h) => {
                s[i].state = SlotState::Active;
                Ok(StreamLease { index: i, ctx, handle: Some(h) })
            }
            Err(e) => {
                s[i] = Slot { ctx: u64::MAX, state: SlotState::Busy };
                drop(s);
                self.freed.notify_all();
                Err(e)
            }
        }
    }

    /// Returns a slot: `certain` = its work is known complete and its context
    /// restored; otherwise the slot is quarantined.
    pub fn release(&self, mut lease: StreamLease<F::Handle>, certain: bool) {
        let mut slots = self.slots.lock();
        slots[lease.index].state = match (certain, lease.handle.take()) {
            (true, Some(h)) => SlotState::Idle(h),
            _ => SlotState::Quarantined,
        };
        drop(slots);
        self.freed.notify_all();
    }

    /// Counts for stats.
    pub fn counts(&self) -> PoolCounts {
        let slots = self.slots.lock();
        let mut c = PoolCounts::default();
        for s in slots.iter() {
            match s.state {
                SlotState::Busy if s.ctx == u64::MAX => continue,
                SlotState::Active | SlotState::Busy => c.active_streams += 1,
                SlotState::Quarantined => c.retained_streams += 1,
                SlotState::Idle(_) => {}
            }
            c.stream_slots += 1;
        }
        c
    }

    /// Destroys every idle slot (engine teardown); returns how many slots
    /// remain (active or quarantined).
    pub fn drain_idle(&self) -> usize {
        let idle: Vec<(u64, F::Handle)> = {
            let mut slots = self.slots.lock();
            let mut out = Vec::new();
            for s in slots.iter_mut() {
                if matches!(s.state, SlotState::Idle(_)) {
                    let SlotState::Idle(h) = std::mem::replace(&mut s.state, SlotState::Busy) else { unreachable!() };
                    out.push((s.ctx, h));
                    s.ctx = u64::MAX;
                }
            }
            out
        };
        let mut failed = 0;
        for (ctx, h) in idle {
            if self.factory.destroy(ctx, h).is_err() {
                failed += 1;
            }
        }
        let c = self.counts();
        (c.active_streams + c.retained_streams) as usize + failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::take_armed as take;
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    use std::time::Duration;

    #[derive(Default)]
    struct Fake {
        next: AtomicU64,
        created: AtomicU32,
        destroyed: AtomicU32,
        fail_destroy: AtomicU32,
        fail_create: AtomicU32,
    }

    impl StreamFactory for Fake {
        type Handle = u64;
        fn create(&self, ctx: u64) -> Result<u64> {
            if take(&self.fail_create) {
                return Err(Error::Cuda("injected create failure".into()));
            }
            self.created.fetch_add(1, Ordering::SeqCst);
            Ok(ctx * 1000 + self.next.fetch_add(1, Ordering::SeqCst))
        }
        fn destroy(&self, _ctx: u64, _h: u64) -> Result<()> {
            if take(&self.fail_destroy) {
                return Err(Error::Cuda("injected destroy failure".into()));
            }
            self.destroyed.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(30)
    }

    struct Counting(Arc<AtomicU32>);

    impl StreamFactory for Counting {
        type Handle = u64;
        fn create(&self, ctx: u64) -> Result<u64> {
            Ok(ctx)
        }
        fn destroy(&self, _ctx: u64, _h: u64) -> Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn dropping_the_pool_destroys_idle_pairs_only() {
        let destroyed = Arc::new(AtomicU32::new(0));
        let p = StreamPool::new(Counting(destroyed.clone()), 3);
        let a = p.lease(1, soon()).unwrap();
        let b = p.lease(2, soon()).unwrap();
        p.release(a, true);
        p.release(b, false);
        drop(p);
        assert_eq!(destroyed.load(Ordering::SeqCst), 1, "the idle pair, not the quarantined one");
    }

    #[test]
    fn reuses_idle_slots_of_the_same_context() {
        let p = StreamPool::new(Fake::default(), 2);
        let a = p.lease(1, soon()).unwrap();
        let h = a.handle.unwrap();
        p.release(a, true);
        let b = p.lease(1, soon()).unwrap();
        assert_eq!(b.handle, Some(h));
        assert_eq!(p.factory.created.load(Ordering::SeqCst), 1);
        assert_eq!(p.counts(), PoolCounts { stream_slots: 1, active_streams: 1, retained_streams: 0 });
        p.release(b, true);
    }

    #[test]
    fn bounded_across_contexts_replaces_idle_other_context_else_waits() {
        let p = StreamPool::new(Fake::default(), 2);
        let a = p.lease(1, soon()).unwrap();
        let b = p.lease(2, soon()).unwrap();
        // Full and nothing idle: waits until the deadline.
        assert!(matches!(p.lease(3, soon()), Err(Error::TimedOut(_))));
        p.release(b, true);
        // Context 3 replaces context 2's idle slot.
        let c = p.lease(3, soon()).unwrap();
        assert_eq!(c.ctx, 3);
        assert_eq!(p.factory.destroyed.load(Ordering::SeqCst), 1);
        assert_eq!(p.counts().stream_slots, 2);
        p.release(a, true);
        p.release(c, true);
    }

    #[test]
    fn a_waiter_gets_a_released_slot() {
        let p = StreamPool::new(Fake::default(), 1);
        let a = p.lease(1, soon()).unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(|| p.lease(1, Instant::now() + Duration::from_secs(60)).map(|l| l.ctx));
            // Release only after the waiter is registered on the pool; the
            // waiter gets the slot either way (idle slot of its context).
            p.release(a, true);
            assert_eq!(h.join().unwrap().unwrap(), 1);
        });
    }

    #[test]
    fn uncertain_slots_are_quarantined_and_a_full_quarantine_is_exhausted() {
        let p = StreamPool::new(Fake::default(), 2);
        let a = p.lease(1, soon()).unwrap();
        let b = p.lease(1, soon()).unwrap();
        p.release(a, false);
        assert_eq!(p.counts(), PoolCounts { stream_slots: 2, active_streams: 1, retained_streams: 1 });
        p.release(b, false);
        assert!(matches!(p.lease(1, soon()), Err(Error::ResourceExhausted(_))));
        assert!(matches!(p.lease(7, soon()), Err(Error::ResourceExhausted(_))));
        // Quarantined slots are never destroyed.
        assert_eq!(p.factory.destroyed.load(Ordering::SeqCst), 0);
        assert_eq!(p.drain_idle(), 2);
    }

    #[test]
    fn failed_destroy_during_replacement_quarantines_without_retry() {
        let p = StreamPool::new(Fake::default(), 1);
        let a = p.lease(1, soon()).unwrap();
        p.release(a, true);
        p.factory.fail_destroy.store(1, Ordering::SeqCst);
        assert!(matches!(p.lease(2, soon()), Err(Error::ResourceExhausted(_))));
        assert_eq!(p.counts().retained_streams, 1);
        assert_eq!(p.factory.destroyed.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn failed_create_frees_its_place() {
        let p = StreamPool::new(Fake::default(), 1);
        p.factory.fail_create.store(1, Ordering::SeqCst);
        assert!(matches!(p.lease(1, soon()), Err(Error::Cuda(_))));
        assert_eq!(p.counts().stream_slots, 0);
        let a = p.lease(1, soon()).unwrap();
        p.release(a, true);
        assert_eq!(p.drain_idle(), 0);
        assert_eq!(p.factory.destroyed.load(Ordering::SeqCst), 1);
    }

    /// A factory whose `create` of context 2 and `destroy` of context 3
    /// say they started, then wait until the test lets them go, which it
    /// does only after it took the pool's lock itself: called under that
    /// lock, they would wait out their 60 s and fail. Its handle is the
    /// context; it records every handle it destroys.
    struct Gated {
        started: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
        gate: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
        destroyed: std::sync::Mutex<Vec<u64>>,
    }

    impl Gated {
        fn hold(&self, what: &str) -> Result<()> {
            self.started.lock().unwrap().send(()).unwrap();
            let let_go = self.gate.lock().unwrap().recv_timeout(Duration::from_secs(60));
            let_go.map_err(|_| Error::Cuda(format!("{what} was never let go: it ran under the pool's lock")))
        }
    }

    impl StreamFactory for Gated {
        type Handle = u64;
        fn create(&self, ctx: u64) -> Result<u64> {
            if ctx == 2 {
                self.hold("create")?;
            }
            Ok(ctx)
        }
        fn destroy(&self, ctx: u64, h: u64) -> Result<()> {
            if ctx == 3 {
                self.hold("destroy")?;
            }
            self.destroyed.lock().unwrap().push(h);
            Ok(())
        }
    }

    fn gated() -> (Arc<StreamPool<Gated>>, std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (let_go, gate) = std::sync::mpsc::channel();
        let factory = Gated {
            started: std::sync::Mutex::new(started_tx),
            gate: std::sync::Mutex::new(gate),
            destroyed: std::sync::Mutex::new(Vec::new()),
        };
        (StreamPool::new(factory, 2), started, let_go)
    }

    /// While one caller's native create runs, another leases and releases
    /// a slot: the create is called outside the pool's lock (row T3).
    #[test]
    fn a_slow_native_create_leaves_the_pool_to_other_callers() {
        let (p, started, let_go) = gated();
        let a = p.lease(1, soon()).unwrap();
        p.release(a, true);
        std::thread::scope(|s| {
            let slow = s.spawn(|| p.lease(2, Instant::now() + Duration::from_secs(120)).map(|l| l.ctx));
            started.recv_timeout(Duration::from_secs(60)).expect("the create of context 2 started");
            let b = p.lease(1, soon()).unwrap();
            p.release(b, true);
            let_go.send(()).unwrap();
            assert_eq!(slow.join().unwrap().unwrap(), 2);
        });
    }

    /// While one caller's native create runs, its slot is `Busy` for its
    /// context: a caller of another context never takes that index over
    /// (only a slot a failed create vacated is reused) but grows the pool.
    /// The two leases hold distinct indices and each created pair is
    /// destroyed exactly once. Guards `lease`'s vacant-slot search
    /// (`Busy` and `s.ctx == u64::MAX`).
    #[test]
    fn a_slot_being_created_is_never_taken_by_another_caller() {
        let (p, started, let_go) = gated();
        let far = || Instant::now() + Duration::from_secs(120);
        let (slow, other) = std::thread::scope(|s| {
            let slow = s.spawn(|| p.lease(2, far()));
            started.recv_timeout(Duration::from_secs(60)).expect("the create of context 2 started");
            let other = p.lease(1, far());
            // Let the create go before any assertion, so that a failure
            // does not leave it waiting out its 60 s.
            let_go.send(()).unwrap();
            (slow.join().unwrap().unwrap(), other.unwrap())
        });
        assert_eq!((slow.index, slow.ctx, slow.handle), (0, 2, Some(2)), "the creating caller's slot");
        assert_eq!((other.index, other.ctx, other.handle), (1, 1, Some(1)), "took a slot still being created");
        assert_eq!(p.counts(), PoolCounts { stream_slots: 2, active_streams: 2, retained_streams: 0 });
        p.release(other, true);
        p.release(slow, true);
        assert_eq!(p.drain_idle(), 0);
        let mut destroyed = p.factory.destroyed.lock().unwrap().clone();
        destroyed.sort_unstable();
        assert_eq!(destroyed, [1, 2], "each created pair destroyed exactly once");
    }

    /// While a replacement destroys another context's idle pair, other
    /// callers use the pool: the destroy is called outside its lock (T3).
    #[test]
    fn a_slow_native_destroy_leaves_the_pool_to_other_callers() {
        let (p, started, let_go) = gated();
        let (a, b) = (p.lease(3, soon()).unwrap(), p.lease(4, soon()).unwrap());
        p.release(a, true);
        std::thread::scope(|s| {
            // At capacity: context 5 replaces context 3's idle slot.
            let slow = s.spawn(|| p.lease(5, Instant::now() + Duration::from_secs(120)).map(|l| l.ctx));
            started.recv_timeout(Duration::from_secs(60)).expect("the destroy of context 3 started");
            assert_eq!(p.counts().stream_slots, 2);
            p.release(b, true);
            let c = p.lease(4, soon()).unwrap();
            p.release(c, true);
            let_go.send(()).unwrap();
            assert_eq!(slow.join().unwrap().unwrap(), 5);
        });
        assert_eq!(p.counts().retained_streams, 0);
    }
}
