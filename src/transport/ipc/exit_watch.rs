//! Watching an importing process for its exit: a process descriptor
//! (`pidfd_open(2)`) served by the engine's I/O threads. The kernel makes
//! it readable once every thread of the process has exited (a leader that
//! exited alone leaves it unreadable), after the process's memory (and
//! every mapping it held) was released. The watch runs its callback at
//! once then, and every [`RECHECK`] before and after, until the callback
//! says nothing of the process is left to wait for: so a source reclaims
//! the exports of an importer that died while the source runs, without
//! waiting for its close, and those whose handle something else still
//! held (a child it forked) once that lets go. A process that cannot be
//! given a descriptor (gone already, or a kernel without `pidfd_open`) is
//! watched at the I/O threads' ticks through `/proc`, registered with a
//! descriptor that never fires.

use super::export::{process_exited, ExitWatchFn, OnExit};
use crate::control::identity::{process_start_time, ProcessIdentity};
use crate::control::io::TICK;
use crate::transport::reactor::{Flow, Handler, Reactor};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often the callback runs while something of the process is left.
pub const RECHECK: Duration = Duration::from_secs(1);

/// One watched process.
struct ExitWatch {
    /// Kept open while registered (the reactor polls it): the process's
    /// descriptor, or (`pidfd` false) one that never becomes ready.
    fd: OwnedFd,
    pidfd: bool,
    who: ProcessIdentity,
    on_exit: OnExit,
    /// `None` once the callback said the watch may end; otherwise when it
    /// runs next, and whether the process was seen exited.
    next: Mutex<Option<(Instant, bool)>>,
}

impl ExitWatch {
    fn exited(&self) -> bool {
        if self.pidfd {
            pidfd_exited(&self.fd)
        } else {
            process_exited(&self.who)
        }
    }

    /// Runs the callback when the process has just exited, or when it is
    /// time; `Done` once the callback says nothing is left.
    fn check(&self, now: Instant) -> Flow {
        let mut next = self.next.lock();
        let Some((at, seen)) = *next else { return Flow::Done };
        let exited = seen || self.exited();
        if now < at && exited == seen {
            return Flow::Idle;
        }
        if (self.on_exit)(exited) {
            *next = None;
            return Flow::Done;
        }
        *next = Some((now + RECHECK, exited));
        Flow::Idle
    }
}

impl Handler for ExitWatch {
    fn ready(&self, _scratch: &mut [u8]) -> Flow {
        self.check(Instant::now())
    }

    fn tick(&self, now: Instant) -> (Flow, Option<Instant>) {
        // Also covers a readable edge that came before registration.
        let flow = self.check(now);
        let next = (*self.next.lock()).map(|(at, _)| at);
        // Without a process descriptor the exit is seen only by looking:
        // at every tick until then.
        (flow, next.map(|at| if self.pidfd { at } else { at.min(now + TICK) }))
    }
}

/// A process descriptor for `who`, checked to be that process (not a
/// later one that reused its pid). `None`: the kernel has no pidfd_open,
/// or the process is gone already.
pub(super) fn open_pidfd(who: &ProcessIdentity) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new
    // descriptor or -1; nothing is read from our memory.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, who.pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just returned by the kernel and is owned here alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // Opened after the identity was recorded: if the pid was reused in
    // between, the start time tells.
    (process_start_time(who.pid) == who.start_time).then_some(fd)
}

