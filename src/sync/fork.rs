//! Which process this is, without a system call: whether code runs in a
//! child forked from the process that made an object.
//!
//! The process id is kept in one private page marked `MADV_WIPEONFORK`:
//! the kernel hands every child a zeroed copy of it, however the child was
//! made (`fork`, glibc's `_Fork`, which runs no `pthread_atfork` handlers,
//! or a raw `clone` without `CLONE_VM`). So [`pid`] is one load in the
//! process that filled the page, and one `getpid` the first time a child
//! asks. On a kernel without `MADV_WIPEONFORK` (before Linux 4.14) every
//! call is a `getpid`.

use once_cell::sync::Lazy;
use std::sync::atomic::{AtomicU64, Ordering};

/// The page's first word: this process's id once asked, 0 in a child
/// that has not asked yet (`None`: no such page, ask the kernel each time).
static KNOWN: Lazy<Option<&'static AtomicU64>> = Lazy::new(|| {
    const PAGE: usize = 4096;
    // SAFETY: a fresh private anonymous mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: advice on the mapping made above.
    if unsafe { libc::madvise(p, PAGE, libc::MADV_WIPEONFORK) } != 0 {
        // SAFETY: unmapping the mapping made above, never referenced.
        unsafe { libc::munmap(p, PAGE) };
        return None;
    }
    // SAFETY: the page is mapped for the rest of the process (never
    // unmapped), page-aligned, zeroed; an AtomicU64 is valid for any bits.
    Some(unsafe { &*(p as *const AtomicU64) })
});

/// The id of the process running this (`getpid`), read from the
/// wipe-on-fork page once known.
pub fn pid() -> u32 {
    let Some(word) = *KNOWN else {
        return std::process::id();
    };
    match word.load(Ordering::Relaxed) {
        0 => {
            let me = std::process::id();
            word.store(me as u64, Ordering::Relaxed);
            me
        }
        known => known as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child_exits_with(pid: libc::pid_t) -> i32 {
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child did not exit ({status:#x})");
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn a_child_knows_it_is_not_its_parent() {
        let parent = pid();
        assert_eq!(parent, std::process::id());
        // SAFETY: fork; the child only reads the page, calls getpid and exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let ok = pid() == std::process::id() && pid() != parent;
            // SAFETY: leaving the child without the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert_eq!(child_exits_with(child), 0, "a forked child saw its parent's id");
        assert_eq!(pid(), parent, "the parent's id moved");
    }

    /// A raw clone runs no atfork handler and no libc fork bookkeeping:
    /// the wiped page is what tells the child (glibc's `_Fork` is the same
    /// case).
    #[test]
    fn a_child_made_without_atfork_handlers_knows_it_too() {
        let parent = pid();
        // SAFETY: clone with only SIGCHLD is a fork without libc's help; the
        // child only reads the page, makes plain system calls and exits.
        let child = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0) };
        if child == 0 {
            // SAFETY: getpid and _exit are plain system calls.
            let ok =
                unsafe { pid() as libc::pid_t == libc::syscall(libc::SYS_getpid) as libc::pid_t } && pid() != parent;
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_exit_group, if ok { 0 } else { 1 }) };
        }
        assert_eq!(child_exits_with(child as libc::pid_t), 0, "a raw clone child saw its parent's id");
    }
}
