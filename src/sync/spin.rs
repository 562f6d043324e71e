//! Whether spinning pays on this host right now. The library's pollers (an
//! I/O thread waiting for its next event, a small batch's waiter) yield
//! their core in a loop for a short while instead of sleeping, because on
//! a quiet machine a sleeping thread's wake-up is most of a small round
//! trip. On a busy one that backfires: a yield that finds another runnable
//! thread (a CPU hog, the application's own polling thread) hands it the
//! core for a whole scheduler slice (milliseconds), and a thread that never
//! sleeps loses the wake-up preference the scheduler gives sleepers. So a
//! yield that comes back late (the core was taken) turns spinning off for
//! the whole process for a while, doubling the while (from 10 ms up to
//! 1 s) as long as late yields keep coming; the pollers sleep at once
//! meanwhile, and are woken like any sleeper.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A yield that took longer than this gave the core to another thread.
const LATE: Duration = Duration::from_micros(50);
/// The first back-off, and the longest.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// When spinning is off, process-wide.
struct Gate {
    /// Nanoseconds since `epoch()` until which spinning is off.
    off_until: AtomicU64,
    /// The current back-off, in nanoseconds (0: none yet).
    backoff: AtomicU64,
    /// Late yields seen, for stats.
    late: AtomicU64,
}

static GATE: Gate = Gate::new();

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn nanos(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}

impl Gate {
    const fn new() -> Gate {
        Gate { off_until: AtomicU64::new(0), backoff: AtomicU64::new(0), late: AtomicU64::new(0) }
    }

    fn allowed_at(&self, now: Instant) -> bool {
        nanos(now) >= self.off_until.load(Ordering::Relaxed)
    }

    /// Records a late yield at `now`: spinning off for the next back-off,
    /// doubled while late yields keep coming (one within `MAX_BACKOFF` of
    /// the last back-off's end), the first one again after a quiet spell.
    fn late(&self, now: Instant) {
        self.late.fetch_add(1, Ordering::Relaxed);
        let at = nanos(now);
        let max = MAX_BACKOFF.as_nanos() as u64;
        let previous = self.backoff.load(Ordering::Relaxed);
        let in_a_row = previous > 0 && at < self.off_until.load(Ordering::Relaxed).saturating_add(max);
        let backoff = if in_a_row { (previous * 2).min(max) } else { FIRST_BACKOFF.as_nanos() as u64 };
        self.backoff.store(backoff, Ordering::Relaxed);
        self.off_until.store(at + backoff, Ordering::Relaxed);
    }
}

/// Whether a poller may spin now (no late yield in the current back-off).
pub fn allowed() -> bool {
    GATE.allowed_at(Instant::now())
}

/// Yields the core once, as a spinning poller does; false when the yield
/// came back late (the core was taken): spinning is then off (see the
/// module) and the caller should sleep instead.
pub fn yield_now() -> bool {
    let before = Instant::now();
    std::thread::yield_now();
    let after = Instant::now();
    if after.saturating_duration_since(before) <= LATE {
        return true;
    }
    GATE.late(after);
    false
}

/// Late yields seen by this process so far.
pub fn late_yields() -> u64 {
    GATE.late.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A late yield turns spinning off for the back-off, late ones in a
    /// row double it (up to the bound), and a quiet spell brings the first
    /// one back.
    #[test]
    fn a_late_yield_turns_spinning_off_for_a_growing_while() {
        let g = Gate::new();
        // The clock's origin is fixed at its first use: before `t`, as for
        // every instant the pollers pass (taken after it).
        epoch();
        let t = Instant::now();
        assert!(g.allowed_at(t));
        g.late(t);
        assert!(!g.allowed_at(t + FIRST_BACKOFF - Duration::from_micros(1)));
        assert!(g.allowed_at(t + FIRST_BACKOFF));
        g.late(t + FIRST_BACKOFF);
        assert!(!g.allowed_at(t + 3 * FIRST_BACKOFF - Duration::from_micros(1)), "doubled");
        assert!(g.allowed_at(t + 3 * FIRST_BACKOFF));
        for k in 0..20 {
            g.late(t + Duration::from_millis(40 + k));
        }
        assert_eq!(g.backoff.load(Ordering::Relaxed), MAX_BACKOFF.as_nanos() as u64, "bounded");
        let quiet = t + Duration::from_secs(60);
        g.late(quiet);
        assert_eq!(g.backoff.load(Ordering::Relaxed), FIRST_BACKOFF.as_nanos() as u64);
        assert_eq!(g.late.load(Ordering::Relaxed), 23);
    }
}
