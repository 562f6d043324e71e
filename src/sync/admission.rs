//! Small synchronisation pieces: a byte budget (admission), a gate that
//! counts work inside it and can be closed and drained, and the admission
//! of one submission's subbatches into that gate. On the lock shim
//! (`crate::sync`), so that the gate's users are model-checked
//! (`tests/models.rs`).

use crate::error::{Error, Result};
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Condvar, Mutex};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Instant;

/// A byte budget: `acquire` waits until enough bytes are free.
pub struct Budget {
    limit: u64,
    used: Mutex<u64>,
    cv: Condvar,
}

/// Bytes held from a [`Budget`]; released on drop.
pub struct Permit {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Permit {
    /// The bytes it holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Moves `bytes` of this permit into a permit of their own, without
    /// touching the budget (what a submission admitted in one step hands
    /// to each chunk, released as each completes). Panics past its bytes.
    pub fn split(&mut self, bytes: u64) -> Permit {
        assert!(bytes <= self.bytes, "splitting {bytes} bytes off a permit of {}", self.bytes);
        self.bytes -= bytes;
        Permit { budget: self.budget.clone(), bytes }
    }

    /// The budget its bytes are held from.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Takes `bytes` off this permit without giving them back: whoever
    /// took them gives them back once, with [`Budget::give_back`] (what a
    /// submission admitted in one step does for each chunk, whose record
    /// shares one handle on the budget with the step's other chunks: no
    /// reference count per chunk). Panics past its bytes.
    pub fn detach(&mut self, bytes: u64) {
        assert!(bytes <= self.bytes, "detaching {bytes} bytes off a permit of {}", self.bytes);
        self.bytes -= bytes;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget { limit, used: Mutex::new(0), cv: Condvar::new() })
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        *self.used.lock()
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Gives back `bytes` detached from a permit ([`Permit::detach`]),
    /// waking whoever waits for room.
    pub fn give_back(&self, bytes: u64) {
        if bytes == 0 {
            // Wholly split off or detached: nothing to give back.
            return;
        }
        let mut u = self.used.lock();
        *u -= bytes;
        drop(u);
        self.cv.notify_all();
    }

    /// Takes `bytes` without waiting, if free.
    pub fn try_acquire(self: &Arc<Self>, bytes: u64) -> Option<Permit> {
        let mut u = self.used.lock();
        (*u + bytes <= self.limit).then(|| {
            *u += bytes;
            Permit { budget: self.clone(), bytes }
        })
    }

    /// Takes, in one step, the longest leading run of `pieces` that fits
    /// now, as one permit of their sum (to [`Permit::split`] per piece),
    /// and how many pieces it holds: what taking them one by one with
    /// [`Budget::try_acquire`] until the first refusal takes, at one lock.
    /// `None` when the first piece does not fit (or there is none).
    pub fn try_acquire_prefix(self: &Arc<Self>, pieces: impl Iterator<Item = u64> + Clone) -> Option<(Permit, usize)> {
        // The run is measured against the room seen under a first look,
        // outside the lock, and taken if that room is still there (another
        // holder may take some meanwhile: measured again then).
        let mut free = self.limit.saturating_sub(*self.used.lock());
        loop {
            let (mut n, mut sum) = (0usize, 0u64);
            for b in pieces.clone() {
                match sum.checked_add(b).filter(|&t| t <= free) {
                    Some(t) => (n, sum) = (n + 1, t),
                    None => break,
                }
            }
            if n == 0 {
                return None;
            }
            let mut u = self.used.lock();
            if *u + sum <= self.limit {
                *u += sum;
                return Some((Permit { budget: self.clone(), bytes: sum }, n));
            }
            free = self.limit.saturating_sub(*u);
        }
    }

    /// Takes `bytes`, waiting until `deadline`. More than the limit is refused.
    pub fn acquire(self: &Arc<Self>, bytes: u64, deadline: Instant, what: &str) -> Result<Permit> {
        if bytes > self.limit {
            return Err(Error::ResourceExhausted(format!(
                "{what}: {bytes} bytes exceed the budget of {} bytes",
                self.limit
            )));
        }
        let mut u = self.used.lock();
        while *u + bytes > self.limit {
            if self.cv.wait_until(&mut u, deadline).timed_out() && *u + bytes > self.limit {
                return Err(Error::TimedOut(format!(
                    "{what}: no admission for {bytes} bytes before the deadline ({} of {} bytes in flight)",
                    *u, self.limit
                )));
            }
        }
        *u += bytes;
        Ok(Permit { budget: self.clone(), bytes })
    }
}

/// Charges against a [`Budget`] for things several holders share (an
/// exported or imported allocation): each thing is charged once, while any
/// of its holders holds it, however many they are.
pub struct SharedCharges<K: Eq + Hash + Clone> {
    budget: Arc<Budget>,
    /// Per thing: its holders and its permit (dropped, under this lock,
    /// with the last holder: a new holder finds it held or returned).
    held: Mutex<HashMap<K, (u64, Permit)>>,
}

/// One holder's share of a thing's charge.
pub struct SharedCharge<K: Eq + Hash + Clone> {
    charges: Arc<SharedCharges<K>>,
    key: K,
}

impl<K: Eq + Hash + Clone> SharedCharges<K> {
    /// Shared charges against `budget`.
    pub fn new(budget: Arc<Budget>) -> Arc<SharedCharges<K>> {
        Arc::new(SharedCharges { budget, held: Mutex::new(HashMap::new()) })
    }

