//! Notifications: sending one alone or with a submission, and taking the
//! ones received.

use super::boundary::*;
use super::handles::{give_out, live};
use super::transfer::submission;
use super::types::*;
use crate::Error;
use std::ffi::{c_char, c_void};
use std::time::Duration;

/// The `len` bytes at `msg` (NULL is allowed only with `len` 0).
fn message<'a>(msg: *const c_void, len: usize) -> crate::Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if msg.is_null() {
        return Err(Error::NullArgument(format!("msg is NULL with len {len}")));
    }
    // SAFETY: non-NULL, and the caller promises `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(msg.cast::<u8>(), len) })
}

/// Sends `len` bytes at `msg` to `peer` once every request this engine
/// submitted to that peer before the call has ended there; waits up to
/// timeout_ms (0: the default timeout) until the peer queued it.
/// RESOURCE_EXHAUSTED: the peer's queue is full; INVALID_ARGUMENT: larger
/// than notification_max_bytes (here or at the peer); TIMED_OUT: not sent
/// in time, or sent and unanswered (the last error says which).
#[no_mangle]
pub extern "C" fn orbite_notify(
    engine: *mut orbite_engine,
    peer: u64,
    msg: *const c_void,
    len: usize,
    timeout_ms: u32,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let m = message(msg, len)?;
        e.engine.notify(peer, m, timeout_opt(timeout_ms))
    })
}

/// As orbite_submit; when every request of the batch succeeded, msg is
/// delivered to the peer after their bytes are visible in its memory; when
/// any failed, it is not sent. The batch ends once the notification's
/// outcome is known; a refused notification (the peer's queue full) makes
/// it TRANSFER_FAILED with every request OK and the reason in its notes.
#[no_mangle]
pub extern "C" fn orbite_submit_notify(
    engine: *mut orbite_engine,
    peer: u64,
    requests: *const orbite_request,
    count: usize,
    opts: *const orbite_submit_options,
    msg: *const c_void,
    len: usize,
    out_batch: *mut *mut orbite_batch,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out_batch = need_mut(out_batch, "out_batch")?;
        let m = message(msg, len)?;
        let (reqs, o) = submission(requests, count, opts)?;
        let batch = e.engine.submit_with_notification(peer, reqs, o, m)?;
        *out_batch = give_out(orbite_batch { batch });
        Ok(())
    })
}

/// Takes the oldest notification received, waiting up to timeout_ms (0: do
/// not wait): OK, or TIMED_OUT when none came. sender receives the sender's
/// name (its endpoint when it has none), NUL-terminated; 128 bytes always
/// suffice. A too-small msg_cap or sender_cap is BUFFER_TOO_SMALL with
/// *out_msg_len set to the message's length, and the notification stays
/// queued. msg may be NULL when msg_cap is 0.
#[no_mangle]
pub extern "C" fn orbite_notification_take(
    engine: *mut orbite_engine,
    timeout_ms: u32,
    sender: *mut c_char,
    sender_cap: usize,
    msg: *mut c_void,
    msg_cap: usize,
    out_msg_len: *mut usize,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out_msg_len = need_mut(out_msg_len, "out_msg_len")?;
        if sender.is_null() {
            return Err(Error::NullArgument("sender is NULL".into()));
        }
        if msg.is_null() && msg_cap > 0 {
            return Err(Error::NullArgument(format!("msg is NULL with msg_cap {msg_cap}")));
        }
        let timeout = Duration::from_millis(timeout_ms as u64);
        let n = match e.engine.take_notification_fitting(timeout, sender_cap.saturating_sub(1), msg_cap)? {
            Ok(n) => n,
            Err((sender_len, msg_len)) => {
                *out_msg_len = msg_len;
                return Err(Error::BufferTooSmall(format!(
                    "the oldest notification needs sender_cap {} and msg_cap {msg_len}; they are {sender_cap} and \
                     {msg_cap} (it stays queued)",
                    sender_len + 1
                )));
            }
        };
        // SAFETY: sender is non-NULL with sender_cap writable bytes, and the
        // name fits with its NUL (checked by the take); msg has msg_cap
        // writable bytes (non-NULL when the message is not empty, since it
        // fits in msg_cap).
        unsafe {
            std::ptr::copy_nonoverlapping(n.sender.as_ptr(), sender.cast::<u8>(), n.sender.len());
            *sender.add(n.sender.len()) = 0;
            if !n.msg.is_empty() {
                std::ptr::copy_nonoverlapping(n.msg.as_ptr(), msg.cast::<u8>(), n.msg.len());
            }
        }
        *out_msg_len = n.msg.len();
        Ok(())
    })
}
