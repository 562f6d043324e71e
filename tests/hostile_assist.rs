//! Hostile sources and concurrent users against the waiter-assisted
//! receive (a small batch's waiter reads its TCP connection itself while
//! it spins: `transfer::Assist`, `TcpConnection::assist`).

mod common;

use common::{pattern_vec, read_request};
use orbite::control::frame::{FrameHeader, MsgKind};
use orbite::control::message::DataResponse;
use orbite::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

struct Setup {
    src: Engine,
    req: Engine,
    remote: Vec<u8>,
    local: Vec<u8>,
}

impl Setup {
    fn new() -> Setup {
        let src = Engine::from_json("").unwrap();
        let remote = pattern_vec(9, 1 << 20);
        src.register_memory(remote.as_ptr() as u64, remote.len() as u64, Access::READ_WRITE).unwrap();
        let req = Engine::from_json(r#"{"io_threads": 1}"#).unwrap();
        let local = vec![0u8; 4 << 20];
        req.register_memory(local.as_ptr() as u64, local.len() as u64, Access::READ_WRITE).unwrap();
        Setup { src, req, remote, local }
    }

    /// A fake source (handshake answered with the real source's Describe,
    /// TCP only) that then `behave`s; its peer id.
    fn connect_fake(&self, behave: impl FnOnce(TcpStream) + Send + 'static) -> u64 {
        common::connect_fake_source(&self.req, &self.src.endpoint(), behave)
    }

    fn submit(&self, peer: u64, op: Op, off: u64, len: u64, timeout: Duration) -> Batch {
        let r =
            Request { op, local_addr: self.local.as_ptr() as u64 + off, remote_addr: self.remote.as_ptr() as u64, len };
        let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(timeout) };
        self.req.submit(peer, &[r], opts).unwrap()
    }
}

/// A READ answer of `len` bytes of `byte`.
fn read_answer(tag: u64, len: usize, byte: u8) -> Vec<u8> {
    let fixed = DataResponse { tag, status: Status::Ok }.encode();
    let mut v = FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + len) as u32).to_vec();
    v.extend_from_slice(&fixed);
    v.extend(std::iter::repeat_n(byte, len));
    v
}

/// Waits for `b` in short waits, as a C caller polling with a small
/// timeout would; returns the longest single wait.
fn wait_in_short_waits(b: &Batch, each: Duration) -> Duration {
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut longest = Duration::ZERO;
    loop {
        let t = Instant::now();
        let r = b.wait(each);
        longest = longest.max(t.elapsed());
        match r {
            Ok(()) => return longest,
            Err(e) if e.status() == Status::TimedOut => {}
            Err(e) => panic!("batch failed: {e}"),
        }
        assert!(Instant::now() < give_up, "the batch never ended");
    }
}

/// A source that puts 256 KiB of `Revoke` frames (16 bytes each, valid,
/// each running the engine's revoke hook, which spawns a thread) in front
/// of every answer: a caller's short wait must still return near its
/// timeout, not after the waiter has run thousands of hooks.
#[test]
fn a_revoke_flood_does_not_hold_a_short_wait_past_its_timeout() {
    const ROUNDS: usize = 24;
    let s = Setup::new();
    let revoke = FrameHeader::encode(MsgKind::Revoke, 0);
    let flood: Vec<u8> = revoke.iter().copied().cycle().take(revoke.len() * 16384).collect();
    let fake = s.connect_fake(move |mut sock| {
        for _ in 0..ROUNDS {
            let tag = read_request(&mut sock);
            let mut burst = flood.clone();
            burst.extend(read_answer(tag, 4096, 0x5a));
            sock.write_all(&burst).unwrap();
        }
        let _ = sock.read_to_end(&mut Vec::new());
    });
    let mut longest = Duration::ZERO;
    let mut all = Vec::new();
    for _ in 0..ROUNDS {
        let b = s.submit(fake, Op::Read, 0, 4096, Duration::from_secs(120));
        let l = wait_in_short_waits(&b, Duration::from_millis(1));
        all.push(l);
        longest = longest.max(l);
    }
    eprintln!("longest single wait(1 ms) per round: {all:?}");
    assert!(
        longest < Duration::from_millis(200),
        "a wait of 1 ms returned after {longest:?}: the waiter ran the source's Revoke flood itself"
    );
}