    /// A share of `key`'s charge: the one its holders share, or a new one
    /// of `bytes` from the budget (`None`: the budget cannot hold it).
    pub fn try_acquire(self: &Arc<Self>, key: K, bytes: u64) -> Option<SharedCharge<K>> {
        let mut held = self.held.lock();
        match held.get_mut(&key) {
            Some((holders, _)) => *holders += 1,
            None => {
                let permit = self.budget.try_acquire(bytes)?;
                held.insert(key.clone(), (1, permit));
            }
        }
        Some(SharedCharge { charges: self.clone(), key })
    }

    /// The bytes charged now (each thing once).
    pub fn bytes(&self) -> u64 {
        self.held.lock().values().map(|(_, p)| p.bytes).sum()
    }

    /// The budget they are charged against.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }
}

impl<K: Eq + Hash + Clone> Drop for SharedCharge<K> {
    fn drop(&mut self) {
        let mut held = self.charges.held.lock();
        if let Some((holders, _)) = held.get_mut(&self.key) {
            *holders -= 1;
            if *holders == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// A gate: work enters while it is open; closing waits for work inside.
/// Entering, leaving and asking whether it is open take no lock: one word
/// holds the closed bit and the units inside.
pub struct Gate {
    /// [`GATE_CLOSED`] | the units of work inside.
    word: AtomicU64,
    /// Held by a close while it looks at the units inside and waits, and
    /// by the last unit leaving a closed gate to wake it (no lost wakeup).
    waiting: Mutex<()>,
    cv: Condvar,
    name: &'static str,
}

/// [`Gate::word`]'s closed bit.
const GATE_CLOSED: u64 = 1 << 63;

/// One unit of work inside a [`Gate`].
pub struct GateGuard {
    gate: Arc<Gate>,
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        self.gate.leave(1);
    }
}

/// Units of work that entered a [`Gate`] together ([`Gate::enter_many`]),
/// handed out one by one as [`GateGuard`]s; those never handed out leave
/// the gate when it drops.
pub struct GateGuards {
    gate: Arc<Gate>,
    left: u64,
}

impl GateGuards {
    /// One of the units, as a guard of its own (no lock); `None` when all
    /// were handed out.
    pub fn take(&mut self) -> Option<GateGuard> {
        (self.left > 0).then(|| {
            self.left -= 1;
            GateGuard { gate: self.gate.clone() }
        })
    }

    /// The gate its units are inside.
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// Takes one of the units off without a guard of its own: whoever took
    /// it leaves the gate once, with [`Gate::leave_one`] (what a chunk does
    /// whose record shares one handle on the gate with the other chunks of
    /// its admission step). False when all were handed out.
    pub fn detach(&mut self) -> bool {
        let some = self.left > 0;
        self.left -= u64::from(some);
        some
    }
}

impl Drop for GateGuards {
    fn drop(&mut self) {
        if self.left > 0 {
            self.gate.leave(self.left);
        }
    }
}

impl Gate {
    /// An open gate named for messages.
    pub fn new(name: &'static str) -> Arc<Gate> {
        Arc::new(Gate { word: AtomicU64::new(0), waiting: Mutex::new(()), cv: Condvar::new(), name })
    }

    /// Enters if open.
    pub fn enter(self: &Arc<Self>) -> Result<GateGuard> {
        self.admit(1)?;
        Ok(GateGuard { gate: self.clone() })
    }

    /// Enters `n` units at once if open (one atomic step): [`Gate::enter`]
    /// `n` times while the gate stays open.
    pub fn enter_many(self: &Arc<Self>, n: u64) -> Result<GateGuards> {
        self.admit(n)?;
        Ok(GateGuards { gate: self.clone(), left: n })
    }

    /// Counts `n` units in if open.
    fn admit(&self, n: u64) -> Result<()> {
        let entered = self.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            (w & GATE_CLOSED == 0).then(|| w.checked_add(n).filter(|v| v & GATE_CLOSED == 0)).flatten()
        });
        entered.map(|_| ()).map_err(|_| Error::Unavailable(format!("the {} is closed", self.name)))
    }

