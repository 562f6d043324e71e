//! The log facility: levels, one logger per engine (its level and its
//! label) and the process-wide sink every event goes to: stderr, one line
//! per event, or the callback a program installed
//! (`orbite_set_log_callback`, docs/logging.md).
//!
//! An engine's level is `ORBITE_LOG` when the environment sets it, else its
//! config's `log_level` (default `warn`). A disabled event costs one atomic
//! load: [`Logger::enabled`] is checked before anything is formatted.
//!
//! ```
//! use orbite::log::{Level, Logger};
//! let log = Logger::new(Level::Info, "prefill-0 127.0.0.1:4242");
//! log.info(format_args!("engine started"));
//! log.debug(format_args!("not formatted: {}", 42)); // disabled
//! ```

use parking_lot::RwLock;
use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// How much an event matters. `Off` is a level a logger can be set to,
/// never the level of an event.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Nothing is logged.
    Off = 0,
    /// Something failed that the engine cannot repair by itself.
    Error = 1,
    /// Something an operator should know of: a transport not offered, a
    /// sizing that rules a transport out, a close that left resources
    /// retained.
    Warn = 2,
    /// Life cycle: engines started and closed, peers connected and
    /// disconnected.
    Info = 3,
    /// Decisions and their reasons (why a transport cannot reach a peer,
    /// regions registered).
    Debug = 4,
    /// Everything, including per-operation detail.
    Trace = 5,
}

impl Level {
    /// Every level, from `Off` up.
    pub const ALL: [Level; 6] = [Level::Off, Level::Error, Level::Warn, Level::Info, Level::Debug, Level::Trace];

    /// The name the config and `ORBITE_LOG` use ("off", "error", ...).
    pub fn name(self) -> &'static str {
        match self {
            Level::Off => "off",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }

    /// The level a name gives: exactly one of the names of [`Level::name`]
    /// (lowercase), nothing else.
    pub fn from_name(s: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name() == s)
    }

    /// The level of a C value (`ORBITE_LOG_*`).
    pub fn from_u32(v: u32) -> Option<Level> {
        Level::ALL.get(v as usize).copied()
    }

    /// Upper case, as stderr lines show it.
    fn tag(self) -> &'static str {
        match self {
            Level::Off => "OFF",
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The names a level is given by, for messages.
pub const LEVEL_NAMES: &str = "off, error, warn, info, debug or trace";

/// The environment variable that sets every engine's level, over its
/// config.
pub const ENV: &str = "ORBITE_LOG";

/// Reads a value of `ORBITE_LOG`: `None` when unset or empty, the level it
/// names, or why it names none.
pub fn parse_env(value: Option<&str>) -> Result<Option<Level>, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => {
            Level::from_name(v).map(Some).ok_or_else(|| format!("{v:?} is not a level (expected {LEVEL_NAMES})"))
        }
    }
}