/// A `Batch` kept in a thread-local that waits for its batch when the
/// thread ends (a per-thread pool of transfers drained on exit): by then
/// the thread-local scratch buffer `TcpConnection::assist` borrows may be
/// destroyed already (destructors run in reverse order of first use), and
/// `ASSIST_SCRATCH.with` panics, inside a thread-local destructor, which
/// aborts the process. Before the waiter assisted, `Batch::wait` touched no
/// thread-local. Run in a child process (the failure is an abort).
#[test]
fn a_batch_waited_for_in_a_thread_local_destructor_does_not_abort() {
    const CHILD: &str = "HOSTILE_ASSIST_TLS_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_batch_waited_for_in_a_thread_local_destructor_does_not_abort", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the child ended with {:?}:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    struct WaitOnDrop(Option<Batch>);
    impl Drop for WaitOnDrop {
        fn drop(&mut self) {
            if let Some(b) = self.0.take() {
                let r = b.wait(Duration::from_millis(5));
                eprintln!("wait in the destructor: {r:?}");
            }
        }
    }
    thread_local! {
        static HELD: std::cell::RefCell<WaitOnDrop> = const { std::cell::RefCell::new(WaitOnDrop(None)) };
    }
    let s = Setup::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    // A source that takes the requests and never answers.
    let silent = s.connect_fake(move |mut sock| {
        read_request(&mut sock);
        read_request(&mut sock);
        let _ = rx.recv();
    });
    let s = &s;
    std::thread::scope(|sc| {
        sc.spawn(move || {
            // HELD is first used (its destructor registered) before any wait.
            HELD.with(|_| {});
            let first = s.submit(silent, Op::Read, 0, 4096, Duration::from_secs(60));
            assert!(first.wait(Duration::from_millis(2)).is_err(), "the silent source answered");
            let kept = s.submit(silent, Op::Read, 8192, 4096, Duration::from_secs(60));
            HELD.with(|h| h.borrow_mut().0 = Some(kept));
        })
        .join()
        .unwrap();
    });
    drop(tx);
}

/// Four users wait (in short waits, so that they assist) on READs from a
/// source that answers 300 of them, then stops mid-header and closes:
/// whoever reads the end (a waiter or the I/O thread), every batch ends,
/// none stays pending, the failed ones UNAVAILABLE, and the peer is then
/// refused. (A check that passes: the end is handled under the receive
/// lock, once.)
#[test]
fn waiters_racing_the_io_thread_at_the_end_leave_nothing_pending() {
    let s = Setup::new();
    let fake = s.connect_fake(move |mut sock| {
        for i in 0..300u32 {
            let tag = read_request(&mut sock);
            sock.write_all(&read_answer(tag, 4096, i as u8)).unwrap();
        }
        let _ = sock.write_all(&FrameHeader::encode(MsgKind::ReadResponse, 4096 + 16)[..7]);
        let _ = sock.shutdown(std::net::Shutdown::Both);
    });
    let s = &s;
    let (oks, fails) = std::thread::scope(|sc| {
        let users: Vec<_> = (0..4u64)
            .map(|u| {
                sc.spawn(move || {
                    let (mut ok, mut failed) = (0, 0);
                    loop {
                        let r = Request {
                            op: Op::Read,
                            local_addr: s.local.as_ptr() as u64 + u * 8192,
                            remote_addr: s.remote.as_ptr() as u64,
                            len: 4096,
                        };
                        let opts = SubmitOptions {
                            transport: Transport::Only(TransportKind::Tcp),
                            timeout: Some(Duration::from_secs(60)),
                        };
                        let b = match s.req.submit(fake, &[r], opts) {
                            Ok(b) => b,
                            Err(e) => {
                                assert_eq!(e.status(), Status::Unavailable, "{e}");
                                return (ok, failed);
                            }
                        };
                        let give_up = Instant::now() + Duration::from_secs(60);
                        loop {
                            match b.wait(Duration::from_millis(1)) {
                                Ok(()) => {
                                    ok += 1;
                                    break;
                                }
                                Err(e) if e.status() == Status::TimedOut => {
                                    assert!(Instant::now() < give_up, "a batch stayed pending");
                                }
                                Err(_) => {
                                    let st = b.results()[0].status;
                                    assert!(matches!(st, Status::Unavailable), "unexpected {st:?}: {:?}", b.error(0));
                                    failed += 1;
                                    break;
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        users.into_iter().map(|u| u.join().unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    assert_eq!(oks, 300, "every answered READ succeeded");
    eprintln!("300 ok, {fails} ended UNAVAILABLE at the end");
}
