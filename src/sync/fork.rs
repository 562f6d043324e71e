//! Whether this process is a fork of the one that made an object, without
//! a system call: a `pthread_atfork` child handler counts the forks this
//! process descends from since the handler was installed.
//!
//! An engine records [`generation`] when it starts; a later call returning
//! another value runs in a forked child, whose copy of the engine shares
//! the parent's sockets and must not use them. (A child made by a raw
//! `clone` system call, which runs no atfork handlers, is not seen; libc's
//! `fork`, and every runtime built on it, is.)

use once_cell::sync::Lazy;
use std::sync::atomic::{AtomicU64, Ordering};

/// Forks since the handler was installed, in this process's line.
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked_child() {
    // Async-signal-safe: one atomic add.
    FORKS.fetch_add(1, Ordering::Relaxed);
}

static INSTALLED: Lazy<()> = Lazy::new(|| {
    // SAFETY: registers a child handler that only adds to an atomic; the
    // prepare and parent handlers are none. The registration cannot be
    // undone, and the handler is a static function, so it outlives it.
    let rc = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    // ENOMEM is the only failure: without the handler a fork is not seen
    // here, so make it loud rather than silently wrong.
    assert_eq!(rc, 0, "pthread_atfork failed ({rc})");
});

/// This process's fork generation: the same value in the process that
/// installed the handler (on first call) until it forks; each child sees
/// one more than its parent saw at the fork.
pub fn generation() -> u64 {
    Lazy::force(&INSTALLED);
    FORKS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_sees_the_next_generation() {
        let before = generation();
        // SAFETY: fork; the child only reads an atomic and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = if generation() == before + 1 { 0 } else { 1 };
            // SAFETY: leaving the child without the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child saw no new generation");
        assert_eq!(generation(), before, "the parent's generation moved");
    }
}
