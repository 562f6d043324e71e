//! An engine whose stderr is a pipe nobody drains keeps serving: its log
//! lines never hold the thread that logs them (an I/O thread above all);
//! past the queue's bound they are dropped, counted in the stats and
//! reported by a later line.

mod common;

use common::*;
use orbite::*;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

const LEN: u64 = 65536;

/// Each request's deadline: a request the source's stuck I/O thread does
/// not serve fails with it.
const DEADLINE: Duration = Duration::from_secs(20);

/// A pipe of one page (the smallest the kernel makes), as (read end,
/// write end).
fn small_pipe() -> (std::fs::File, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`; the result is checked.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just made and belong to nothing else.
    let (r, w) = unsafe { (std::fs::File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_SETPIPE_SZ on the pipe made above.
    assert!(unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) } >= 4096);
    (r, w)
}

/// A source whose stderr is `stderr`, logging at `debug`.
fn source(stderr: OwnedFd, seed: &str) -> PeerProc {
    let config = r#"{"log_level": "debug", "io_threads": 1}"#;
    let args = ["--shared", "--size", &LEN.to_string(), "--seed", seed, "--config", config];
    PeerProc::spawn_with_stderr(&args, Stdio::from(stderr))
}

/// One READ of the source's region over `kind`: its status.
fn read(e: &Engine, p: u64, local: &[u8], remote: u64, kind: TransportKind) -> Status {
    let req = [Request { op: Op::Read, local_addr: local.as_ptr() as u64, remote_addr: remote, len: LEN }];
    match e.submit(p, &req, SubmitOptions { transport: Transport::Only(kind), timeout: Some(DEADLINE) }) {
        Err(err) => err.status(),
        Ok(b) => {
            let _ = b.wait(LONG);
            b.results()[0].status
        }
    }
}

/// A requester engine with `LEN` bytes of registered local memory.
fn requester() -> (Engine, Vec<u8>) {
    let e = Engine::from_json(r#"{"log_level": "off"}"#).unwrap();
    let local = vec![0u8; LEN as usize];
    e.register_memory(local.as_ptr() as u64, LEN, Access::NONE).unwrap();
    (e, local)
}

/// Requesters that leave with an import in place make the source's one I/O
/// thread log a WARN each (their exports retained): 40 of them fill the
/// one-page pipe twice over. The source serves the next requester over
/// TCP and SHM all the same. Before, its I/O thread blocked in write(2)
/// once the pipe was full and every request on it timed out. Guards the
/// queue of `log::stderr_queue` (`emit` no longer writes stderr itself).
#[test]
fn a_source_whose_stderr_nobody_drains_keeps_serving() {
    let (_never_read, w) = small_pipe();
    let src = source(w, "5");
    for i in 0..40 {
        let (e, local) = requester();
        let p = e.connect(&src.endpoint, Some(DEADLINE)).unwrap();
        assert_eq!(read(&e, p, &local, src.addr, TransportKind::Tcp), Status::Ok, "requester {i} over TCP");
        assert_eq!(read(&e, p, &local, src.addr, TransportKind::Shm), Status::Ok, "requester {i} over SHM");
        // Freed without a close: its channel is lost with the import in place.
        drop(e);
    }
    let (e, mut local) = requester();
    let p = e.connect(&src.endpoint, Some(DEADLINE)).unwrap();
    assert_eq!(read(&e, p, &local, src.addr, TransportKind::Tcp), Status::Ok);
    assert_eq!(local, pattern_vec(5, LEN as usize));
    local.fill(0);
    assert_eq!(read(&e, p, &local, src.addr, TransportKind::Shm), Status::Ok);
    assert_eq!(local, pattern_vec(5, LEN as usize));
    // Each leaver's export was retained on its lost channel: 40 WARN lines.
    let src = std::cell::RefCell::new(src);
    eventually("every leaver's channel is seen lost", || {
        src.borrow_mut().stats()["ipc"]["shm"]["exports_retained"] == 40
    });
    e.close(Some(LONG)).unwrap();
}

/// Lines past the queue's bound (1 MiB) are dropped, never waited for:
/// the source's main thread logs two DEBUG lines per re-registration and
/// goes on answering; the stats count the drops, and once stderr takes
/// lines again a WARN line reports them. Guards `Queue::push`'s bound
/// (without it the queue grows without end) and `report_drops`.
#[test]
fn lines_past_the_bound_are_dropped_counted_and_reported() {
    let (mut r, w) = small_pipe();
    let mut src = source(w, "6");
    let pid = src.pid;
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        for _ in 0..7000 {
            assert_eq!(src.cmd("reregister"), "ok");
        }
        let _ = tx.send(());
        src
    });
    if rx.recv_timeout(LONG).is_err() {
        // SAFETY: kill(2) on our own child; no memory is touched.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        panic!("the source stopped answering while its stderr was full");
    }
    let mut src = worker.join().unwrap();
    let dropped = src.stats()["log_lines_dropped"].as_u64().unwrap();
    assert!(dropped > 0, "no line was dropped");
    let drain = std::thread::spawn(move || {
        let mut text = String::new();
        r.read_to_string(&mut text).unwrap();
        text
    });
    src.close();
    let text = drain.join().unwrap();
    let reported: u64 = text
        .lines()
        .filter_map(|l| {
            l.split(" orbite WARN ")
                .nth(1)?
                .strip_suffix(" log lines were dropped: stderr did not take the lines before them in time")
        })
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    assert!(reported >= dropped, "{reported} reported, {dropped} counted");
    assert!(text.lines().all(|l| l.contains(" orbite ")), "a line was cut or mixed");
}
