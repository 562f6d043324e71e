//! The log callback: where the library's log lines go (docs/logging.md).

use super::boundary::*;
use super::types::*;
use crate::log::{set_sink, Level, Sink};
use crate::Error;
use std::ffi::{c_char, c_void, CString};

/// Nothing is logged (an engine's level; never the level of a line).
pub const ORBITE_LOG_OFF: u32 = 0;
/// Something failed that the engine cannot repair by itself.
pub const ORBITE_LOG_ERROR: u32 = 1;
/// Something an operator should know of (a transport not offered, a sizing
/// that rules a transport out).
pub const ORBITE_LOG_WARN: u32 = 2;
/// Life cycle: engines started and closed, peers connected and disconnected.
pub const ORBITE_LOG_INFO: u32 = 3;
/// Decisions and their reasons.
pub const ORBITE_LOG_DEBUG: u32 = 4;
/// Everything, including per-operation detail.
pub const ORBITE_LOG_TRACE: u32 = 5;

// The header's levels are the library's, checked when it compiles.
const _: () = {
    assert!(ORBITE_LOG_OFF == Level::Off as u32);
    assert!(ORBITE_LOG_ERROR == Level::Error as u32);
    assert!(ORBITE_LOG_WARN == Level::Warn as u32);
    assert!(ORBITE_LOG_INFO == Level::Info as u32);
    assert!(ORBITE_LOG_DEBUG == Level::Debug as u32);
    assert!(ORBITE_LOG_TRACE == Level::Trace as u32);
};

/// A log callback. `level` is ORBITE_LOG_ERROR to ORBITE_LOG_TRACE;
/// `message` is one line, NUL-terminated, without a newline, starting with
/// "[NAME ENDPOINT] " (or "[ENDPOINT] ") when an engine logged it, valid
/// only during the call; `user_data` is the pointer given to
/// orbite_set_log_callback. Called on the library thread that logged the
/// event (the caller's own, an I/O thread, a worker), from several threads
/// at once: it must be thread-safe, return promptly (it runs on the
/// transfer path), never unwind (no C++ exception may leave it), and call
/// no liborbite function but orbite_status_name, orbite_version and
/// orbite_abi_version (the library may hold its locks while it logs; lines
/// the callback itself would make are dropped).
pub type orbite_log_fn = Option<unsafe extern "C" fn(level: u32, message: *const c_char, user_data: *mut c_void)>;

/// The callback's `user_data`, carried to whichever thread logs.
struct UserData(*mut c_void);

// SAFETY: the pointer is only handed back to the caller's callback, which
// the contract of orbite_set_log_callback requires to accept calls from any
// thread, several at once; the library never dereferences it.
unsafe impl Send for UserData {}
// SAFETY: as above: shared use is passing the same pointer to the callback.
unsafe impl Sync for UserData {}

/// Sends the library's log lines to `cb` (with `user_data`) instead of
/// stderr, for the whole process; NULL restores stderr. When it returns OK,
/// no call of the previous callback is running or will start, so its
/// user_data may be freed. UNAVAILABLE when called from inside a call of
/// the callback. Which lines come is each engine's level: ORBITE_LOG when
/// set, else its config's "log_level" (default "warn").
#[no_mangle]
pub extern "C" fn orbite_set_log_callback(cb: orbite_log_fn, user_data: *mut c_void) -> orbite_status {
    guard(|| {
        let sink = cb.map(|f| {
            let data = UserData(user_data);
            Box::new(move |level: Level, message: &str| {
                let text = CString::new(message).unwrap_or_else(|_| {
                    CString::new(message.replace('\0', " ")).expect("no NUL is left in the message")
                });
                let data = &data;
                // SAFETY: `f` is the caller's callback, which accepts these
                // arguments from any thread (its contract above); `text`
                // outlives the call.
                unsafe { f(level as u32, text.as_ptr(), data.0) }
            }) as Sink
        });
        set_sink(sink).map_err(Error::Unavailable)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_levels_are_the_rust_levels() {
        let c =
            [ORBITE_LOG_OFF, ORBITE_LOG_ERROR, ORBITE_LOG_WARN, ORBITE_LOG_INFO, ORBITE_LOG_DEBUG, ORBITE_LOG_TRACE];
        for (v, l) in c.into_iter().zip(Level::ALL) {
            assert_eq!(Level::from_u32(v), Some(l));
        }
    }
}
