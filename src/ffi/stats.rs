//! Entry points: an engine's counters as a snapshot read without JSON.

use super::boundary::{guard, guard_value, need_mut, need_str};
use super::handles::{give_out, live, take_back};
use super::types::*;
use crate::engine::stats::StatValue;
use crate::error::Error;
use std::ffi::CString;
use std::os::raw::c_char;

/// A C string of `s`; a NUL inside (never in a path, possible in a note
/// quoting a peer) becomes a space.
fn c_text(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Takes a snapshot of the engine's counters: every value
/// orbite_engine_stats_json reports, by its dotted path
/// ("transports.tcp.requests_completed", "ipc.shm.groups_without_round_trip",
/// "io.connections_per_thread.0"), numbers as they are, booleans as 0 or 1,
/// texts ("transports_available.nvlink", "notes.0") as texts. The snapshot
/// never changes; free it with orbite_stats_free.
#[no_mangle]
pub extern "C" fn orbite_engine_stats(
    engine: *const orbite_engine,
    out_stats: *mut *mut orbite_stats,
) -> orbite_status {
    guard(|| {
        let e = live(engine, "engine")?;
        let out = need_mut(out_stats, "out_stats")?;
        let entries = e
            .engine
            .stats()
            .entries()
            .into_iter()
            .map(|(path, v)| {
                let (value, text) = match v {
                    StatValue::Number(n) => (n, None),
                    StatValue::Text(t) => (0, Some(c_text(&t))),
                };
                StatEntry { path: c_text(&path), value, text }
            })
            .collect();
        *out = give_out(orbite_stats { entries });
        Ok(())
    })
}

/// How many values a snapshot holds; 0 for NULL.
#[no_mangle]
pub extern "C" fn orbite_stats_count(stats: *const orbite_stats) -> usize {
    guard_value(0, || live(stats, "stats").map(|s| s.entries.len()).unwrap_or(0))
}

/// Value `index` of a snapshot, in path order: its path, and its number
/// (*out_text NULL) or its text (*out_value 0). The strings stay valid until
/// orbite_stats_free. index >= orbite_stats_count: OUT_OF_RANGE.
#[no_mangle]
pub extern "C" fn orbite_stats_entry(
    stats: *const orbite_stats,
    index: usize,
    out_path: *mut *const c_char,
    out_value: *mut u64,
    out_text: *mut *const c_char,
) -> orbite_status {
    guard(|| {
        let s = live(stats, "stats")?;
        let (path, value, text) =
            (need_mut(out_path, "out_path")?, need_mut(out_value, "out_value")?, need_mut(out_text, "out_text")?);
        let e = s.entries.get(index).ok_or_else(|| {
            Error::OutOfRange(format!("index {index} is past the snapshot's {} values", s.entries.len()))
        })?;
        *path = e.path.as_ptr();
        *value = e.value;
        *text = e.text.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
        Ok(())
    })
}

/// The number at `path` in a snapshot. NOT_FOUND: the snapshot has no value
/// there (a transport not running, a key of another version);
/// INVALID_ARGUMENT: the value there is a text.
#[no_mangle]
pub extern "C" fn orbite_stats_number(
    stats: *const orbite_stats,
    path: *const c_char,
    out_value: *mut u64,
) -> orbite_status {
    guard(|| {
        let s = live(stats, "stats")?;
        let p = need_str(path, "path")?;
        let out = need_mut(out_value, "out_value")?;
        let at = s
            .entries
            .binary_search_by(|e| e.path.as_bytes().cmp(p.as_bytes()))
            .map_err(|_| Error::NotFound(format!("the stats have no value at {p:?}")))?;
        let e = &s.entries[at];
        if e.text.is_some() {
            return Err(Error::InvalidArgument(format!("the value at {p:?} is a text, not a number")));
        }
        *out = e.value;
        Ok(())
    })
}

/// Frees a snapshot (its strings with it). NULL is a no-op.
#[no_mangle]
pub extern "C" fn orbite_stats_free(stats: *mut orbite_stats) {
    guard_value((), || {
        if let Err(e) = take_back(stats, "stats").map(drop) {
            super::boundary::set_last_error(&e.to_string());
        }
    })
}
