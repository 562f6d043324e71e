//! Whether a source process still lives, read with one load instead of a
//! system call.
//!
//! A cached import copies through the source's grant board only while the
//! source can still revoke what its words grant; a source that died cannot.
//! The requester used to ask the kernel whether the source had hung up its
//! channel (one `poll` per group, the largest cost of a small SHM read after
//! the copy itself). Instead the source keeps one *liveness word* in a page
//! it shares read-only with its requesters, and the kernel itself clears it:
//!
//! - A dedicated thread of the source process (the keeper, one per process:
//!   [`process_page`]) writes its thread id in
//!   the word and registers the word on its *robust futex list*
//!   (`set_robust_list(2)`, the kernel ABI of robust mutexes). When that
//!   thread dies — the process exits, is killed, or execs — the kernel, as
//!   part of the thread's exit and before the process's descriptors are
//!   closed, marks the word `FUTEX_OWNER_DIED` and clears the id.
//! - An [`AlivePage`] dropped cleanly has its keeper write 0 and
//!   unregister the word before it exits (the process's page is never
//!   dropped: it lives as long as the process).
//! - So a requester that sees the source's channel hang up, or that reaped
//!   the process, finds the word already dead; and a live word means the
//!   keeper (hence the process) was alive when it was read — exactly what
//!   the `poll` told, without entering the kernel.
//!
//! The page is a memory file sealed against writes through any new mapping
//! (`F_SEAL_FUTURE_WRITE`) and against resizing: a requester maps it
//! read-only and cannot make another requester's view lie. The robust list
//! entry lives in the keeper's private memory, so nothing a requester can
//! touch steers where the kernel writes.

use crate::error::{Error, Result};
use crate::memory::owners;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::mpsc;

/// The page's size.
const PAGE_BYTES: usize = 4096;
/// The kernel's bit for a robust futex whose owner died.
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
/// The owner's thread id bits of a robust futex word.
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;
/// Seals a requester checks: no resizing, no new writable mapping.
const READ_ONLY_SEALS: libc::c_int = owners::SIZE_SEALS | libc::F_SEAL_FUTURE_WRITE;

/// Whether a liveness word names a live keeper.
fn lives(word: u32) -> bool {
    word & FUTEX_TID_MASK != 0 && word & FUTEX_OWNER_DIED == 0
}

/// A mapped page (source: writable; requester: read-only).
struct Page(*mut AtomicU32);

// SAFETY: the page is only accessed through an atomic; it stays mapped for
// the value's life.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

impl Page {
    fn word(&self) -> &AtomicU32 {
        // SAFETY: the mapping is page-aligned, PAGE_BYTES long and alive
        // while self is; an AtomicU32 is valid for any bits.
        unsafe { &*self.0 }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the page mapped; no reference to the
        // word outlives the Page (and the keeper is gone: see AlivePage).
        unsafe { libc::munmap(self.0.cast(), PAGE_BYTES) };
    }
}

/// The kernel's robust list head (`struct robust_list_head`).
#[repr(C)]
struct RobustHead {
    next: *const RobustEntry,
    futex_offset: libc::c_long,
    list_op_pending: *const RobustEntry,
}

/// One entry of a robust list (`struct robust_list`).
#[repr(C)]
struct RobustEntry {
    next: *const RobustEntry,
}

/// Source: the liveness page and its keeper thread.
pub struct AlivePage {
    fd: OwnedFd,
    page: std::sync::Arc<Page>,
    /// Dropped to tell the keeper to stop.
    stop: Option<mpsc::Sender<()>>,
    keeper: Option<std::thread::JoinHandle<()>>,
    /// The process that made it: a forked child's copy has no keeper to
    /// stop.
    owner: u32,
}