    /// A unit detached from a [`GateGuards`] ([`GateGuards::detach`])
    /// leaves; the last to leave a closed gate wakes the close waiting.
    pub fn leave_one(&self) {
        self.leave(1);
    }

    /// `n` units of work leave; the last to leave a closed gate wakes the
    /// close waiting for them.
    fn leave(&self, n: u64) {
        let was = self.word.fetch_sub(n, Ordering::AcqRel);
        if was & GATE_CLOSED != 0 && was & !GATE_CLOSED == n {
            let _w = self.waiting.lock();
            self.cv.notify_all();
        }
    }

    /// Whether the gate is open.
    pub fn is_open(&self) -> bool {
        self.word.load(Ordering::Acquire) & GATE_CLOSED == 0
    }

    /// Work inside now.
    pub fn active(&self) -> u64 {
        self.word.load(Ordering::Acquire) & !GATE_CLOSED
    }

    /// Closes the gate and waits until `deadline` for the work inside;
    /// returns how many units are still inside (0 = drained).
    pub fn close_and_wait(&self, deadline: Instant) -> u64 {
        let mut w = self.waiting.lock();
        self.word.fetch_or(GATE_CLOSED, Ordering::AcqRel);
        while self.active() > 0 {
            if self.cv.wait_until(&mut w, deadline).timed_out() {
                break;
            }
        }
        self.active()
    }
}

/// Admits the subbatches of one submission into a [`Gate`] (the
/// requester side's), so that a close never falls between two of them nor
/// between the gate's last check and a subbatch: each runs inside the
/// gate, entered for its own completion, and while more follow the whole
/// submission stays entered too, so that a close waits for the last one
/// (one posted after the close's flush would leave its import cached).
pub struct SubbatchAdmission {
    gate: Arc<Gate>,
    /// Entered once a subbatch has another after it; held to the end.
    hold: Option<GateGuard>,
    /// Bug switches for the concurrency model (`tests/models.rs`), off
    /// unless a test turns one on to show the model finds that class
    /// (compiled only for tests and with the `sim` feature, which
    /// `model-check` turns on).
    #[cfg(any(test, feature = "sim"))]
    pub mutations: AdmissionMutations,
}

/// Bugs of the past the model must find, re-introduced on demand.
#[cfg(any(test, feature = "sim"))]
#[derive(Debug, Clone, Copy, Default)]
pub struct AdmissionMutations {
    /// The submission is not held entered between its subbatches; with
    /// `run_unentered`, a close flushes between two windows of one
    /// submission and the later ones run after it (the race of bb188f6).
    pub no_hold: bool,
    /// A subbatch the closed gate refused its own entry still runs, inside
    /// nothing: a close between the submission's open-gate check and its
    /// only subbatch flushes before it runs.
    pub run_unentered: bool,
}

impl SubbatchAdmission {
    /// The admission of one submission's subbatches into `gate`.
    pub fn new(gate: &Arc<Gate>) -> SubbatchAdmission {
        SubbatchAdmission {
            gate: gate.clone(),
            hold: None,
            #[cfg(any(test, feature = "sim"))]
            mutations: AdmissionMutations::default(),
        }
    }

