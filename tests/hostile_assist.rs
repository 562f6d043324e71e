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
        self.try_submit(peer, op, off, len, timeout).unwrap()
    }

    /// One request over TCP, `off` bytes into the local buffer, from the
    /// remote buffer's start: the batch, or why the submission failed.
    fn try_submit(&self, peer: u64, op: Op, off: u64, len: u64, timeout: Duration) -> Result<Batch> {
        let r =
            Request { op, local_addr: self.local.as_ptr() as u64 + off, remote_addr: self.remote.as_ptr() as u64, len };
        let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(timeout) };
        self.req.submit(peer, &[r], opts)
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
                        let b = match s.try_submit(fake, Op::Read, u * 8192, 4096, Duration::from_secs(60)) {
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

/// Polls `b` (each poll one non-blocking try that reads the answers
/// waiting, as a C caller's loop of `orbite_batch_status`) until it ends;
/// its final status.
fn poll_until_end(b: &Batch) -> Status {
    let give_up = Instant::now() + common::LONG;
    loop {
        match b.poll() {
            Status::Pending => assert!(Instant::now() < give_up, "the polled batch never ended"),
            s => return s,
        }
        std::thread::yield_now();
    }
}

/// A source answers a polled READ with garbage (a frame header of no
/// known kind, then more): the poller that reads it (or the I/O thread)
/// ends the connection, the READ fails PROTOCOL_ERROR, nothing landed,
/// and the peer is refused from then on. (An attack that held.)
#[test]
fn garbage_read_by_a_poller_fails_the_read_as_a_protocol_error() {
    let mut s = Setup::new();
    s.local[..4096].fill(0xee);
    let fake = s.connect_fake(|mut sock| {
        read_request(&mut sock);
        let _ = sock.write_all(&[0xa7; 64 << 10]);
        let _ = sock.read_to_end(&mut Vec::new());
    });
    let b = s.submit(fake, Op::Read, 0, 4096, common::LONG);
    assert_eq!(poll_until_end(&b), Status::TransferFailed);
    assert_eq!(b.results()[0].status, Status::ProtocolError, "{:?}", b.error(0));
    assert!(s.local[..4096].iter().all(|&x| x == 0xee), "bytes of the garbage landed");
    let again = s.try_submit(fake, Op::Read, 0, 8, common::LONG).map(|b| b.wait(common::LONG));
    assert!(!matches!(again, Ok(Ok(()))), "the connection that carried garbage still served");
}

/// A source sends half of a polled READ's answer and freezes (the
/// connection stays open): the polling caller's loop ends at the batch's
/// deadline, the READ TIMED_OUT; it never blocks in a poll. Then the
/// same with a source that resets mid-answer: UNAVAILABLE at once.
/// (Attacks that held.)
#[test]
fn a_source_freezing_or_resetting_mid_answer_ends_a_polled_read() {
    for reset in [false, true] {
        let s = Setup::new();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let fake = s.connect_fake(move |mut sock| {
            let tag = read_request(&mut sock);
            sock.write_all(&read_answer(tag, 4096, 0x5a)[..2048]).unwrap();
            if reset {
                common::reset(sock);
            } else {
                let _ = rx.recv();
            }
        });
        let timeout = if reset { common::LONG } else { Duration::from_secs(2) };
        let b = s.submit(fake, Op::Read, 0, 4096, timeout);
        assert_eq!(poll_until_end(&b), Status::TransferFailed);
        let want = if reset { Status::Unavailable } else { Status::TimedOut };
        assert_eq!(b.results()[0].status, want, "reset {reset}: {:?}", b.error(0));
        drop(tx);
    }
}

/// A batch's end hook that runs on the thread polling it (the poller
/// read the last answer) polls another batch of the same connection: no
/// deadlock on the connection's lock or the assist buffer (the hook runs
/// once the lock is released and the buffer given back); both READs land
/// exact bytes. The hook polls once and does not wait: a hook run by an
/// I/O thread delivering a turn's completions would wait for a
/// completion queued behind it (`Batch::on_end`: return promptly).
#[test]
fn an_end_hook_may_poll_and_submit_on_the_connection_it_ended_on() {
    let s = Setup::new();
    let fake = s.connect_fake(move |mut sock| {
        for byte in [0x11u8, 0x22] {
            let tag = read_request(&mut sock);
            sock.write_all(&read_answer(tag, 4096, byte)).unwrap();
        }
        let _ = sock.read_to_end(&mut Vec::new());
    });
    let a = s.submit(fake, Op::Read, 0, 4096, common::LONG);
    let (tx, rx) = std::sync::mpsc::channel();
    let second = s.submit(fake, Op::Read, 8192, 4096, common::LONG);
    // The hook holds the second batch (submitted ahead, so that the hook
    // needs no engine reference) and polls it.
    let held = std::sync::Mutex::new(Some(second));
    a.on_end(move || {
        let b = held.lock().unwrap().take().unwrap();
        let _ = b.poll();
        tx.send(b).unwrap();
    });
    assert_eq!(poll_until_end(&a), Status::Ok);
    let b = rx.recv_timeout(common::LONG).expect("the hook never ended");
    assert_eq!(poll_until_end(&b), Status::Ok);
    assert!(s.local[..4096].iter().all(|&x| x == 0x11));
    assert!(s.local[8192..12288].iter().all(|&x| x == 0x22));
}

/// A READ of a batch cancelled and dropped while in flight is answered
/// late, in front of another batch's answer, and read by that batch's
/// poller: the detached READ still runs to its outcome (cancel stops
/// only requests not started; its bytes land, the batch is gone), the
/// polled one lands exact bytes. (An attack that held.)
#[test]
fn a_dropped_batchs_late_answer_read_by_another_batchs_poller() {
    let s = Setup::new();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let fake = s.connect_fake(move |mut sock| {
        let first = read_request(&mut sock);
        let second = read_request(&mut sock);
        wait.recv().unwrap();
        let mut both = read_answer(first, 4096, 0x33);
        both.extend(read_answer(second, 4096, 0x44));
        sock.write_all(&both).unwrap();
        let _ = sock.read_to_end(&mut Vec::new());
    });
    let dropped = s.submit(fake, Op::Read, 0, 4096, common::LONG);
    let polled = s.submit(fake, Op::Read, 8192, 4096, common::LONG);
    dropped.cancel();
    drop(dropped);
    go.send(()).unwrap();
    assert_eq!(poll_until_end(&polled), Status::Ok);
    assert!(s.local[8192..12288].iter().all(|&x| x == 0x44));
    assert!(s.local[..4096].iter().all(|&x| x == 0x33), "the detached READ's answer did not land");
}

/// Resets `s` once the peer's kernel took every byte written (an abortive
/// close drops what is still queued to send: an answer held back by
/// Nagle would be the source's loss, not the requester's).
fn reset_once_taken(s: TcpStream) {
    use std::os::fd::AsRawFd;
    s.set_nodelay(true).unwrap();
    let give_up = Instant::now() + common::LONG;
    loop {
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ on an open socket, into a valid int.
        assert_eq!(unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut queued) }, 0);
        if queued == 0 {
            break;
        }
        assert!(Instant::now() < give_up, "the requester never took the answers");
        std::thread::yield_now();
    }
    common::reset(s);
}