/// Whether the process behind `fd` (from [`open_pidfd`]) has exited: the
/// kernel makes the descriptor readable once all its threads have. One
/// poll, no wait.
pub(super) fn pidfd_exited(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call; timeout 0.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// A descriptor that never becomes ready (an eventfd nobody writes): what
/// a watch without a process descriptor registers to get its ticks.
fn never_ready() -> Option<OwnedFd> {
    // SAFETY: eventfd takes an initial value and flags, returns a new
    // descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    // SAFETY: a fresh descriptor owned here alone.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The exit watch of an engine whose I/O threads are `reactor`. `false`
/// when no watch could be registered (the engine is stopping).
pub fn watcher(reactor: Weak<Reactor>) -> ExitWatchFn {
    Box::new(move |who: ProcessIdentity, on_exit: OnExit| {
        let (fd, pidfd) = match open_pidfd(&who) {
            Some(fd) => (fd, true),
            None => match never_ready() {
                Some(fd) => (fd, false),
                None => return false,
            },
        };
        let Some(reactor) = reactor.upgrade() else { return false };
        let raw = fd.as_raw_fd();
        let first = (Instant::now() + RECHECK, false);
        let w = Arc::new(ExitWatch { fd, pidfd, who, on_exit, next: Mutex::new(Some(first)) });
        // The handler owns the descriptor: it stays open until `Done`.
        reactor.register(raw, w).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Watches `who` with a callback that counts its runs after the exit
    /// and answers `true` (nothing left) from its `done_at`-th on; the
    /// count. A run before the exit answers `false` and counts apart.
    fn watch_counting(watch: &ExitWatchFn, who: ProcessIdentity, done_at: u64) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
        let (fired, early) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (f, e) = (fired.clone(), early.clone());
        let on_exit = Box::new(move |exited| match exited {
            true => f.fetch_add(1, Ordering::SeqCst) + 1 >= done_at,
            false => {
                e.fetch_add(1, Ordering::SeqCst);
                false
            }
        });
        assert!(watch(who, on_exit), "the watch was refused");
        (fired, early)
    }

    fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn identity(child: &std::process::Child) -> ProcessIdentity {
        ProcessIdentity { pid: child.id(), start_time: process_start_time(child.id()) }
    }

    #[test]
    fn a_watched_child_runs_the_callback_once_when_it_exits() {
        let reactor = Arc::new(Reactor::new(1, Duration::ZERO));
        let watch = watcher(Arc::downgrade(&reactor));
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let (fired, early) = watch_counting(&watch, identity(&child), 1);
        // Asked again while it lives (a lingering export may end then).
        until("the callback ran before the exit", || early.load(Ordering::SeqCst) >= 1);
        assert_eq!(fired.load(Ordering::SeqCst), 0, "fired while the child lives");
        child.kill().unwrap();
        // Not reaped yet: a zombie whose every thread exited counts.
        until("the callback ran", || fired.load(Ordering::SeqCst) == 1);
        child.wait().unwrap();
        reactor.stop();
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_process_gone_already_runs_the_callback_at_the_next_tick() {
        let reactor = Arc::new(Reactor::new(1, Duration::ZERO));
        let watch = watcher(Arc::downgrade(&reactor));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let who = identity(&child);
        child.wait().unwrap();
        let (fired, _) = watch_counting(&watch, who, 1);
        until("the callback ran", || fired.load(Ordering::SeqCst) == 1);
        reactor.stop();
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }

    /// A callback that says something still holds what the process was
    /// sent is asked again, until it says nothing is left.
    #[test]
    fn the_callback_runs_again_until_nothing_is_left() {
        let reactor = Arc::new(Reactor::new(1, Duration::ZERO));
        let watch = watcher(Arc::downgrade(&reactor));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let who = identity(&child);
        child.wait().unwrap();
        let (fired, _) = watch_counting(&watch, who, 3);
        until("the callback ran three times", || fired.load(Ordering::SeqCst) == 3);
        reactor.stop();
        assert_eq!(fired.load(Ordering::SeqCst), 3);
    }

    /// Guards `process_start_time(who.pid) == who.start_time` in
    /// `open_pidfd`: a live process whose start time is not the
    /// identity's (its pid reused) gets no process descriptor; the right
    /// start time gets one.
    #[test]
    fn a_pidfd_is_opened_only_for_the_process_the_identity_names() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let who = identity(&child);
        assert!(open_pidfd(&who).is_some(), "no descriptor for the live child");
        let reused = ProcessIdentity { start_time: who.start_time + 1, ..who };
        assert!(open_pidfd(&reused).is_none(), "a descriptor for another process under the pid");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The same guard as the engine reaches it: an importer whose pid now
    /// names another (live) process is reported exited at the watch's
    /// first tick, not watched until that process exits.
    #[test]
    fn a_watched_identity_whose_pid_was_reused_runs_the_callback_as_exited_at_once() {
        let reactor = Arc::new(Reactor::new(1, Duration::ZERO));
        let watch = watcher(Arc::downgrade(&reactor));
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let who = identity(&child);
        let (fired, early) = watch_counting(&watch, ProcessIdentity { start_time: who.start_time + 1, ..who }, 1);
        until("the callback ran", || fired.load(Ordering::SeqCst) + early.load(Ordering::SeqCst) >= 1);
        reactor.stop();
        assert_eq!((fired.load(Ordering::SeqCst), early.load(Ordering::SeqCst)), (1, 0), "asked while it lives");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