impl AlivePage {
    /// Source: a new page whose word lives while this value does, or until
    /// the process dies.
    pub fn create() -> Result<AlivePage> {
        let owner = crate::sync::fork::pid();
        let fd = owners::sealable_memfd(c"orbite-alive", PAGE_BYTES as u64, "the liveness page")?;
        // Mapped writable before the seal forbids any new writable mapping.
        let p = owners::map_shared(&fd, PAGE_BYTES as u64, true, "the liveness page")?;
        let page = std::sync::Arc::new(Page(p as *mut AtomicU32));
        owners::add_seals(&fd, READ_ONLY_SEALS | libc::F_SEAL_SEAL, "the liveness page")?;
        let (stop, stopped) = mpsc::channel::<()>();
        let (ready_tx, ready) = mpsc::channel::<bool>();
        let kept = page.clone();
        let keeper = std::thread::Builder::new()
            .name("orbite-alive".into())
            .spawn(move || keep(&kept, &ready_tx, &stopped))
            .map_err(|e| Error::io("starting the liveness keeper", &e))?;
        match ready.recv() {
            Ok(true) => Ok(AlivePage { fd, page, stop: Some(stop), keeper: Some(keeper), owner }),
            _ => {
                drop(stop);
                let _ = keeper.join();
                Err(Error::Unavailable("the kernel refused the liveness word's robust list".into()))
            }
        }
    }

    /// The page's memory file (sent to requesters with the Welcome).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Whether the word says the keeper lives (always, while this value does).
    pub fn lives(&self) -> bool {
        lives(self.page.word().load(SeqCst))
    }
}

impl Drop for AlivePage {
    fn drop(&mut self) {
        if self.owner != crate::sync::fork::pid() {
            // A forked child's copy: the keeper is the parent's thread.
            std::mem::forget(self.keeper.take());
            std::mem::forget(self.stop.take());
            return;
        }
        drop(self.stop.take());
        if let Some(k) = self.keeper.take() {
            let _ = k.join();
        }
    }
}

/// The keeper: registers the word on this thread's robust list, says so on
/// `ready`, waits for `stop` to hang up, then clears and unregisters it.
fn keep(page: &Page, ready: &mpsc::Sender<bool>, stop: &mpsc::Receiver<()>) {
    let word = page.word();
    // The list is circular: the head leads to the one entry, which leads
    // back to the head (whose first field is its list link).
    let entry = Box::into_raw(Box::new(RobustEntry { next: std::ptr::null() }));
    let head = Box::into_raw(Box::new(RobustHead {
        next: entry,
        futex_offset: (word as *const AtomicU32 as libc::c_long) - (entry as libc::c_long),
        list_op_pending: std::ptr::null(),
    }));
    // SAFETY: entry came from Box::into_raw above and is not shared yet.
    unsafe { (*entry).next = head.cast() };
    let mut old_head: *mut libc::c_void = std::ptr::null_mut();
    let mut old_len: libc::size_t = 0;
    // SAFETY: reads this thread's (pid 0) registered head into locals.
    let saved = unsafe { libc::syscall(libc::SYS_get_robust_list, 0, &mut old_head, &mut old_len) } == 0;
    // SAFETY: gettid has no memory effects.
    let tid = unsafe { libc::gettid() } as u32;
    word.store(tid, SeqCst);
    let head_bytes = std::mem::size_of::<RobustHead>() as libc::size_t;
    // SAFETY: the head and entry stay alive, unmoved, until the list is
    // unregistered below; the word stays mapped (the Page is held).
    let set = unsafe { libc::syscall(libc::SYS_set_robust_list, head, head_bytes) } == 0;
    if !set {
        word.store(0, SeqCst);
        let _ = ready.send(false);
        // SAFETY: both came from Box::into_raw and the kernel never had them.
        unsafe { drop((Box::from_raw(head), Box::from_raw(entry))) };
        return;
    }
    let _ = ready.send(true);
    // Until the owner drops its sender (or the process dies here).
    let _ = stop.recv();
    word.store(0, SeqCst);
    // Give the thread its former list back (glibc's), or none.
    let (restore, len) = match saved {
        true => (old_head as *const libc::c_void, old_len),
        false => (std::ptr::null(), head_bytes),
    };
    // SAFETY: the saved head is the one this thread had; a null head with
    // the kernel's size unregisters ours. Either way the kernel no longer
    // refers to ours, which is then freed.
    unsafe {
        libc::syscall(libc::SYS_set_robust_list, restore, len);
        drop((Box::from_raw(head), Box::from_raw(entry)));
    }
}

