//! Synchronisation. This module is the lock shim of the model-checked
//! structures (the CUDA stream pool, the relocation cache, the snapshot
//! cell): parking_lot in every real build; shuttle's, behind a
//! parking_lot-shaped API, when the `model-check` feature builds the
//! concurrency models (`tests/models.rs`).
//! [`admission`] holds the byte budgets and gates of the engine;
//! [`snapshot`] is a value read without a lock and replaced whole;
//! [`spare`] keeps one emptied vector between submissions;
//! [`single_runner`] runs a job on at most one short-lived thread at a time;
//! [`deadline`] bounds a blocking exchange (when, and what stops it first);
//! [`spin`] says whether spinning pays (a yield that came back late: no);
//! [`fork`] tells a forked child without a system call; [`take_armed`]
//! counts a fault switch down; [`fast_hash`] hashes the hot maps' keys.

pub mod admission;
pub mod deadline;
pub mod fast_hash;
pub mod fork;
pub mod single_runner;
pub mod snapshot;
pub mod spare;
pub mod spin;

#[cfg(not(feature = "model-check"))]
pub use parking_lot::{Condvar, Mutex, MutexGuard};

/// The atomics of the model-checked structures (the gate, the snapshot
/// cell): std's in every real build, shuttle's under `model-check`, so
/// that the models explore interleavings at each atomic step too.
pub mod atomic {
    #[cfg(feature = "model-check")]
    pub use shuttle::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
    #[cfg(not(feature = "model-check"))]
    pub use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
}

/// The spin-wait steps of the model-checked structures (the snapshot
/// cell's writer): std's in every real build, shuttle's under
/// `model-check`, where a spinning thread hands the turn to the scheduler
/// (time does not pass in a model: a spin that never yields never ends).
pub mod hint {
    #[cfg(feature = "model-check")]
    pub use shuttle::{hint::spin_loop, thread::yield_now};
    #[cfg(not(feature = "model-check"))]
    pub use std::{hint::spin_loop, thread::yield_now};
}

/// Takes one of the `n` armed failures a "fail the next N" switch holds:
/// true (and one fewer armed) when any was left. What every fault switch
/// of the library and its test fakes counts down with.
pub fn take_armed(counter: &std::sync::atomic::AtomicU32) -> bool {
    use std::sync::atomic::Ordering;
    counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
}

/// Waits (bounded: 60 s) until thread `tid` of this process sleeps, on
/// the kernel's word (`/proc/self/task/TID/stat` state `S`): how a lib test
/// knows a thread is blocked in a wait before it does what should wake it.
#[cfg(test)]
pub(crate) fn until_asleep(tid: i64) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
            .unwrap_or_else(|e| panic!("thread {tid} ended instead of waiting ({e})"));
        let state = stat.rsplit(')').next().unwrap().split_whitespace().next().unwrap().to_string();
        if state == "S" {
            return;
        }
        assert!(std::time::Instant::now() < until, "thread {tid} never slept (state {state})");
        std::thread::yield_now();
    }
}

/// This thread's kernel id, for [`until_asleep`].
#[cfg(test)]
pub(crate) fn thread_id() -> i64 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as i64 }
}

#[cfg(feature = "model-check")]
pub use model::{Condvar, Mutex, MutexGuard};

#[cfg(feature = "model-check")]
mod model {
    use std::ops::{Deref, DerefMut};
    use std::time::Instant;

    /// A mutex with parking_lot's `lock()` (no poisoning).
    #[derive(Debug, Default)]
    pub struct Mutex<T>(shuttle::sync::Mutex<T>);

    /// Its guard; the inner guard is lent to `Condvar::wait_until`.
    pub struct MutexGuard<'a, T>(Option<shuttle::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        /// A mutex holding `v`.
        pub fn new(v: T) -> Mutex<T> {
            Mutex(shuttle::sync::Mutex::new(v))
        }
        /// Locks it.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(|e| e.into_inner())))
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("guard held")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("guard held")
        }
    }

    /// The outcome of a timed wait.
    pub struct WaitResult(bool);

    impl WaitResult {
        /// Whether the wait timed out (never, under shuttle: time does not
        /// pass in a model, so a lost wakeup shows up as a deadlock).
        pub fn timed_out(&self) -> bool {
            self.0
        }
    }

    /// A condition variable with parking_lot's `wait_until(&mut guard, ..)`.
    #[derive(Debug, Default)]
    pub struct Condvar(shuttle::sync::Condvar);

    impl Condvar {
        /// A condition variable.
        pub fn new() -> Condvar {
            Condvar(shuttle::sync::Condvar::new())
        }
        /// Waits for a notification (the deadline is not modelled).
        pub fn wait_until<T>(&self, g: &mut MutexGuard<'_, T>, _deadline: Instant) -> WaitResult {
            let inner = g.0.take().expect("guard held");
            let inner = self.0.wait(inner).unwrap_or_else(|e| e.into_inner());
            g.0 = Some(inner);
            WaitResult(false)
        }
        /// Wakes every waiter.
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}
