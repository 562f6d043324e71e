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

/// A writer that takes nothing (stderr a pipe nobody drains) never
/// holds the thread that logs: lines past the bound are dropped and
/// counted, the report of how many comes before the next line once it
/// takes lines again, and a flush is bounded, at once when the writer
/// has been stuck that long already. Guards `Queue::push`'s bound and
/// `report_drops`.
#[test]
fn a_stuck_writer_drops_lines_past_the_bound_and_reports_them() {
    use stderr_queue::Queue;
    let written = Arc::new(Mutex::new(Vec::<String>::new()));
    let open = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let (w, gate) = (written.clone(), open.clone());
    let q = Queue::start(
        1000,
        Box::new(move |line: &str| {
            let (lock, cv) = &*gate;
            let _open = cv.wait_while(lock.lock().unwrap(), |open| !*open).unwrap();
            w.lock().unwrap().push(line.to_string());
        }),
    )
    .unwrap();
    let line = |i: usize| format!("{i}{}\n", "x".repeat(298));
    // Three lines fit (the first one being written counts), every
    // further one is dropped; no call waits for the writer.
    let t0 = std::time::Instant::now();
    assert!((1..=3).all(|i| q.push(line(i))));
    assert!(!q.push(line(4)));
    assert!(!q.push(line(5)));
    assert!(t0.elapsed() < Duration::from_secs(10));
    // A flush gives up at its bound, and at once once the writer has
    // been stuck for that long.
    assert!(!q.flush(Duration::from_millis(100)));
    let t1 = std::time::Instant::now();
    assert!(!q.flush(Duration::from_millis(100)));
    assert!(t1.elapsed() < Duration::from_secs(5));
    // The writer takes lines again: what was queued, then the report
    // (queued by the flush), then the next line.
    *open.0.lock().unwrap() = true;
    open.1.notify_all();
    assert!(q.flush(Duration::from_secs(60)));
    assert!(q.push(line(6)));
    assert!(q.flush(Duration::from_secs(60)));
    let got = written.lock().unwrap().clone();
    assert_eq!(got.len(), 5, "{got:?}");
    assert_eq!(got[..3], [line(1), line(2), line(3)]);
    assert!(
        got[3].ends_with(" orbite WARN 2 log lines were dropped: stderr did not take the lines before them in time\n"),
        "{}",
        got[3]
    );
    assert_eq!(got[4], line(6));
}

#[test]
fn timestamps_are_utc_rfc3339() {
    assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
    let t = UNIX_EPOCH + Duration::from_micros(951_825_600_000_042); // a leap day
    assert_eq!(timestamp(t), "2000-02-29T12:00:00.000042Z");
    let t = UNIX_EPOCH + Duration::from_secs(1_798_761_599); // the last second of 2026
    assert_eq!(timestamp(t), "2026-12-31T23:59:59.000000Z");
}