/// The process's page, made on first use and kept until the process exits
/// (one keeper thread per process, whatever the number of engines): every
/// engine of the process sends it with its boards. A forked child makes its
/// own (the page it inherited names the parent's keeper), however it was
/// forked ([`crate::sync::fork::pid`]). `None` when the page cannot be
/// made; the next call tries again.
pub fn process_page() -> Option<std::sync::Arc<AlivePage>> {
    static PAGE: parking_lot::Mutex<Option<(u32, std::sync::Arc<AlivePage>)>> = parking_lot::const_mutex(None);
    let me = crate::sync::fork::pid();
    let current = |held: &Option<(u32, std::sync::Arc<AlivePage>)>| {
        held.as_ref().filter(|(owner, _)| *owner == me).map(|(_, page)| page.clone())
    };
    if let Some(page) = current(&PAGE.lock()) {
        return Some(page);
    }
    // Made without the lock held (it starts and waits for a thread), so
    // that a fork from another thread meanwhile does not leave the child a
    // held lock; two threads racing here keep the first page.
    let made = std::sync::Arc::new(AlivePage::create().ok()?);
    let mut held = PAGE.lock();
    if let Some(page) = current(&held) {
        drop(held);
        drop(made);
        return Some(page);
    }
    // A forked child's copy of the parent's page: left alone (its drop
    // would do nothing anyway, see AlivePage's drop).
    std::mem::forget(held.replace((me, made.clone())));
    Some(made)
}

/// Requester: a read-only view of a source's liveness page.
pub struct AliveView {
    page: Page,
}

impl AliveView {
    /// Maps a page received from the source, after checking it is a memory
    /// file of the page's size that nobody can resize or map writable again.
    pub fn map(fd: OwnedFd) -> Result<AliveView> {
        if !owners::is_sealed_memfd(&fd, READ_ONLY_SEALS, PAGE_BYTES as u64) {
            return Err(Error::Protocol("the liveness page is not a sealed read-only memory file of one page".into()));
        }
        let p = owners::map_shared(&fd, PAGE_BYTES as u64, false, "the liveness page")?;
        Ok(AliveView { page: Page(p as *mut AtomicU32) })
    }

    /// Whether the source's keeper lived when the word was read.
    pub fn source_lives(&self) -> bool {
        lives(self.page.word().load(SeqCst))
    }
}

