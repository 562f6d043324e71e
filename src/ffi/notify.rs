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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::boundary::said::{refused, said};
    use crate::ffi::engine::{orbite_connect, orbite_engine_free, orbite_engine_new};
    use crate::Status;
    use std::ffi::{CStr, CString};

    /// Engines "rx" and "tx", tx connected to rx and its notification
    /// `msg` queued at rx: (rx, tx).
    fn notified(msg: &[u8]) -> (*mut orbite_engine, *mut orbite_engine) {
        let (rx, tx, peer) = connected();
        assert_eq!(orbite_notify(tx, peer, msg.as_ptr().cast(), msg.len(), 60_000), Status::Ok as u32);
        (rx, tx)
    }

    /// Engines "rx" and "tx", tx connected to rx as `peer`: (rx, tx, peer).
    fn connected() -> (*mut orbite_engine, *mut orbite_engine, u64) {
        let (mut rx, mut tx): (*mut orbite_engine, *mut orbite_engine) = (std::ptr::null_mut(), std::ptr::null_mut());
        let rx_config = CString::new(r#"{"name": "rx"}"#).unwrap();
        let tx_config = CString::new(r#"{"name": "tx"}"#).unwrap();
        assert_eq!(orbite_engine_new(rx_config.as_ptr(), &mut rx), Status::Ok as u32);
        assert_eq!(orbite_engine_new(tx_config.as_ptr(), &mut tx), Status::Ok as u32);
        // SAFETY: rx is the live engine orbite_engine_new gave above.
        let ep = CString::new(unsafe { &*rx }.engine.endpoint()).unwrap();
        let mut peer = 0u64;
        assert_eq!(orbite_connect(tx, ep.as_ptr(), 60_000, &mut peer), Status::Ok as u32);
        (rx, tx, peer)
    }

    /// A notification whose message does not fit `msg_cap` is not taken:
    /// BUFFER_TOO_SMALL with `*out_msg_len` its length, the caller's bytes
    /// untouched and the notification still queued; a take with room then
    /// gets it, exact bytes and sender, and the queue is empty after it.
    /// The message buffer is larger than the `msg_cap` given, so that a
    /// take that ignored the cap writes nothing out of bounds. Guards
    /// `n.msg.len() <= msg_cap` in `engine/notify.rs`'s
    /// `take_notification_fitting` (without it the 5-byte message is taken
    /// into a 4-byte cap; round 6 F10).
    #[test]
    fn a_message_larger_than_msg_cap_is_buffer_too_small_and_stays_queued() {
        let (rx, tx) = notified(b"hello");
        let (mut sender, mut msg, mut msg_len) = ([0 as c_char; 128], [0u8; 16], 99usize);
        let (s, m) = (sender.as_mut_ptr(), msg.as_mut_ptr().cast::<c_void>());
        let st = orbite_notification_take(rx, 60_000, s, sender.len(), m, 4, &mut msg_len);
        assert_eq!((st, msg_len), (Status::BufferTooSmall as u32, 5));
        assert_eq!(msg, [0u8; 16], "nothing written into a buffer too small");
        let st = orbite_notification_take(rx, 60_000, s, sender.len(), m, 5, &mut msg_len);
        assert_eq!((st, msg_len), (Status::Ok as u32, 5), "the notification stayed queued");
        assert_eq!(&msg[..5], b"hello");
        assert_eq!(msg[5..], [0u8; 11]);
        // SAFETY: the take wrote a NUL-terminated name into sender.
        assert_eq!(unsafe { CStr::from_ptr(sender.as_ptr()) }.to_str().unwrap(), "tx");
        let st = orbite_notification_take(rx, 0, s, sender.len(), m, msg.len(), &mut msg_len);
        assert_eq!(st, Status::TimedOut as u32, "taken once only");
        orbite_engine_free(tx);
        orbite_engine_free(rx);
    }

    /// The sender's name ("tx", 2 bytes) needs sender_cap 3 (its NUL
    /// included): with 2 the take is BUFFER_TOO_SMALL saying 3 is needed,
    /// nothing is written (the buffer is larger than the cap given, so a
    /// take past the cap writes nothing out of bounds) and the notification
    /// stays queued; with 3 it is taken, the name NUL-terminated in the
    /// third byte and the fourth untouched. Guards
    /// `sender_cap.saturating_sub(1)` in `orbite_notification_take` and
    /// `n.sender.len() <= sender_cap` in `take_notification_fitting`
    /// (sweep B).
    #[test]
    fn a_sender_cap_of_exactly_the_name_and_its_nul_suffices() {
        let (rx, tx) = notified(b"hi");
        let (mut sender, mut msg, mut msg_len) = ([0x7f as c_char; 8], [0u8; 8], 99usize);
        let (s, m) = (sender.as_mut_ptr(), msg.as_mut_ptr().cast::<c_void>());
        let st = orbite_notification_take(rx, 60_000, s, 2, m, msg.len(), &mut msg_len);
        assert_eq!((st, msg_len), (Status::BufferTooSmall as u32, 2));
        let said = said();
        assert!(said.contains("needs sender_cap 3 and msg_cap 2; they are 2 and 8 (it stays queued)"), "{said}");
        assert!(sender.iter().all(|&c| c == 0x7f) && msg == [0; 8], "written by a take refused");
        let st = orbite_notification_take(rx, 60_000, s, 3, m, msg.len(), &mut msg_len);
        assert_eq!((st, msg_len), (Status::Ok as u32, 2), "the notification stayed queued");
        assert_eq!((&sender[..4], &msg[..2]), (&[b't' as c_char, b'x' as c_char, 0, 0x7f][..], &b"hi"[..]));
        orbite_engine_free(tx);
        orbite_engine_free(rx);
    }

    /// msg NULL with room for one byte is NULL_ARGUMENT, whatever waits:
    /// nothing taken, `*out_msg_len` untouched, the notification still
    /// queued for a take with a buffer. Guards `orbite_notification_take`'s
    /// `msg.is_null() && msg_cap > 0` (round 7 G16: with `> 1` the
    /// call went on to the take, here BUFFER_TOO_SMALL; a 1-byte message
    /// would have been written through NULL).
    #[test]
    fn msg_null_with_a_msg_cap_of_one_is_a_null_argument_and_takes_nothing() {
        let (rx, tx) = notified(b"hello");
        let (mut sender, mut msg, mut msg_len) = ([0 as c_char; 128], [0u8; 8], 99usize);
        let s = sender.as_mut_ptr();
        let st = orbite_notification_take(rx, 60_000, s, sender.len(), std::ptr::null_mut(), 1, &mut msg_len);
        assert_eq!((st, msg_len), (Status::NullArgument as u32, 99));
        let said = said();
        assert!(said.contains("msg is NULL with msg_cap 1"), "{said}");
        let st =
            orbite_notification_take(rx, 60_000, s, sender.len(), msg.as_mut_ptr().cast(), msg.len(), &mut msg_len);
        assert_eq!((st, msg_len), (Status::Ok as u32, 5), "the notification stayed queued");
        assert_eq!(&msg[..5], b"hello");
        orbite_engine_free(tx);
        orbite_engine_free(rx);
    }

    /// Guards `if self.inner.closed.load(Ordering::Acquire)` in
    /// `Engine::check_open` (round 13 M5): after orbite_close, new work on
    /// the engine (registering memory, connecting to a live engine,
    /// notifying or submitting to the peer it had) is UNAVAILABLE "the
    /// engine is closed", with nothing registered or connected
    /// (*out_region, *out_peer and *out_batch untouched). Here, beside
    /// orbite_notify, as ffi::engine's tests import no module above it.
    #[test]
    fn a_closed_engine_refuses_new_work_as_closed() {
        let mut src: *mut orbite_engine = std::ptr::null_mut();
        let mut req: *mut orbite_engine = std::ptr::null_mut();
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut src), Status::Ok as u32);
        assert_eq!(orbite_engine_new(std::ptr::null(), &mut req), Status::Ok as u32);
        let mut remote = vec![0u8; 4096];
        let mut rid = 0u64;
        let st = crate::ffi::engine::orbite_register_memory(
            src,
            remote.as_mut_ptr().cast(),
            remote.len(),
            ORBITE_ACCESS_READ,
            &mut rid,
        );
        assert_eq!(st, Status::Ok as u32);
        // SAFETY: src is the live engine orbite_engine_new gave above.
        let ep = std::ffi::CString::new(unsafe { &*src }.engine.endpoint()).unwrap();
        let mut peer = 0u64;
        assert_eq!(orbite_connect(req, ep.as_ptr(), 30_000, &mut peer), Status::Ok as u32);
        assert_eq!(crate::ffi::engine::orbite_close(req, 30_000), Status::Ok as u32);
        let text = crate::Error::Unavailable("the engine is closed".into()).to_string();
        let closed = |st: orbite_status, what: &str| {
            let said = said();
            assert_eq!((st, said), (Status::Unavailable as u32, text.clone()), "{what}");
        };
        let mut local = vec![0u8; 4096];
        let mut region = 77u64;
        let st = crate::ffi::engine::orbite_register_memory(
            req,
            local.as_mut_ptr().cast(),
            local.len(),
            ORBITE_ACCESS_READ,
            &mut region,
        );
        closed(st, "register_memory");
        assert_eq!(region, 77);
        let mut again = 77u64;
        closed(orbite_connect(req, ep.as_ptr(), 30_000, &mut again), "connect");
        assert_eq!(again, 77);
        closed(orbite_notify(req, peer, b"hi".as_ptr().cast(), 2, 30_000), "notify");
        let r = orbite_request {
            opcode: ORBITE_OP_READ,
            local_addr: local.as_ptr() as u64,
            remote_addr: remote.as_ptr() as u64,
            length: 16,
        };
        let mut batch = std::ptr::NonNull::<orbite_batch>::dangling().as_ptr();
        let kept = batch;
        let st = crate::ffi::transfer::orbite_submit(req, peer, &r, 1, std::ptr::null(), &mut batch);
        closed(st, "submit");
        assert_eq!(batch, kept);
        orbite_engine_free(req);
        orbite_engine_free(src);
    }

    /// The sweep of the notification functions' entry checks, each case
    /// named: a NULL engine is NULL_ARGUMENT "engine is NULL"; msg NULL
    /// with a nonzero len, a NULL out_batch, requests, sender or
    /// out_msg_len are NULL_ARGUMENT naming them (and the len); nothing of
    /// it is sent, written or taken. msg NULL with len 0 is an empty
    /// notification, delivered, and taken into msg NULL with msg_cap 0.
    /// Guards `message`'s `len == 0` and `msg.is_null()` checks and
    /// orbite_notification_take's `sender.is_null()`.
    #[test]
    fn notification_entry_points_refuse_null_arguments_naming_them() {
        let (rx, tx, peer) = connected();
        let null_arg = |what: &str| Error::NullArgument(format!("{what} is NULL"));
        let no: *mut orbite_engine = std::ptr::null_mut();
        let hi: *const c_void = b"hi".as_ptr().cast();
        let r = orbite_request { opcode: ORBITE_OP_READ, local_addr: 0x1000, remote_addr: 0x2000, length: 8 };
        let none = std::ptr::null();
        let dangling = std::ptr::NonNull::<orbite_batch>::dangling().as_ptr();
        let mut batch = dangling;
        let (mut sender, mut msg, mut len) = ([0x7f as c_char; 128], [0x7fu8; 8], 77usize);
        let (s, m) = (sender.as_mut_ptr(), msg.as_mut_ptr().cast::<c_void>());

        refused("notify engine", orbite_notify(no, peer, hi, 2, 60_000), null_arg("engine"));
        let st = orbite_notify(tx, peer, std::ptr::null(), 3, 60_000);
        refused("notify msg", st, Error::NullArgument("msg is NULL with len 3".into()));
        let st = orbite_submit_notify(no, peer, &r, 1, none, hi, 2, &mut batch);
        refused("submit_notify engine", st, null_arg("engine"));
        let st = orbite_submit_notify(tx, peer, &r, 1, none, hi, 2, std::ptr::null_mut());
        refused("submit_notify out_batch", st, null_arg("out_batch"));
        let st = orbite_submit_notify(tx, peer, &r, 1, none, std::ptr::null(), 2, &mut batch);
        refused("submit_notify msg", st, Error::NullArgument("msg is NULL with len 2".into()));
        let st = orbite_submit_notify(tx, peer, std::ptr::null(), 1, none, hi, 2, &mut batch);
        refused("submit_notify requests", st, null_arg("requests"));
        assert_eq!(batch, dangling, "a batch was written");
        let st = orbite_notification_take(no, 0, s, 128, m, 8, &mut len);
        refused("take engine", st, null_arg("engine"));

        assert_eq!(orbite_notify(tx, peer, std::ptr::null(), 0, 60_000), Status::Ok as u32, "{}", said());
        let st = orbite_notification_take(rx, 60_000, std::ptr::null_mut(), 128, m, 8, &mut len);
        refused("take sender", st, null_arg("sender"));
        let st = orbite_notification_take(rx, 60_000, s, 128, m, 8, std::ptr::null_mut());
        refused("take out_msg_len", st, null_arg("out_msg_len"));
        assert_eq!(len, 77, "out_msg_len written");
        assert!(sender.iter().all(|&c| c == 0x7f) && msg == [0x7f; 8], "written by a refused take");

        let st = orbite_notification_take(rx, 60_000, s, 128, std::ptr::null_mut(), 0, &mut len);
        assert_eq!((st, len), (Status::Ok as u32, 0), "the empty notification, still queued: {}", said());
        // SAFETY: the take wrote a NUL-terminated name into sender.
        assert_eq!(unsafe { CStr::from_ptr(sender.as_ptr()) }.to_str().unwrap(), "tx");
        let st = orbite_notification_take(rx, 0, s, 128, m, 8, &mut len);
        assert_eq!(st, Status::TimedOut as u32, "a refused call sent a notification");
        orbite_engine_free(tx);
        orbite_engine_free(rx);
    }
}