/// `ORBITE_LOG` as the environment holds it now (see [`parse_env`]).
pub fn env_level() -> Result<Option<Level>, String> {
    match std::env::var(ENV) {
        Ok(v) => parse_env(Some(&v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err("is not valid UTF-8".into()),
    }
}

/// Where events are logged from: a level (changed atomically) and a label
/// that starts each message (`[label] `; none when empty), for an engine its
/// name and endpoint.
#[derive(Debug)]
pub struct Logger {
    level: AtomicU32,
    label: String,
}

impl Logger {
    /// A logger at `level` whose messages start with `[label]`.
    pub fn new(level: Level, label: impl Into<String>) -> Logger {
        Logger { level: AtomicU32::new(level as u32), label: label.into() }
    }

    /// Whether an event at `level` would be logged: one atomic load.
    #[inline]
    pub fn enabled(&self, level: Level) -> bool {
        level != Level::Off && level as u32 <= self.level.load(Ordering::Relaxed)
    }

    /// The level now.
    pub fn level(&self) -> Level {
        Level::from_u32(self.level.load(Ordering::Relaxed)).unwrap_or(Level::Off)
    }

    /// Sets the level.
    pub fn set_level(&self, level: Level) {
        self.level.store(level as u32, Ordering::Relaxed);
    }

    /// The label of its messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Logs `args` at `level` if the level is enabled; formats nothing
    /// otherwise.
    #[inline]
    pub fn event(&self, level: Level, args: fmt::Arguments<'_>) {
        if self.enabled(level) {
            emit(level, &self.label, args);
        }
    }

    /// [`Logger::event`] at `Error`.
    #[inline]
    pub fn error(&self, args: fmt::Arguments<'_>) {
        self.event(Level::Error, args)
    }

    /// [`Logger::event`] at `Warn`.
    #[inline]
    pub fn warn(&self, args: fmt::Arguments<'_>) {
        self.event(Level::Warn, args)
    }

    /// [`Logger::event`] at `Info`.
    #[inline]
    pub fn info(&self, args: fmt::Arguments<'_>) {
        self.event(Level::Info, args)
    }

    /// [`Logger::event`] at `Debug`.
    #[inline]
    pub fn debug(&self, args: fmt::Arguments<'_>) {
        self.event(Level::Debug, args)
    }

    /// [`Logger::event`] at `Trace`.
    #[inline]
    pub fn trace(&self, args: fmt::Arguments<'_>) {
        self.event(Level::Trace, args)
    }
}

/// The logger of events outside any engine (no label): at `ORBITE_LOG`
/// when set (read once, at its first event), else `warn`.
pub fn process() -> &'static Logger {
    static PROCESS: once_cell::sync::Lazy<Logger> =
        once_cell::sync::Lazy::new(|| Logger::new(env_level().ok().flatten().unwrap_or(Level::Warn), ""));
    &PROCESS
}

/// Logs an event outside any engine's logger: `label` (an engine's, or
/// none) starts the message, the level is [`process`]'s.
#[inline]
pub fn event(level: Level, label: Option<&str>, args: fmt::Arguments<'_>) {
    if process().enabled(level) {
        emit(level, label.unwrap_or(""), args);
    }
}

/// A sink: receives each event's level and message (one line, its label
/// first, no newline). Called on the thread that raised the event, from any
/// thread, possibly from several at once.
pub type Sink = Box<dyn Fn(Level, &str) + Send + Sync>;

/// The installed sink; `None`: stderr. Read-locked while a sink runs, so
/// that [`set_sink`] returns only once no call of the old one is running.
static SINK: RwLock<Option<Sink>> = parking_lot::const_rwlock(None);

thread_local! {
    /// This thread is inside a sink call now.
    static IN_SINK: Cell<bool> = const { Cell::new(false) };
}

/// Installs `sink` (`None`: stderr again). When it returns, no call of the
/// previous sink is running and none will start. Refused from inside a sink
/// call (it would wait for itself).
pub fn set_sink(sink: Option<Sink>) -> Result<(), String> {
    if IN_SINK.with(Cell::get) {
        return Err("the log callback cannot be changed from inside a call of the log callback".into());
    }
    let old = std::mem::replace(&mut *SINK.write(), sink);
    drop(old);
    Ok(())
}

/// Clears the in-sink flag when a sink call ends, even by a panic.
struct InSink;

impl Drop for InSink {
    fn drop(&mut self) {
        IN_SINK.with(|f| f.set(false));
    }
}

/// One event: `[label] message` as one line, to the sink or stderr. An
/// event raised inside a sink call (the sink called into the library) is
/// dropped.
fn emit(level: Level, label: &str, args: fmt::Arguments<'_>) {
    if IN_SINK.with(Cell::get) {
        return;
    }
    let mut msg = String::with_capacity(160);
    if !label.is_empty() {
        let _ = write!(msg, "[{label}] ");
    }
    let _ = msg.write_fmt(args);
    if msg.contains(['\n', '\r']) {
        msg = msg.replace(['\n', '\r'], " ");
    }
    let sink = SINK.read();
    match sink.as_ref() {
        Some(f) => {
            IN_SINK.with(|f| f.set(true));
            let _reset = InSink;
            f(level, &msg);
        }
        None => {
            let line = format!("{} orbite {} {msg}\n", timestamp(SystemTime::now()), level.tag());
            // One write per line, so that lines from several threads do not mix.
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

/// `t` as UTC, RFC 3339 with microseconds: `2026-12-01T09:05:03.000042Z`.
fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        d.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// The tests that install a sink, one at a time (the sink is process-wide).
    static SINK_TESTS: Mutex<()> = Mutex::new(());

    /// Installs a sink recording the events whose message starts with
    /// `[label]` (other tests' engines may log meanwhile).
    fn capture(label: &str) -> Arc<Mutex<Vec<(Level, String)>>> {
        let got = Arc::new(Mutex::new(Vec::new()));
        let (g, prefix) = (got.clone(), format!("[{label}] "));
        set_sink(Some(Box::new(move |l, m| {
            if m.starts_with(&prefix) {
                g.lock().unwrap().push((l, m.to_string()));
            }
        })))
        .unwrap();
        got
    }

    #[test]
    fn names_parse_strictly() {
        for l in Level::ALL {
            assert_eq!(Level::from_name(l.name()), Some(l));
            assert_eq!(Level::from_u32(l as u32), Some(l));
        }
        assert_eq!(Level::from_name("WARN"), None);
        assert_eq!(Level::from_name("warning"), None);
        assert_eq!(Level::from_name(""), None);
        assert_eq!(Level::from_u32(6), None);
        assert_eq!(parse_env(None), Ok(None));
        assert_eq!(parse_env(Some("")), Ok(None));
        assert_eq!(parse_env(Some(" debug ")), Ok(Some(Level::Debug)));
        assert!(parse_env(Some("verbose")).unwrap_err().contains("\"verbose\" is not a level"));
    }

    #[test]
    fn a_logger_passes_its_level_and_those_above_it_only() {
        for max in Level::ALL {
            let log = Logger::new(max, "x");
            for l in Level::ALL {
                assert_eq!(log.enabled(l), l != Level::Off && l <= max, "{l} at {max}");
            }
        }
        let log = Logger::new(Level::Warn, "x");
        assert!(!log.enabled(Level::Info));
        log.set_level(Level::Trace);
        assert!(log.enabled(Level::Trace) && log.level() == Level::Trace);
    }

    #[test]
    fn events_reach_the_sink_filtered_and_labelled() {
        let _one = SINK_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let label = format!("levels-{}", std::process::id());
        let got = capture(&label);
        let log = Logger::new(Level::Info, label.clone());
        let formatted = std::sync::atomic::AtomicU32::new(0);
        struct Counted<'a>(&'a std::sync::atomic::AtomicU32);
        impl fmt::Display for Counted<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fetch_add(1, Ordering::Relaxed);
                f.write_str("counted")
            }
        }
        log.error(format_args!("e {}", 1));
        log.warn(format_args!("w"));
        log.info(format_args!("i\nwith a newline"));
        log.debug(format_args!("d {}", Counted(&formatted)));
        log.trace(format_args!("t {}", Counted(&formatted)));
        log.event(Level::Off, format_args!("never"));
        log.set_level(Level::Off);
        log.error(format_args!("off {}", Counted(&formatted)));
        log.set_level(Level::Debug);
        log.debug(format_args!("d2 {}", Counted(&formatted)));
        set_sink(None).unwrap();
        log.warn(format_args!("to stderr, not the sink"));
        let got = got.lock().unwrap().clone();
        let p = |m: &str| format!("[{label}] {m}");
        assert_eq!(
            got,
            vec![
                (Level::Error, p("e 1")),
                (Level::Warn, p("w")),
                (Level::Info, p("i with a newline")),
                (Level::Debug, p("d2 counted")),
            ]
        );
        assert_eq!(formatted.load(Ordering::Relaxed), 1, "a disabled event was formatted");
    }

    #[test]
    fn the_sink_cannot_be_changed_from_inside_it_and_its_own_events_are_dropped() {
        let _one = SINK_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let label = format!("inside-{}", std::process::id());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, prefix) = (seen.clone(), format!("[{label}] "));
        let inner = Arc::new(Logger::new(Level::Trace, label.clone()));
        let log = inner.clone();
        set_sink(Some(Box::new(move |_, m| {
            if m.starts_with(&prefix) {
                let refused = set_sink(None).is_err();
                log.error(format_args!("raised inside the sink"));
                s.lock().unwrap().push((m.to_string(), refused));
            }
        })))
        .unwrap();
        inner.info(format_args!("outside"));
        set_sink(None).unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![(format!("[{label}] outside"), true)]);
    }

    /// When `set_sink` returns, the old sink runs nowhere: its last call
    /// on another thread has ended.
    #[test]
    fn set_sink_waits_for_running_calls_of_the_old_sink() {
        let _one = SINK_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let label = format!("wait-{}", std::process::id());
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (d, prefix) = (done.clone(), format!("[{label}] "));
        set_sink(Some(Box::new(move |_, m| {
            if m.starts_with(&prefix) {
                entered_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(200));
                d.store(true, Ordering::SeqCst);
            }
        })))
        .unwrap();
        let log = Arc::new(Logger::new(Level::Info, label));
        let l = log.clone();
        let t = std::thread::spawn(move || l.info(format_args!("slow")));
        entered.recv().unwrap();
        set_sink(None).unwrap();
        assert!(done.load(Ordering::SeqCst), "set_sink returned while the old sink ran");
        t.join().unwrap();
    }

    #[test]
    fn timestamps_are_utc_rfc3339() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(951_825_600_000_042); // a leap day
        assert_eq!(timestamp(t), "2000-02-29T12:00:00.000042Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_798_761_599); // the last second of 2026
        assert_eq!(timestamp(t), "2026-12-31T23:59:59.000000Z");
    }
}