/// Test helpers: a liveness page owned by another process.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::control::frame::MsgKind;
    use crate::control::io::no_abort;
    use crate::transport::ipc::channel::Channel;
    use std::os::fd::AsRawFd;

    /// A child process that made a page and sent it back: its pid and the
    /// parent's view of the page.
    pub(crate) fn page_of_a_child() -> (libc::pid_t, AliveView) {
        let (here, there) = std::os::unix::net::UnixStream::pair().unwrap();
        // SAFETY: fork; the child only makes the page, sends it, and waits
        // to be killed (it never returns into the test harness).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let sent = AlivePage::create().ok().and_then(|a| {
                let mut ch = Channel::from_stream(there).ok()?;
                ch.send(MsgKind::IpcWelcome, b"", &[a.fd().as_raw_fd()], &mut no_abort).ok()?;
                Some(a)
            });
            // SAFETY: _exit when the page could not be sent; otherwise
            // pause until killed.
            unsafe {
                if sent.is_none() {
                    libc::_exit(1);
                }
                loop {
                    libc::pause();
                }
            }
        }
        let mut ch = Channel::from_stream(here).unwrap();
        let f = ch.recv(&mut no_abort).unwrap();
        (pid, AliveView::map(f.fd.expect("the page")).unwrap())
    }

    pub(crate) fn kill_and_reap(pid: libc::pid_t) {
        // SAFETY: killing and reaping our own child.
        unsafe {
            assert_eq!(libc::kill(pid, libc::SIGKILL), 0);
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{kill_and_reap, page_of_a_child};
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    fn view_of(a: &AlivePage) -> AliveView {
        // SAFETY: dup of an fd we hold.
        let dup = unsafe { libc::fcntl(a.fd().as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        assert!(dup >= 0);
        // SAFETY: a fresh fd we own.
        AliveView::map(unsafe { OwnedFd::from_raw_fd(dup) }).unwrap()
    }

    #[test]
    fn the_word_lives_with_its_page_and_dies_with_it() {
        let a = AlivePage::create().unwrap();
        let v = view_of(&a);
        assert!(a.lives() && v.source_lives());
        drop(a);
        assert!(!v.source_lives(), "a page dropped cleanly leaves a dead word");
    }

    #[test]
    fn a_requester_cannot_map_the_page_writable() {
        let a = AlivePage::create().unwrap();
        // SAFETY: a writable shared mapping attempt of our own fd; a success
        // is unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                a.fd().as_raw_fd(),
                0,
            )
        };
        assert_eq!(p, libc::MAP_FAILED, "the seal forbids a writable mapping");
        // A read-only one cannot be made writable either.
        let v = view_of(&a);
        // SAFETY: mprotect of our own read-only mapping; it must fail.
        let rc = unsafe { libc::mprotect(v.page.0.cast(), PAGE_BYTES, libc::PROT_READ | libc::PROT_WRITE) };
        assert_ne!(rc, 0, "mprotect to writable must be refused");
        assert!(v.source_lives());
    }

    #[test]
    fn an_unsealed_file_is_refused() {
        // SAFETY: a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh fd we own; sized to one page.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE_BYTES as libc::off_t) }, 0);
        assert!(AliveView::map(fd).is_err());
    }

    /// The kernel clears the word when the keeper's process is killed,
    /// before its parent can reap it.
    #[test]
    fn the_kernel_marks_the_word_when_the_process_dies() {
        let (pid, v) = page_of_a_child();
        assert!(v.source_lives());
        kill_and_reap(pid);
        assert!(!v.source_lives(), "a reaped source's word is dead");
        assert_ne!(v.page.word().load(SeqCst) & FUTEX_OWNER_DIED, 0, "the kernel marked it");
    }

    /// Threads racing to make a process's first page all get one page.
    #[test]
    fn racing_first_callers_share_one_page() {
        // SAFETY: fork (a fresh process has no page yet); the child races
        // two threads to make it, checks and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let start = std::sync::Arc::new(std::sync::Barrier::new(2));
            let racers: Vec<_> = (0..2)
                .map(|_| {
                    let start = start.clone();
                    std::thread::spawn(move || {
                        start.wait();
                        process_page()
                    })
                })
                .collect();
            let pages: Vec<_> = racers.into_iter().filter_map(|r| r.join().ok().flatten()).collect();
            let one = pages.len() == 2 && std::sync::Arc::ptr_eq(&pages[0], &pages[1]) && pages[0].lives();
            // SAFETY: leaving the child without the parent's destructors.
            unsafe { libc::_exit(if one { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "racers got different pages");
    }

    #[test]
    fn one_page_per_process_and_a_forked_child_makes_its_own() {
        let a = process_page().unwrap();
        assert!(std::sync::Arc::ptr_eq(&a, &process_page().unwrap()), "engines of a process share one page");
        // SAFETY: fork; the child asks for its page, checks it and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let own = process_page().is_some_and(|c| !std::sync::Arc::ptr_eq(&c, &a) && c.lives());
            // SAFETY: leaving the child without the parent's destructors.
            unsafe { libc::_exit(if own { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child did not make its own page");
        assert!(a.lives(), "the parent's page outlives the child");
    }
}
