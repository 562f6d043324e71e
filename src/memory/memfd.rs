//! Library memory files: a memfd made sealable and sized, its seals added
//! and checked, and its shared mappings (aligned and advised for huge pages
//! where the length allows), with the kernel's huge-page setting for shared
//! memory. No record of who owns what: that is `owners.rs`.

use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Physical rounding of shareable allocations (shared host memory and CUDA
/// IPC memory): 2 MiB.
pub const SHARED_ROUNDING: u64 = 2 * 1024 * 1024;

/// `len` rounded up to [`SHARED_ROUNDING`] (and small enough to map), or
/// `InvalidArgument`.
pub fn shared_physical(len: u64) -> Result<u64> {
    len.checked_add(SHARED_ROUNDING - 1)
        .map(|x| x / SHARED_ROUNDING * SHARED_ROUNDING)
        .filter(|p| *p <= isize::MAX as u64)
        .ok_or_else(|| Error::InvalidArgument(format!("length {len} is too large")))
}

/// The seals every library memory file carries (and every SHM import
/// requires): its size is fixed for good, so nobody holding the fd, the
/// owner included, can shrink or grow it and make a mapping fault. The
/// library also adds `F_SEAL_SEAL`, so that no further seal can be added.
pub const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// A new memory file of `len` zeroed bytes that can be sealed
/// (close-on-exec); `what` names it in errors.
pub fn sealable_memfd(name: &std::ffi::CStr, len: u64, what: &str) -> Result<OwnedFd> {
    // SAFETY: name is NUL-terminated; memfd_create has no other inputs.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(Error::io(&format!("memfd_create ({what})"), &std::io::Error::last_os_error()));
    }
    // SAFETY: raw is a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size = libc::off_t::try_from(len).map_err(|_| Error::InvalidArgument(format!("{what}: {len} bytes")))?;
    // SAFETY: fd is ours; size fits off_t (checked above).
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::ResourceExhausted(format!("cannot size {what} to {len} bytes: {e}")));
    }
    Ok(fd)
}

