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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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
    /// Its lines dropped because stderr did not take them in time.
    dropped: AtomicU64,
}

impl Logger {
    /// A logger at `level` whose messages start with `[label]`.
    pub fn new(level: Level, label: impl Into<String>) -> Logger {
        Logger { level: AtomicU32::new(level as u32), label: label.into(), dropped: AtomicU64::new(0) }
    }

    /// How many of its lines were dropped because stderr did not take the
    /// lines before them in time (the queue to stderr was full).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
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
        if self.enabled(level) && !emit(level, &self.label, args) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
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
    if process().enabled(level) && !emit(level, label.unwrap_or(""), args) {
        process().dropped.fetch_add(1, Ordering::Relaxed);
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

/// One event: `[label] message` as one line, to the sink (on this thread)
/// or to the queue the stderr writer drains. An event raised inside a sink
/// call (the sink called into the library) is dropped, not counted.
/// Returns false when the line was dropped because the queue to stderr
/// was full.
fn emit(level: Level, label: &str, args: fmt::Arguments<'_>) -> bool {
    if IN_SINK.with(Cell::get) {
        return true;
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
            true
        }
        None => {
            drop(sink);
            stderr_queue::push(format!("{} orbite {} {msg}\n", timestamp(SystemTime::now()), level.tag()))
        }
    }
}

/// Waits until every line queued for stderr before the call was written,
/// at most `bound`, and not at all while the writer has been stuck in one
/// write for `bound` already (stderr a pipe nobody drains): an engine's
/// close and the process's exit do not lose their last lines, and are not
/// held by a stderr that takes nothing. True when all were written.
pub fn flush(bound: std::time::Duration) -> bool {
    stderr_queue::flush(bound)
}

/// The lines bound for stderr: a bounded queue that one thread of the
/// library (`orbite-log`) writes out, one `write` per line in the order
/// they came, so that no thread that logs (an I/O thread above all) ever
/// waits for stderr. When the queue holds [`stderr_queue::QUEUE_BYTES`] a
/// line is dropped; the count is reported by a line queued before the next
/// one that fits (or by the next flush).
mod stderr_queue {
    use super::{timestamp, SystemTime};
    use parking_lot::{Condvar, Mutex};
    use std::collections::VecDeque;
    use std::io::Write as _;
    use std::time::{Duration, Instant};

    /// Most bytes of lines waiting for stderr (or being written).
    pub(super) const QUEUE_BYTES: usize = 1 << 20;

    /// How long the process's exit waits for the lines still queued.
    const AT_EXIT: Duration = Duration::from_secs(1);

    /// What writes a line out (stderr, or a test's recorder).
    pub(super) type WriteLine = Box<dyn Fn(&str) + Send + Sync>;

    struct State {
        lines: VecDeque<String>,
        /// Bytes of the lines queued and of those being written.
        bytes: usize,
        /// Lines queued so far (drop reports included).
        queued: u64,
        /// Lines written so far.
        written: u64,
        /// Lines dropped since the last report was queued.
        dropped: u64,
        /// The writer is writing: since when, or since its last line.
        writing_since: Option<Instant>,
    }

    impl State {
        /// Queues the report of the lines dropped since the last one, if
        /// any (past the bound: it is short and says what went missing).
        fn report_drops(&mut self) -> bool {
            if self.dropped == 0 {
                return false;
            }
            let report = format!(
                "{} orbite WARN {} log lines were dropped: stderr did not take the lines before them in time\n",
                timestamp(SystemTime::now()),
                std::mem::take(&mut self.dropped)
            );
            self.bytes += report.len();
            self.queued += 1;
            self.lines.push_back(report);
            true
        }
    }

    /// A queue of lines and its writer thread.
    pub(super) struct Queue {
        state: Mutex<State>,
        /// Signalled when lines are queued.
        work: Condvar,
        /// Signalled when lines were written.
        done: Condvar,
        /// Most bytes queued.
        bound: usize,
        /// The process whose writer thread runs (a forked child has none:
        /// it writes its lines itself).
        owner: u32,
        write: WriteLine,
    }

