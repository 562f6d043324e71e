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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::boundary::said::{refused, said};
    use crate::Status;
    use std::ffi::CStr;

    /// The sweep of the stats functions' entry checks, each case named, on
    /// a snapshot of a number at "a.n" (5) and a text at "b.t": a NULL
    /// engine or snapshot is NULL_ARGUMENT naming it (orbite_stats_count
    /// 0); a NULL out-parameter or path names itself; index 2 is
    /// OUT_OF_RANGE "index 2 is past the snapshot's 2 values"; an absent
    /// path NOT_FOUND and a text INVALID_ARGUMENT, each naming the path.
    /// No out-parameter is written by a refused call. Guards the
    /// `entries.get(index)` bound of orbite_stats_entry and the
    /// `e.text.is_some()` check of orbite_stats_number.
    #[test]
    fn stats_entry_points_refuse_null_unknown_and_text_arguments_naming_them() {
        let null_arg = |what: &str| Error::NullArgument(format!("{what} is NULL"));
        let engine = give_out(orbite_engine { engine: crate::Engine::from_json("{}").unwrap() });
        let mut snap: *mut orbite_stats = std::ptr::null_mut();
        refused("engine_stats engine", orbite_engine_stats(std::ptr::null(), &mut snap), null_arg("engine"));
        refused("engine_stats out", orbite_engine_stats(engine, std::ptr::null_mut()), null_arg("out_stats"));
        assert!(snap.is_null(), "a snapshot was written");
        let entry = |path: &str, value: u64, text: Option<&str>| StatEntry {
            path: c_text(path),
            value,
            text: text.map(c_text),
        };
        let s = give_out(orbite_stats { entries: vec![entry("a.n", 5, None), entry("b.t", 0, Some("words"))] });
        let no: *const orbite_stats = std::ptr::null();
        let sentinel = c"sentinel".as_ptr();
        let (mut path, mut value, mut text) = (sentinel, 77u64, sentinel);
        let (p, v, t) = (&mut path as *mut _, &mut value as *mut u64, &mut text as *mut _);

        assert_eq!((orbite_stats_count(no), orbite_stats_count(s)), (0, 2));
        refused("entry stats", orbite_stats_entry(no, 0, p, v, t), null_arg("stats"));
        refused("entry out_path", orbite_stats_entry(s, 0, std::ptr::null_mut(), v, t), null_arg("out_path"));
        refused("entry out_value", orbite_stats_entry(s, 0, p, std::ptr::null_mut(), t), null_arg("out_value"));
        refused("entry out_text", orbite_stats_entry(s, 0, p, v, std::ptr::null_mut()), null_arg("out_text"));
        let past = Error::OutOfRange("index 2 is past the snapshot's 2 values".into());
        refused("entry index", orbite_stats_entry(s, 2, p, v, t), past);
        refused("number stats", orbite_stats_number(no, c"a.n".as_ptr(), v), null_arg("stats"));
        refused("number path", orbite_stats_number(s, std::ptr::null(), v), null_arg("path"));
        refused("number out", orbite_stats_number(s, c"a.n".as_ptr(), std::ptr::null_mut()), null_arg("out_value"));
        let absent = Error::NotFound("the stats have no value at \"a\"".into());
        refused("number absent", orbite_stats_number(s, c"a".as_ptr(), v), absent);
        let words = Error::InvalidArgument("the value at \"b.t\" is a text, not a number".into());
        refused("number text", orbite_stats_number(s, c"b.t".as_ptr(), v), words);
        assert_eq!((path, value, text), (sentinel, 77, sentinel), "an out-parameter was written");

        assert_eq!(orbite_stats_number(s, c"a.n".as_ptr(), v), Status::Ok as u32);
        assert_eq!(orbite_stats_entry(s, 1, p, v, t), Status::Ok as u32);
        // SAFETY: OK: path and text point at the snapshot's strings, alive until it is freed.
        let (got_path, got_text) = unsafe { (CStr::from_ptr(path), CStr::from_ptr(text)) };
        assert_eq!((got_path.to_str().unwrap(), value, got_text.to_str().unwrap()), ("b.t", 0, "words"));
        orbite_stats_free(s);
        drop(take_back(engine, "engine").unwrap());
    }

    /// orbite_stats_free(NULL) does nothing (the last error stays); a
    /// handle of another type passed as the snapshot is left alone, still
    /// live, and the last error says what it is. Guards orbite_stats_free's
    /// `set_last_error`.
    #[test]
    fn freeing_null_or_another_handle_as_stats_does_nothing() {
        super::super::boundary::set_last_error("an earlier failure");
        orbite_stats_free(std::ptr::null_mut());
        assert_eq!(said(), "an earlier failure");
        let engine = give_out(orbite_engine { engine: crate::Engine::from_json("{}").unwrap() });
        orbite_stats_free(engine.cast());
        assert_eq!(said(), "invalid argument: stats is an orbite_engine, not an orbite_stats");
        assert!(take_back(engine, "engine").unwrap().is_some(), "still a live engine");
    }
}
