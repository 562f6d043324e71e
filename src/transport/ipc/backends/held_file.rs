//! Whether a memory file's descriptor handed to another process is still
//! held anywhere — open, or mapped — by anyone.
//!
//! An importer's exit alone does not prove that: a child it forked keeps
//! its mappings and descriptors, and a descriptor may have been passed on.
//! What every one of those shares is the open file description the source
//! sent, so each export sends a description of its own, and marks it with
//! an open-file-description lock (`F_OFD_SETLK`, a read lock on one byte
//! far past the end of the file, a byte no other export uses). The lock
//! belongs to the description, not to a process: the kernel drops it only
//! when the description's last reference goes — the last descriptor closed
//! *and* the last mapping unmapped, in every process. The source asks
//! (`F_OFD_GETLK`, through a description of the same file that never
//! leaves it) whether the byte is still locked: one system call, no wait.
//!
//! What it cannot see: a holder that opens the file anew (through
//! `/proc/PID/fd`) gets a description without the mark, and the holder of
//! the marked one may unlock it — both as deliberate as a false close
//! receipt, which the source must trust anyway.

use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// The first byte marks use: far past the end of any memory file.
const MARKS_FROM: u64 = 1 << 62;

/// The next mark of this process.
static NEXT: AtomicU64 = AtomicU64::new(0);

fn lock_of(kind: libc::c_short, mark: u64) -> libc::flock {
    // SAFETY: a plain C struct for which all zeroes is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = (MARKS_FROM + mark) as libc::off_t;
    fl.l_len = 1;
    fl
}

/// Marks `fd`, a description of its own about to be handed out (opened
/// for reading, as every exported description is). Returns the mark.
pub fn mark(fd: &OwnedFd) -> Result<u64> {
    let mark = NEXT.fetch_add(1, Ordering::Relaxed) % (1 << 61);
    let fl = lock_of(libc::F_RDLCK as libc::c_short, mark);
    // SAFETY: fcntl on an open descriptor with a valid flock for the call.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) } != 0 {
        return Err(Error::io("marking an exported descriptor (F_OFD_SETLK)", &std::io::Error::last_os_error()));
    }
    Ok(mark)
}

/// Whether the description marked `mark` is still open or mapped anywhere;
/// `probe` is another description of the same file, one never handed out.
/// A question the kernel does not answer counts as held.
pub fn held(probe: RawFd, mark: u64) -> bool {
    let mut fl = lock_of(libc::F_WRLCK as libc::c_short, mark);
    // SAFETY: fcntl on an open descriptor with a valid flock it fills in.
    if unsafe { libc::fcntl(probe, libc::F_OFD_GETLK, &mut fl) } != 0 {
        return true;
    }
    fl.l_type != libc::F_UNLCK as libc::c_short
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::owners;

    fn reopen(fd: RawFd, flags: libc::c_int) -> OwnedFd {
        let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).unwrap();
        // SAFETY: open with a NUL-terminated path; checked below.
        let raw = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor owned here alone.
        unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) }
    }

    /// The mark outlives its descriptor while a mapping (here, a forked
    /// child's) holds the description, and goes with the last of them.
    #[test]
    fn a_mark_is_held_until_the_last_descriptor_and_mapping_go() {
        let a = owners::allocate_shared_host(4096).unwrap();
        let probe = a.memfd().unwrap();
        let given = reopen(probe, libc::O_RDONLY);
        let m = mark(&given).unwrap();
        let other = mark(&reopen(probe, libc::O_RDWR)).unwrap();
        assert!(held(probe, m));
        assert!(!held(probe, other), "each mark is its own description's");
        let p = owners::map_shared_memory(&given, a.physical_len(), false, "test").unwrap();
        drop(given);
        assert!(held(probe, m), "the mapping holds the description");
        let mut ends = [0; 2];
        // SAFETY: pipe fills two descriptors into a valid array.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // SAFETY: the child only reads the pipe until its writer closes,
        // then leaves with _exit (async-signal-safe calls alone).
        let child = unsafe { libc::fork() };
        if child == 0 {
            let mut b = [0u8; 1];
            // SAFETY: as above; `b` is a valid one-byte buffer.
            unsafe {
                libc::close(ends[1]);
                libc::read(ends[0], b.as_mut_ptr().cast(), 1);
                libc::_exit(0)
            };
        }
        // SAFETY: closing the read end, which this process no longer uses.
        unsafe { libc::close(ends[0]) };
        // SAFETY: unmapping exactly what was mapped above.
        assert_eq!(unsafe { libc::munmap(p as *mut libc::c_void, a.physical_len() as usize) }, 0);
        assert!(held(probe, m), "the forked child's mapping holds it");
        // SAFETY: closing the write end lets the child's read return.
        unsafe { libc::close(ends[1]) };
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(!held(probe, m), "nothing holds it once the child is gone");
        a.free().map_err(|(_, e)| e).unwrap();
    }
}