    impl Queue {
        /// A queue of at most `bound` bytes whose thread (named
        /// `orbite-log`) hands each line to `write`, for the life of the
        /// process; `None` when the thread cannot start.
        pub(super) fn start(bound: usize, write: WriteLine) -> Option<&'static Queue> {
            let state =
                State { lines: VecDeque::new(), bytes: 0, queued: 0, written: 0, dropped: 0, writing_since: None };
            let q = Queue {
                state: Mutex::new(state),
                work: Condvar::new(),
                done: Condvar::new(),
                bound,
                owner: std::process::id(),
                write,
            };
            let q: &'static Queue = Box::leak(Box::new(q));
            std::thread::Builder::new().name("orbite-log".into()).spawn(move || q.write_out()).ok()?;
            Some(q)
        }

        /// Queues `line`; false when it was dropped (the queue is full).
        pub(super) fn push(&self, line: String) -> bool {
            if self.owner != std::process::id() {
                (self.write)(&line);
                return true;
            }
            let mut st = self.state.lock();
            if st.bytes + line.len() > self.bound {
                st.dropped += 1;
                return false;
            }
            st.report_drops();
            st.bytes += line.len();
            st.queued += 1;
            st.lines.push_back(line);
            drop(st);
            self.work.notify_one();
            true
        }

        /// Waits until every line queued before the call (and the report
        /// of lines dropped until then) was written, at most `bound`, and
        /// not at all when the writer has been in one line's write for
        /// `bound` already. True when all were written.
        pub(super) fn flush(&self, bound: Duration) -> bool {
            if self.owner != std::process::id() {
                return true;
            }
            let mut st = self.state.lock();
            if st.report_drops() {
                self.work.notify_one();
            }
            let target = st.queued;
            let deadline = Instant::now() + bound;
            while st.written < target {
                if st.writing_since.is_some_and(|t| t.elapsed() >= bound) {
                    return false;
                }
                if self.done.wait_until(&mut st, deadline).timed_out() {
                    return st.written >= target;
                }
            }
            true
        }

        /// The writer: takes what is queued and writes it out, line by
        /// line; the lock is never held while a line is written.
        fn write_out(&self) {
            let mut st = self.state.lock();
            loop {
                while st.lines.is_empty() {
                    st.writing_since = None;
                    self.done.notify_all();
                    self.work.wait(&mut st);
                }
                let lines = std::mem::take(&mut st.lines);
                st.writing_since = Some(Instant::now());
                drop(st);
                for line in lines {
                    (self.write)(&line);
                    let mut s = self.state.lock();
                    s.bytes -= line.len();
                    s.written += 1;
                    s.writing_since = Some(Instant::now());
                    drop(s);
                    self.done.notify_all();
                }
                st = self.state.lock();
            }
        }
    }

    /// The process's queue to stderr, started with its first line (`None`:
    /// its thread could not start, lines are written at once).
    static STDERR: once_cell::sync::OnceCell<Option<&'static Queue>> = once_cell::sync::OnceCell::new();

    fn stderr() -> Option<&'static Queue> {
        *STDERR.get_or_init(|| {
            let q = Queue::start(QUEUE_BYTES, Box::new(write_now))?;
            // SAFETY: registers a function of this library that never
            // unwinds; glibc runs it at exit (or when the library is
            // unloaded).
            unsafe { libc::atexit(at_exit) };
            Some(q)
        })
    }

    extern "C" fn at_exit() {
        let _ = std::panic::catch_unwind(|| flush(AT_EXIT));
    }

    /// Writes `line` to stderr, with one `write`.
    fn write_now(line: &str) {
        let _ = std::io::stderr().write_all(line.as_bytes());
    }

    /// Queues `line` for stderr; false when it was dropped.
    pub(super) fn push(line: String) -> bool {
        match stderr() {
            Some(q) => q.push(line),
            None => {
                write_now(&line);
                true
            }
        }
    }

    /// [`Queue::flush`] of the stderr queue, if it started.
    pub(super) fn flush(bound: Duration) -> bool {
        STDERR.get().copied().flatten().is_none_or(|q| q.flush(bound))
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
#[path = "log_tests.rs"]
mod tests;