    /// Admits the next subbatch; `more` says another follows it. `Ok`:
    /// it may run, with its own entry (kept until it completes) or, once
    /// the gate began closing, inside the submission's hold (it then
    /// completes before returning). `Err`: the gate is closed and the
    /// submission holds nothing: this subbatch and those after it fail
    /// unposted.
    pub fn admit(&mut self, more: bool) -> Result<Option<GateGuard>> {
        if more && self.hold.is_none() && !mutated!(self.mutations.no_hold) {
            self.hold = Some(self.gate.enter()?);
        }
        match self.gate.enter() {
            Ok(own) => Ok(Some(own)),
            Err(_) if self.hold.is_some() || mutated!(self.mutations.run_unentered) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn budget_waits_and_refuses() {
        let b = Budget::new(10);
        let p = b.acquire(8, Instant::now(), "t").unwrap();
        assert!(b.try_acquire(3).is_none());
        let e = b.acquire(3, Instant::now() + Duration::from_millis(5), "t");
        assert!(matches!(e, Err(Error::TimedOut(_))));
        assert!(matches!(b.acquire(11, Instant::now(), "t"), Err(Error::ResourceExhausted(_))));
        drop(p);
        assert_eq!(b.used(), 0);
        let _q = b.try_acquire(10).unwrap();
    }

    /// A budget admits up to its limit exactly, never past it, holds each
    /// permit's bytes until it drops, and a waiter woken by a release
    /// that still leaves too little goes on waiting (it is not refused
    /// before its deadline).
    #[test]
    fn a_budget_admits_up_to_its_limit_and_waits_past_a_release_too_small() {
        let b = Budget::new(10);
        assert_eq!(b.limit(), 10);
        assert!(b.try_acquire(11).is_none());
        let whole = b.acquire(10, Instant::now(), "t").unwrap();
        assert_eq!((whole.bytes(), b.used()), (10, 10));
        drop(whole);
        let (six, two) = (b.try_acquire(6).unwrap(), b.acquire(2, Instant::now(), "t").unwrap());
        assert_eq!((six.bytes(), two.bytes(), b.used()), (6, 2, 8));
        // To the limit exactly, at once.
        let last = b.acquire(2, Instant::now(), "t").unwrap();
        drop(last);
        let (tid_tx, tid) = std::sync::mpsc::channel();
        let b2 = b.clone();
        let waiter = std::thread::spawn(move || {
            tid_tx.send(crate::sync::thread_id()).unwrap();
            b2.acquire(5, Instant::now() + Duration::from_secs(600), "t").map(|p| p.bytes())
        });
        let tid = tid.recv().unwrap();
        crate::sync::until_asleep(tid);
        // 6 held: 5 more do not fit; the waiter wakes and waits again.
        drop(two);
        crate::sync::until_asleep(tid);
        drop(six);
        assert_eq!(waiter.join().unwrap().unwrap(), 5);
        assert_eq!(b.used(), 0);
    }

    /// Guards `Budget::try_acquire_prefix` and `Permit::split`: the run
    /// taken is the one piece-by-piece `try_acquire` takes (to the limit
    /// exactly, stopping at the first piece that does not fit even when a
    /// later one would), each split piece gives its own bytes back as it
    /// drops, and nothing fits when the first piece does not.
    #[test]
    fn a_prefix_is_admitted_as_one_by_one_admission_would_and_released_per_piece() {
        let b = Budget::new(10);
        let held = b.try_acquire(1).unwrap();
        // 9 free: 4 and 3 fit, 5 does not; 1 would, after it, and is not taken.
        let pieces = [4u64, 3, 5, 1];
        let (mut whole, n) = b.try_acquire_prefix(pieces.iter().copied()).unwrap();
        assert_eq!((n, whole.bytes(), b.used()), (2, 7, 8));
        let parts: Vec<Permit> = pieces[..n].iter().map(|&p| whole.split(p)).collect();
        assert_eq!((whole.bytes(), b.used()), (0, 8));
        drop(whole);
        assert_eq!(b.used(), 8);
        let mut parts = parts.into_iter();
        drop(parts.next());
        assert_eq!(b.used(), 4);
        assert!(b.try_acquire_prefix([7u64, 1].into_iter()).is_none());
        assert!(b.try_acquire_prefix(std::iter::empty()).is_none());
        drop(parts);
        drop(held);
        assert_eq!(b.used(), 0);
        let (all, n) = b.try_acquire_prefix([5u64, 5, 1].into_iter()).unwrap();
        assert_eq!((n, all.bytes(), b.used()), (2, 10, 10));
    }

    /// A prefix admission measures its run outside the lock: another
    /// admission that takes room meanwhile (here from inside the measuring
    /// pass itself, deterministically) makes it measure again against what
    /// is in use now, so the two never hold more than the limit together.
    /// Guards `if *u + sum <= self.limit` in `Budget::try_acquire_prefix`
    /// (round 10 J15: with `sum <= self.limit` the run measured against
    /// the stale room was taken on top of the other's 50: 130 of 100).
    #[test]
    fn a_prefix_admission_raced_by_another_measures_again_under_the_lock() {
        let b = Budget::new(100);
        let other = std::cell::RefCell::new(None);
        let raced = std::cell::Cell::new(false);
        let pieces = [40u64, 40].into_iter().inspect(|_| {
            if !raced.replace(true) {
                *other.borrow_mut() = b.try_acquire(50);
            }
        });
        let (mine, n) = b.try_acquire_prefix(pieces).unwrap();
        assert_eq!(other.borrow().as_ref().map(Permit::bytes), Some(50), "the other admission ran first");
        assert_eq!((n, mine.bytes(), b.used()), (1, 40, 90));
        drop(mine);
        drop(other);
        assert_eq!(b.used(), 0);
    }

    /// Guards `Gate::enter_many` and `GateGuards`: n units count as n
    /// `enter`s, each guard handed out leaves as it drops, those never
    /// handed out leave with the `GateGuards`, and a close waits for all
    /// of them; a closed gate refuses the lot.
    #[test]
    fn units_entered_together_leave_one_by_one() {
        let g = Gate::new("test gate");
        let mut many = g.enter_many(3).unwrap();
        let (a, b) = (many.take().unwrap(), many.take().unwrap());
        assert_eq!(g.active(), 3);
        drop(a);
        assert_eq!(g.active(), 2);
        drop(many);
        assert_eq!(g.active(), 1);
        let mut last = g.enter_many(1).unwrap();
        let c = last.take().unwrap();
        assert!(last.take().is_none());
        drop(last);
        assert_eq!(g.active(), 2);
        drop((b, c));
        assert_eq!(g.close_and_wait(Instant::now()), 0);
        let e = g.enter_many(2).err().expect("a closed gate admitted units");
        assert_eq!(e.to_string(), g.enter().err().unwrap().to_string());
        assert!(e.to_string().contains("the test gate is closed"), "{e}");
    }

    #[test]
    fn a_shared_charge_counts_once_until_its_last_holder_goes() {
        let b = Budget::new(10);
        let c = SharedCharges::new(b.clone());
        let one = c.try_acquire(1u8, 8).unwrap();
        let two = c.try_acquire(1u8, 8).unwrap();
        assert_eq!((b.used(), c.bytes()), (8, 8));
        // Another thing does not fit beside it.
        assert!(c.try_acquire(2u8, 8).is_none());
        drop(one);
        assert_eq!(b.used(), 8);
        drop(two);
        assert_eq!((b.used(), c.bytes()), (0, 0));
        let _three = c.try_acquire(2u8, 8).unwrap();
    }

    #[test]
    fn gate_drains() {
        let g = Gate::new("test gate");
        let a = g.enter().unwrap();
        assert_eq!(g.close_and_wait(Instant::now() + Duration::from_millis(5)), 1);
        assert!(g.enter().is_err());
        drop(a);
        assert_eq!(g.close_and_wait(Instant::now()), 0);
    }

    /// A close waits for the work inside and is woken by the last unit to
    /// leave (not by an earlier one, never left to its deadline); the gate
    /// says it is closed from the moment the close began.
    #[test]
    fn a_close_is_woken_by_the_last_unit_to_leave() {
        let g = Gate::new("test gate");
        assert!(g.is_open());
        let (a, b) = (g.enter().unwrap(), g.enter().unwrap());
        let (tid_tx, tid) = std::sync::mpsc::channel();
        let (done_tx, done) = std::sync::mpsc::channel();
        let g2 = g.clone();
        std::thread::spawn(move || {
            tid_tx.send(crate::sync::thread_id()).unwrap();
            done_tx.send(g2.close_and_wait(Instant::now() + Duration::from_secs(600))).unwrap();
        });
        let tid = tid.recv().unwrap();
        crate::sync::until_asleep(tid);
        assert!(!g.is_open());
        drop(a);
        crate::sync::until_asleep(tid);
        assert!(done.try_recv().is_err(), "the close returned with a unit inside");
        drop(b);
        assert_eq!(done.recv_timeout(Duration::from_secs(60)).expect("the last unit woke nobody"), 0);
        assert_eq!(g.active(), 0);
    }

    /// Guards `admit`'s three outcomes: its own entry while open; the
    /// hold, taken when more follow, keeps a close waiting and lets later
    /// subbatches run inside it; a closed gate with no hold refuses.
    #[test]
    fn subbatches_are_admitted_inside_the_gate_or_refused() {
        let g = Gate::new("requester side");
        let mut single = SubbatchAdmission::new(&g);
        let own = single.admit(false).unwrap().expect("its own entry");
        assert_eq!(g.active(), 1);
        drop(own);
        let mut windows = SubbatchAdmission::new(&g);
        let first = windows.admit(true).unwrap().expect("its own entry");
        assert_eq!(g.active(), 2, "the hold and the first window");
        drop(first);
        assert_eq!(g.close_and_wait(Instant::now()), 1, "the hold keeps the close waiting");
        assert!(windows.admit(false).unwrap().is_none(), "inside the hold, without an entry of its own");
        let e = single.admit(false).err().expect("refused");
        assert_eq!(e.status(), crate::error::Status::Unavailable);
        drop(windows);
        assert_eq!(g.close_and_wait(Instant::now()), 0);
    }
}