/// Four users submit small READs and poll them (pollers and submitters
/// handing chunks to each other) while the source answers 300 and then
/// resets (once the answers were taken): every batch ends, the answered
/// ones OK, the rest UNAVAILABLE, none pending. (An attack that held.)
#[test]
fn pollers_and_submitters_racing_a_reset_leave_nothing_pending() {
    let s = Setup::new();
    let fake = s.connect_fake(move |mut sock| {
        for i in 0..300u32 {
            let tag = read_request(&mut sock);
            sock.write_all(&read_answer(tag, 4096, i as u8)).unwrap();
        }
        reset_once_taken(sock);
    });
    let s = &s;
    let oks: usize = std::thread::scope(|sc| {
        let users: Vec<_> = (0..4u64)
            .map(|u| {
                sc.spawn(move || {
                    let mut ok = 0;
                    loop {
                        let b = match s.try_submit(fake, Op::Read, u * 8192, 4096, common::LONG) {
                            Ok(b) => b,
                            Err(e) => {
                                assert_eq!(e.status(), Status::Unavailable, "{e}");
                                return ok;
                            }
                        };
                        match poll_until_end(&b) {
                            Status::Ok => ok += 1,
                            _ => assert_eq!(b.results()[0].status, Status::Unavailable, "{:?}", b.error(0)),
                        }
                    }
                })
            })
            .collect();
        users.into_iter().map(|u| u.join().unwrap()).sum()
    });
    assert_eq!(oks, 300, "every answered READ succeeded");
}

/// Keyed engines through a relay that flips one bit inside a small READ
/// answer, the caller polling: whoever reads the record (the poller or
/// the I/O thread) fails it as the I/O thread would, PERMISSION_DENIED
/// naming the failed check, and no flipped byte lands. (An attack that
/// held.)
#[test]
fn a_tampered_record_read_by_a_poller_fails_permission_denied() {
    const LEN: usize = 64 << 10;
    let key = common::key_file("assist-tamper", 0x5c);
    let config = format!(r#"{{"auth_key_file": "{key}", "io_threads": 1}}"#);
    let src = Engine::from_json(&config).unwrap();
    let req = Engine::from_json(&config).unwrap();
    let relay = common::relay::Relay::to(&src.endpoint());
    let peer = req.connect(&relay.endpoint(), Some(common::LONG)).unwrap();
    let remote: Vec<u8> = (0..LEN).map(|i| 1 + (i % 250) as u8).collect();
    let local = vec![0u8; LEN];
    src.register_memory(remote.as_ptr() as u64, LEN as u64, Access::READ_WRITE).unwrap();
    req.register_memory(local.as_ptr() as u64, LEN as u64, Access::READ_WRITE).unwrap();
    relay.leg(0).flip_down_ahead(LEN as u64 / 2);
    let r = Request {
        op: Op::Read,
        local_addr: local.as_ptr() as u64,
        remote_addr: remote.as_ptr() as u64,
        len: LEN as u64,
    };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(common::LONG) };
    let b = req.submit(peer, &[r], opts).unwrap();
    assert_eq!(poll_until_end(&b), Status::TransferFailed);
    let e = b.error(0).unwrap();
    assert_eq!(e.status(), Status::PermissionDenied, "{e}");
    assert!(e.message().contains("failed its check"), "{e}");
    assert!(local.iter().zip(&remote).all(|(l, r)| *l == 0 || l == r), "a flipped byte landed");
}
