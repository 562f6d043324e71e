//! The panic boundary, the thread-local last error and argument helpers.

use super::types::*;
use crate::{Error, Result, Status};
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error.
pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Pointer to this thread's last error text (valid until the next failing
/// call on this thread).
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

/// Runs `f` inside the panic boundary and maps its outcome to a status,
/// recording failures as the last error.
pub(crate) fn guard(f: impl FnOnce() -> Result<()>) -> orbite_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Status::Ok as u32,
        Ok(Err(e)) => fail(e),
        Err(p) => {
            set_last_error(&format!("internal panic (a bug in liborbite): {}", panic_text(&*p)));
            Status::Panic as u32
        }
    }
}

/// Like [`guard`] for calls whose status is computed (poll/wait): `f`
/// returns the status directly, and failures still set the last error.
pub(crate) fn guard_status(f: impl FnOnce() -> Result<Status>) -> orbite_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(s)) => s as u32,
        Ok(Err(e)) => fail(e),
        Err(p) => {
            set_last_error(&format!("internal panic (a bug in liborbite): {}", panic_text(&*p)));
            Status::Panic as u32
        }
    }
}

/// Runs `f` (which returns a plain value) inside the panic boundary; a panic
/// gives `fallback`.
pub(crate) fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

fn fail(e: Error) -> orbite_status {
    set_last_error(&e.to_string());
    e.status() as u32
}

/// Refuses a pointer argument `p` (named `name`) not aligned as its
/// type: Rust reads it as a reference or a slice, which must be aligned
/// (C callers that pack structs into a byte buffer get a status, not
/// undefined behaviour).
pub(crate) fn aligned<T>(p: *const T, name: &str) -> Result<()> {
    if p.is_aligned() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "{name} (0x{:x}) is not aligned to {} bytes, as its element type must be",
        p as usize,
        std::mem::align_of::<T>()
    )))
}

/// A required pointer argument.
pub(crate) fn need<'a, T>(p: *const T, name: &str) -> Result<&'a T> {
    if !p.is_null() {
        aligned(p, name)?;
    }
    // SAFETY: the caller passes a pointer from C; NULL and alignment are
    // checked here and a non-NULL pointer must point to a valid T per the
    // C contract.
    unsafe { p.as_ref() }.ok_or_else(|| Error::NullArgument(format!("{name} is NULL")))
}

/// A required mutable pointer argument.
pub(crate) fn need_mut<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T> {
    if !p.is_null() {
        aligned(p.cast_const(), name)?;
    }
    // SAFETY: as in `need`; the C contract gives exclusive use of *p for the call.
    unsafe { p.as_mut() }.ok_or_else(|| Error::NullArgument(format!("{name} is NULL")))
}

/// A required NUL-terminated UTF-8 string.
pub(crate) fn need_str<'a>(p: *const c_char, name: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::NullArgument(format!("{name} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated per the C contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| Error::InvalidArgument(format!("{name} is not valid UTF-8")))
}

/// Milliseconds, 0 = engine default.
pub(crate) fn timeout_opt(ms: u32) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(ms as u64))
}

/// Writes `text` to a caller buffer following the text out-parameter rule:
/// on OK the NUL-terminated text and its length; on BUFFER_TOO_SMALL only
/// the length needed.
pub(crate) fn write_text(text: &str, buf: *mut c_char, cap: usize, out_len: *mut usize) -> Result<()> {
    let out_len = need_mut(out_len, "out_len")?;
    let n = text.len();
    if cap < n + 1 {
        *out_len = n;
        return Err(Error::BufferTooSmall(format!("needs {} bytes including the NUL, cap is {cap}", n + 1)));
    }
    if buf.is_null() {
        return Err(Error::NullArgument("buf is NULL".into()));
    }
    // SAFETY: buf is non-NULL and the caller promises `cap` writable bytes;
    // n + 1 <= cap was checked above.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    *out_len = n;
    Ok(())
}

/// What the C entry points' tests read back after a call: this thread's
/// last error, and the check that a call was refused with exactly an
/// error's status and whole text (one copy for every `ffi` test module).
#[cfg(test)]
pub(crate) mod said {
    /// This thread's last error, as `orbite_last_error` gives it.
    pub(crate) fn said() -> String {
        // SAFETY: last_error_ptr points at this thread's live NUL-terminated
        // message, unchanged until the next set_last_error on this thread.
        unsafe { std::ffi::CStr::from_ptr(super::last_error_ptr()) }.to_str().unwrap().to_owned()
    }

    /// Asserts that call `case` returned `want`'s status and left `want`'s
    /// whole text as this thread's last error.
    pub(crate) fn refused(case: &str, st: u32, want: crate::Error) {
        assert_eq!((st, said()), (want.status() as u32, want.to_string()), "{case}");
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the alignment checks of `need` and `need_mut`: a C caller's
    /// out-parameter or options struct at an address not aligned as its
    /// type is INVALID_ARGUMENT naming it (never read or written through a
    /// misaligned reference); NULL stays NULL_ARGUMENT and an aligned one
    /// is used.
    #[test]
    fn misaligned_pointer_arguments_are_refused_naming_them() {
        let mut buf = [0u64; 2];
        // SAFETY: 4 bytes into a 16-byte buffer: in bounds, never dereferenced.
        let odd = unsafe { buf.as_mut_ptr().cast::<u8>().add(4) }.cast::<u64>();
        let e = need(odd.cast_const(), "out_count").unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().starts_with("out_count (0x"), "{}", e.message());
        assert!(e.message().contains("not aligned to 8 bytes"), "{}", e.message());
        let e = need_mut(odd, "out_batch").unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().starts_with("out_batch (0x"), "{}", e.message());
        assert_eq!(buf, [0, 0], "nothing written through the misaligned pointer");
        let e = need_mut(std::ptr::null_mut::<u64>(), "out_batch").unwrap_err();
        assert_eq!(e.status(), Status::NullArgument);
        *need_mut(buf.as_mut_ptr(), "out").unwrap() = 7;
        assert_eq!(*need(buf.as_ptr(), "in").unwrap(), 7);
    }

    /// An error text holding a NUL (a config key or a peer's text) is kept
    /// as the last error with the NUL turned into a space, never emptied
    /// (a C string ends at its first NUL). Guards set_last_error's
    /// `msg.replace('\0', " ")` (round 11 K16).
    #[test]
    fn a_last_error_holding_a_nul_is_kept_whole_with_a_space() {
        set_last_error("unknown key \"a\0b\"");
        // SAFETY: last_error_ptr points at this thread's live C string,
        // unchanged until the next set_last_error on this thread.
        let got = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert_eq!(got.to_str().unwrap(), "unknown key \"a b\"");
    }
}
