//! Watching an importing process for its exit: a process descriptor
//! (`pidfd_open(2)`) served by the engine's I/O threads. The kernel makes
//! it readable when the process exits, after its memory (and every mapping
//! it held) was released; the watch then runs its callback once, so that a
//! source reclaims the exports of an importer that died while the source
//! runs, without waiting for its close.

use super::export::{process_exited, ExitWatchFn};
use crate::control::identity::{process_start_time, ProcessIdentity};
use crate::transport::reactor::{Flow, Handler, Reactor};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// One watched process.
struct ExitWatch {
    /// Kept open while registered (the reactor polls it).
    _fd: OwnedFd,
    who: ProcessIdentity,
    /// Taken when it runs (once).
    on_exit: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl ExitWatch {
    /// Runs the callback if the process exited; `Done` then.
    fn check(&self) -> Flow {
        if !process_exited(&self.who) {
            return Flow::Idle;
        }
        if let Some(f) = self.on_exit.lock().take() {
            f();
        }
        Flow::Done
    }
}

impl Handler for ExitWatch {
    fn ready(&self, _scratch: &mut [u8]) -> Flow {
        self.check()
    }

    fn tick(&self, _now: Instant) -> Flow {
        // Also covers a readable edge that came before registration.
        self.check()
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
/// kernel makes the descriptor readable then. One poll, no wait.
pub(super) fn pidfd_exited(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call; timeout 0.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// The exit watch of an engine whose I/O threads are `reactor`: a watched
/// process that already exited runs its callback at once; one that cannot
/// be watched (no pidfd) answers `false`.
pub fn watcher(reactor: Weak<Reactor>) -> ExitWatchFn {
    Box::new(move |who: ProcessIdentity, on_exit: Box<dyn Fn() + Send + Sync>| {
        let Some(fd) = open_pidfd(&who) else {
            if process_exited(&who) {
                on_exit();
                return true;
            }
            return false;
        };
        let Some(reactor) = reactor.upgrade() else { return false };
        let raw = fd.as_raw_fd();
        let w = Arc::new(ExitWatch { _fd: fd, who, on_exit: Mutex::new(Some(on_exit)) });
        // The handler owns the descriptor: it stays open until `Done`.
        reactor.register(raw, w).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// Watches `who` with a callback that counts its runs; the count.
    fn watch_counting(watch: &ExitWatchFn, who: ProcessIdentity) -> Arc<AtomicU64> {
        let fired = Arc::new(AtomicU64::new(0));
        let f = fired.clone();
        let on_exit = Box::new(move || {
            f.fetch_add(1, Ordering::SeqCst);
        });
        assert!(watch(who, on_exit), "the watch was refused");
        fired
    }

    #[test]
    fn a_watched_child_runs_the_callback_once_when_it_exits() {
        let reactor = Arc::new(Reactor::new(1, Duration::ZERO));
        let watch = watcher(Arc::downgrade(&reactor));
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let who = ProcessIdentity { pid: child.id(), start_time: process_start_time(child.id()) };
        let fired = watch_counting(&watch, who);
        assert_eq!(fired.load(Ordering::SeqCst), 0, "fired while the child lives");
        child.kill().unwrap();
        // Not reaped yet: a zombie counts as exited.
        let deadline = Instant::now() + Duration::from_secs(30);
        while fired.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        child.wait().unwrap();
        reactor.stop();
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_process_gone_already_runs_the_callback_at_once() {
        let reactor = Arc::new(Reactor::new(1, Duration::ZERO));
        let watch = watcher(Arc::downgrade(&reactor));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let who = ProcessIdentity { pid: child.id(), start_time: process_start_time(child.id()) };
        child.wait().unwrap();
        let fired = watch_counting(&watch, who);
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }
}