/// Adds `seals` to a memory file we made; `what` names it in errors.
pub fn add_seals(fd: &OwnedFd, seals: libc::c_int, what: &str) -> Result<()> {
    // SAFETY: fcntl on an fd we own; adds seals, no memory effects.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(Error::io(&format!("sealing {what}"), &std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether a received descriptor is a memory file of exactly `len` bytes
/// carrying at least `seals`.
pub fn is_sealed_memfd(fd: &OwnedFd, seals: libc::c_int, len: u64) -> bool {
    // SAFETY: fcntl reads the seals of an fd we own.
    let have = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    // SAFETY: fstat into a zeroed buffer, on an fd we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let stat_ok = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0;
    have >= 0 && have & seals == seals && stat_ok && st.st_size as u64 == len
}

/// Maps `len` bytes of a memory file shared, read/write or read-only (the
/// owner's allocation, or an SHM import of it). The fd may be closed
/// afterwards.
pub fn map_shared(fd: &impl AsRawFd, len: u64, writable: bool, what: &str) -> Result<u64> {
    // SAFETY: no fixed address: the kernel picks a free range.
    unsafe { mmap_file(fd, None, len, writable) }.map_err(|e| map_failed(len, what, e))
}

/// One shared mapping of `len` bytes of an open file, anywhere, or over
/// `[at, at+len)` (MAP_FIXED).
///
/// # Safety
/// With `at`, the range `[at, at+len)` is the caller's own reservation,
/// which nothing else uses: the mapping replaces whatever is there.
unsafe fn mmap_file(fd: &impl AsRawFd, at: Option<u64>, len: u64, writable: bool) -> std::io::Result<u64> {
    let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
    let (addr, flags) = match at {
        Some(a) => (a as *mut libc::c_void, libc::MAP_SHARED | libc::MAP_FIXED),
        None => (std::ptr::null_mut(), libc::MAP_SHARED),
    };
    // SAFETY: mapping `len` bytes of an open file; the result is checked;
    // with MAP_FIXED the range is the caller's (this function's contract).
    let p = unsafe { libc::mmap(addr, len as usize, prot, flags, fd.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p as u64)
}

/// What a failed mapping of `len` bytes of `what` reports.
fn map_failed(len: u64, what: &str, e: std::io::Error) -> Error {
    Error::ResourceExhausted(format!("cannot map {len} bytes of {what}: {e}"))
}

/// Maps `len` bytes of a library memory file as [`map_shared`] does, for
/// the memory itself (an allocation, or a peer's SHM import of it): when
/// `len` is a multiple of [`SHARED_ROUNDING`], at an address aligned to it
/// and advised for transparent huge pages. Where the kernel backs shared
/// memory with huge pages (`shmem_enabled` set to `advise`, `within_size`
/// or `always`) a first touch then maps 2 MiB at once, in the owner and in
/// every importer, instead of one fault per 4 KiB page: a fresh import of
/// a large pool read at scattered blocks pays one fault per 2 MiB. Where it
/// does not (`never`), the advice changes nothing.
pub fn map_shared_memory(fd: &impl AsRawFd, len: u64, writable: bool, what: &str) -> Result<u64> {
    if len == 0 || len % SHARED_ROUNDING != 0 {
        return map_shared(fd, len, writable, what);
    }
    let fail = |e: std::io::Error| map_failed(len, what, e);
    // An aligned place: reserve one alignment more than needed, map the
    // file over its aligned part, and give back the slack on both sides.
    let span = len.checked_add(SHARED_ROUNDING).ok_or_else(|| fail(std::io::Error::from_raw_os_error(libc::ENOMEM)))?;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // SAFETY: a fresh inaccessible reservation; the result is checked.
    let r = unsafe { libc::mmap(std::ptr::null_mut(), span as usize, libc::PROT_NONE, flags, -1, 0) };
    if r == libc::MAP_FAILED {
        return Err(fail(std::io::Error::last_os_error()));
    }
    let start = r as u64;
    let at = start.next_multiple_of(SHARED_ROUNDING);
    // SAFETY: [at, at+len) lies inside our own reservation (span is len
    // plus one alignment), so MAP_FIXED replaces nothing but it.
    if let Err(e) = unsafe { mmap_file(fd, Some(at), len, writable) } {
        // SAFETY: the whole reservation is ours and nothing else uses it.
        unsafe { libc::munmap(r, span as usize) };
        return Err(fail(e));
    }
    // SAFETY: the slack before and after the file's mapping is the rest of
    // our own reservation.
    unsafe {
        if at > start {
            libc::munmap(r, (at - start) as usize);
        }
        if at + len < start + span {
            libc::munmap((at + len) as *mut libc::c_void, (start + span - at - len) as usize);
        }
    }
    // SAFETY: advice on our own mapping; a kernel without transparent huge
    // pages refuses it, and that changes nothing (the mapping stands).
    unsafe { libc::madvise(at as *mut libc::c_void, len as usize, libc::MADV_HUGEPAGE) };
    Ok(at)
}

/// The kernel's setting for huge pages in shared memory
/// (`/sys/kernel/mm/transparent_hugepage/shmem_enabled`, the bracketed
/// word: `never`, `advise`, `within_size`, `always`, `deny`, `force`), or
/// None where the kernel has no transparent huge pages.
pub fn shmem_huge_setting() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").ok()?;
    selected_word(&text).map(str::to_owned)
}

/// The bracketed word of a sysfs choice list (`always [never] advise`).
fn selected_word(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let len = text[start..].find(']')?;
    Some(&text[start..start + len])
}

/// Whether [`map_shared_memory`]'s advice can take effect: the kernel backs
/// advised shared memory with huge pages.
pub fn shmem_huge_pages_on(setting: &str) -> bool {
    matches!(setting, "advise" | "within_size" | "always" | "force")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selected_word_of_a_sysfs_choice_is_read() {
        assert_eq!(selected_word("always within_size advise [never] deny force\n"), Some("never"));
        assert_eq!(selected_word("[advise] never"), Some("advise"));
        assert_eq!(selected_word("always never"), None);
        assert!(shmem_huge_pages_on("advise") && shmem_huge_pages_on("within_size"));
        assert!(!shmem_huge_pages_on("never") && !shmem_huge_pages_on("deny"));
    }
}
