//! Notifications between real processes on loopback: a notification sent
//! with a WRITE arrives only once the bytes are in the receiver's memory
//! (the receiver checks them the instant it takes it), never after a failed
//! batch; a full queue refuses the sender; one sender's notifications keep
//! their order; a receiver that dies fails what waits for it.

mod common;

use common::*;
use orbite::*;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn engine(json: &str) -> Engine {
    Engine::from_json(json).expect("engine")
}

/// A registered local buffer holding `len` bytes of pattern `seed`.
fn local(e: &Engine, seed: u64, len: usize) -> Vec<u8> {
    let v = pattern_vec(seed, len);
    e.register_memory(v.as_ptr() as u64, len as u64, Access::NONE).unwrap();
    v
}

fn wr(local: &[u8], remote: u64, len: u64) -> Request {
    Request { op: Op::Write, local_addr: local.as_ptr() as u64, remote_addr: remote, len }
}

fn opts(t: Transport) -> SubmitOptions {
    SubmitOptions { transport: t, timeout: Some(LONG) }
}

fn notes(e: &Engine) -> orbite::engine::stats::NotificationStats {
    e.stats().notifications
}

/// `n` registered local blocks of 1 MiB, block `k` holding pattern
/// `seed + k`, and a WRITE of each to the same block of `src`'s buffer.
fn mib_writes(e: &Engine, src: &PeerProc, n: u64, seed: u64) -> (Vec<u8>, Vec<Request>) {
    let data: Vec<u8> = (0..n).flat_map(|k| pattern_vec(seed + k, MIB as usize)).collect();
    e.register_memory(data.as_ptr() as u64, n * MIB, Access::NONE).unwrap();
    let blocks = (0..n)
        .map(|k| Request {
            op: Op::Write,
            local_addr: data.as_ptr() as u64 + k * MIB,
            remote_addr: src.addr + k * MIB,
            len: MIB,
        })
        .collect();
    (data, blocks)
}

/// A WRITE with a notification, over `transport`: the receiver is already
/// waiting for the notification when the batch is submitted, and checks
/// the bytes the instant it takes it. Sixteen 1 MiB blocks, the message
/// naming the last one copied, so that a notification sent at enqueue
/// time would find it incomplete.
fn write_then_told(transport: TransportKind) {
    let mut src = PeerProc::spawn(&["--size", &(16 * MIB).to_string(), "--shared", "--seed", "1"]);
    let e = engine(r#"{"name": "prefill-7"}"#);
    let (_data, blocks) = mib_writes(&e, &src, 16, 9);
    let peer = e.connect(&src.endpoint, None).unwrap();
    for round in 0..3 {
        src.send("note 60000");
        let msg = format!("verify {} {} {MIB}", 9 + 15, 15 * MIB);
        let b = e.submit_with_notification(peer, &blocks, opts(Transport::Only(transport)), msg.as_bytes()).unwrap();
        b.wait(LONG).unwrap();
        assert_eq!(b.transport(15).unwrap(), Some(transport));
        assert!(matches!(b.notification(), Some(Ok(()))));
        assert_eq!(src.reply(), "prefill-7 ok", "round {round}");
        assert_eq!(src.cmd(&format!("verify 9 0 {MIB}")), "ok");
        src.cmd("fill 1");
    }
    let n = notes(&e);
    assert_eq!((n.sent, n.delivered, n.refused, n.not_sent), (3, 3, 0, 0));
    let theirs: serde_json::Value = src.stats()["notifications"].clone();
    assert_eq!((theirs["received"].as_u64(), theirs["queued"].as_u64()), (Some(3), Some(0)));
    e.close(Some(LONG)).unwrap();
    src.close();
}

#[test]
fn a_write_over_tcp_is_in_place_when_its_notification_is_taken() {
    write_then_told(TransportKind::Tcp);
}

#[test]
fn a_write_over_shm_is_in_place_when_its_notification_is_taken() {
    write_then_told(TransportKind::Shm);
}

/// A standalone notification sent while an earlier SHM WRITE still copies
/// (a 256 MiB group started on the copy pool: `submit` returned before its
/// bytes moved) leaves only once every byte of it is in the receiver's
/// memory: the receiver checks the last block, copied last, the instant it
/// takes the notification. (A batch still running when its submission
/// returns is listed for later notifications; one that ended is not.)
#[test]
fn a_notification_follows_a_write_still_copying_after_submit_returned() {
    const BLOCKS: u64 = 256;
    let mut src = PeerProc::spawn(&["--size", &(BLOCKS * MIB).to_string(), "--shared", "--seed", "1"]);
    let e = engine(r#"{"name": "prefill-8"}"#);
    let (_data, blocks) = mib_writes(&e, &src, BLOCKS, 100);
    let peer = e.connect(&src.endpoint, None).unwrap();
    for round in 0..2 {
        src.send("note 60000");
        let b = e.submit(peer, &blocks, opts(Transport::Only(TransportKind::Shm))).unwrap();
        assert_eq!(b.poll(), Status::Pending, "round {round}: the write still copies when submit returns");
        let last = BLOCKS - 1;
        e.notify(peer, format!("verify {} {} {MIB}", 100 + last, last * MIB).as_bytes(), Some(LONG)).unwrap();
        assert_eq!(src.reply(), "prefill-8 ok", "round {round}: the last block was in place");
        b.wait(LONG).unwrap();
        assert_eq!(src.cmd(&format!("verify 100 0 {MIB}")), "ok");
        src.cmd("fill 1");
    }
    e.close(Some(LONG)).unwrap();
    src.close();
}

/// A batch with a failed request sends nothing; its batch says why; a
/// later standalone notification still goes (it follows the failed batch,
/// which has ended).
#[test]
fn a_failed_write_delivers_nothing() {
    let mut src = PeerProc::spawn(&["--size", &MIB.to_string(), "--shared", "--access", "r"]);
    let e = engine("{}");
    let data = local(&e, 3, 8192);
    let peer = e.connect(&src.endpoint, None).unwrap();
    for t in [TransportKind::Tcp, TransportKind::Shm] {
        let reqs = [wr(&data, src.addr, 4096), wr(&data, src.addr + 4096, 4096)];
        let b = e.submit_with_notification(peer, &reqs, opts(Transport::Only(t)), b"never").unwrap();
        let err = b.wait(LONG).unwrap_err();
        assert_eq!(err.status(), Status::TransferFailed, "{err}");
        assert!(b.results().iter().all(|r| r.status == Status::PermissionDenied), "{:?}", b.results());
        let why = b.notification().expect("known").unwrap_err();
        assert_eq!(why.status(), Status::PermissionDenied, "{why}");
        assert!(why.message().contains("request 0 of its batch failed"), "{why}");
        assert!(b.notes().iter().any(|n| n.starts_with("notification: notification not sent")), "{:?}", b.notes());
    }
    e.notify(peer, b"after", Some(LONG)).unwrap();
    let sender = e.endpoint();
    assert_eq!(src.cmd("note 60000"), format!("{sender} unknown command \"after\""), "only the standalone one came");
    assert_eq!(src.cmd("note 0"), "none ORBITE_STATUS_TIMED_OUT");
    let n = notes(&e);
    assert_eq!((n.sent, n.delivered, n.not_sent), (1, 1, 2));
    src.close();
}

/// The receiver holds at most `notification_queue`; beyond it the sender's
/// call fails RESOURCE_EXHAUSTED and nothing is dropped; taking one makes
/// room. Oversize messages fail at the sender (its own limit) and at the
/// receiver (a smaller limit there).
#[test]
fn a_full_queue_refuses_the_sender_and_sizes_are_checked_both_ends() {
    let mut src = PeerProc::spawn(&[
        "--size",
        &MIB.to_string(),
        "--config",
        r#"{"notification_queue": 2, "notification_max_bytes": 100}"#,
    ]);
    let e = engine(r#"{"name": "n1", "notification_max_bytes": 200}"#);
    let peer = e.connect(&src.endpoint, None).unwrap();
    e.notify(peer, b"stats", Some(LONG)).unwrap();
    e.notify(peer, b"stats", Some(LONG)).unwrap();
    let full = e.notify(peer, b"stats", Some(LONG)).unwrap_err();
    assert_eq!(full.status(), Status::ResourceExhausted, "{full}");
    assert!(full.message().contains("queue is full"), "{full}");
    assert!(src.cmd("note 1000").starts_with("n1 {"), "the first one is still there");
    e.notify(peer, b"stats", Some(LONG)).unwrap();
    let big = e.notify(peer, &[b'x'; 150], Some(LONG)).unwrap_err();
    assert_eq!(big.status(), Status::InvalidArgument, "{big}");
    assert!(big.message().contains("notification_max_bytes (100)"), "{big}");
    let mine = e.notify(peer, &[b'x'; 201], Some(LONG)).unwrap_err();
    assert_eq!(mine.status(), Status::InvalidArgument, "{mine}");
    assert!(mine.message().contains("notification_max_bytes (200)"), "{mine}");
    let n = notes(&e);
    assert_eq!((n.sent, n.delivered, n.refused), (5, 3, 2));
    let theirs = src.stats()["notifications"].clone();
    assert_eq!(
        (theirs["received"].as_u64(), theirs["rejected"].as_u64(), theirs["queued"].as_u64()),
        (Some(3), Some(2), Some(2))
    );
    // The connection survived both refusals.
    assert!(src.cmd("note 1000").starts_with("n1 {"));
    src.close();
}

/// A notification of exactly `notification_max_bytes`, from a sender
/// whose name has the longest length allowed (64 bytes), is sent and
/// queued whole: its Notify body is exactly the receiver's bound (tag,
/// name length, 64-byte name, the message). Guards the sender's check
/// `if msg.len() > most {` in engine/notify.rs (round 12 L6) and the
/// receiver's `if len > NOTIFY_OVERHEAD + host.notify_max() {` in
/// tcp/proto/source/receive.rs (round 12 L10): with `>=` either refuses
/// it INVALID_ARGUMENT.
#[test]
fn a_notification_of_exactly_the_bound_from_a_64_byte_name_is_queued() {
    const MOST: usize = 100;
    let name = "n".repeat(64);
    let receiver = engine(&format!(r#"{{"notification_max_bytes": {MOST}}}"#));
    let sender = engine(&format!(r#"{{"name": "{name}", "notification_max_bytes": {MOST}}}"#));
    let peer = sender.connect(&receiver.endpoint(), None).unwrap();
    let msg: Vec<u8> = (0..MOST as u8).collect();
    sender.notify(peer, &msg, Some(LONG)).unwrap();
    let got = receiver.take_notification(LONG).unwrap();
    assert_eq!((got.sender.as_str(), got.msg.as_slice()), (name.as_str(), msg.as_slice()));
    let n = notes(&sender);
    assert_eq!((n.sent, n.delivered, n.refused), (1, 1, 0));
    let theirs = notes(&receiver);
    assert_eq!((theirs.received, theirs.rejected), (1, 0));
    sender.close(Some(LONG)).unwrap();
    receiver.close(Some(LONG)).unwrap();
}

/// 10 000 notifications from one sender, one in ten sent with a WRITE
/// batch that the next ones must wait for: they arrive in order.
#[test]
fn ten_thousand_notifications_keep_their_order() {
    let mut src = PeerProc::spawn(&[
        "--size",
        &MIB.to_string(),
        "--shared",
        "--config",
        r#"{"notification_queue": 16384, "notification_max_bytes": 16}"#,
    ]);
    let e = engine(r#"{"notification_max_bytes": 16}"#);
    let data = local(&e, 5, 4096);
    let peer = e.connect(&src.endpoint, None).unwrap();
    let mut batches = Vec::new();
    for i in 0..10_000u64 {
        let msg = i.to_string();
        if i % 10 == 0 {
            let t = if i % 20 == 0 { TransportKind::Tcp } else { TransportKind::Shm };
            let r = wr(&data, src.addr + (i % 256) * 4096, 4096);
            batches.push(e.submit_with_notification(peer, &[r], opts(Transport::Only(t)), msg.as_bytes()).unwrap());
        } else {
            e.notify(peer, msg.as_bytes(), Some(LONG)).unwrap();
        }
    }
    for b in &batches {
        b.wait(LONG).unwrap();
    }
    assert_eq!(src.cmd("notes 10000 60000"), "ok");
    assert_eq!(notes(&e).delivered, 10_000);
    src.close();
}

/// A receiver that dies: the standalone notification waiting for its
/// answer fails with the connection's error, and so does the batch whose
/// notification was waiting for the WRITE; neither reports delivery.
#[test]
fn a_killed_receiver_fails_what_waits_for_it() {
    let src = PeerProc::spawn(&["--size", &(64 * MIB).to_string(), "--shared"]);
    let e = engine(r#"{"default_timeout_ms": 120000}"#);
    let data = local(&e, 2, (64 * MIB) as usize);
    let peer = e.connect(&src.endpoint, None).unwrap();
    e.notify(peer, b"stats", Some(LONG)).unwrap();
    src.freeze();
    let b = e
        .submit_with_notification(
            peer,
            &[wr(&data, src.addr, 64 * MIB)],
            opts(Transport::Only(TransportKind::Tcp)),
            b"w",
        )
        .unwrap();
    std::thread::scope(|s| {
        let alone = s.spawn(|| e.notify(peer, b"alone", Some(LONG)));
        // The standalone one waits behind the WRITE; neither can finish
        // while the receiver is frozen.
        assert_eq!(b.wait(Duration::from_millis(300)).unwrap_err().status(), Status::TimedOut);
        src.kill();
        let err = alone.join().unwrap().unwrap_err();
        assert_eq!(err.status(), Status::Unavailable, "{err}");
    });
    assert_eq!(b.wait(LONG).unwrap_err().status(), Status::TransferFailed);
    let why = b.notification().expect("known").unwrap_err();
    assert_eq!(why.status(), Status::Unavailable, "{why}");
    let n = notes(&e);
    assert_eq!((n.sent, n.delivered, n.not_sent), (1, 1, 2));
}

/// A notification to a peer already known gone (its process killed, the
/// connection ended) is refused at once with the connection's error and
/// counts in `notifications.not_sent`, not in `sent`. Guards the
/// `notifications.not_sent` count in engine/notify.rs (round 13 M7).
#[test]
fn a_notification_to_a_peer_known_gone_counts_not_sent() {
    let src = PeerProc::spawn(&["--size", &MIB.to_string()]);
    let e = engine("{}");
    let peer = e.connect(&src.endpoint, None).unwrap();
    e.notify(peer, b"stats", Some(LONG)).unwrap();
    src.kill();
    eventually("the connection to the killed peer ended", || e.stats().peers_alive == 0);
    let err = e.notify(peer, b"late", Some(LONG)).unwrap_err();
    assert_eq!(err.status(), Status::Unavailable, "{err}");
    assert!(err.message().contains(&format!("peer {peer} is gone")), "{err}");
    let n = notes(&e);
    assert_eq!((n.sent, n.delivered, n.not_sent), (1, 1, 1));
    e.close(Some(LONG)).unwrap();
}

/// `take_notification` answers TIMED_OUT when nothing came, and names a
/// sender without a name by its endpoint.
#[test]
fn take_waits_and_names_the_sender() {
    let a = engine(r#"{"name": "decode-3"}"#);
    let b = engine("{}");
    let t = std::time::Instant::now();
    assert_eq!(a.take_notification(Duration::from_millis(50)).unwrap_err().status(), Status::TimedOut);
    assert!(t.elapsed() >= Duration::from_millis(50));
    let to_a = b.connect(&a.endpoint(), None).unwrap();
    let to_b = a.connect(&b.endpoint(), None).unwrap();
    b.notify(to_a, b"from b", None).unwrap();
    a.notify(to_b, b"", None).unwrap();
    let got = a.take_notification(LONG).unwrap();
    assert_eq!((got.sender.as_str(), got.msg.as_slice()), (b.endpoint().as_str(), &b"from b"[..]));
    let got = b.take_notification(LONG).unwrap();
    assert_eq!((got.sender.as_str(), got.msg.len()), ("decode-3", 0));
}

/// A standalone notification whose deadline passes, to a receiver frozen
/// (SIGSTOP) for the whole exchange. Sent at once (nothing before it) but
/// never answered: TIMED_OUT saying its delivery is unknown, not counted
/// `not_sent`. Queued behind a WRITE that cannot end: TIMED_OUT saying it
/// was not sent, counted `not_sent`, and taken off the queue, so once the
/// receiver runs again it never arrives (the receiver takes "0", "1" and
/// "2", in that order, and counts three). Guards `Outbox::cancel`'s
/// `s.queue.len() != before` in `transport/tcp/outbox.rs` (round 17 R9:
/// inverted, the queued one is reported sent with delivery unknown and
/// the unanswered one reported not sent).
#[test]
fn a_timed_out_notification_says_whether_it_left_the_queue() {
    let mut src = PeerProc::spawn(&["--size", &MIB.to_string(), "--shared"]);
    let e = engine("{}");
    let data = local(&e, 3, 4096);
    let peer = e.connect(&src.endpoint, None).unwrap();
    e.notify(peer, b"0", Some(LONG)).unwrap();
    src.freeze();
    let unanswered = e.notify(peer, b"1", Some(Duration::from_secs(1))).unwrap_err();
    assert_eq!(unanswered.status(), Status::TimedOut, "{unanswered}");
    assert!(unanswered.message().contains("no answer before the deadline (its delivery is unknown)"), "{unanswered}");
    assert_eq!(notes(&e).not_sent, 0, "an unanswered notification was counted unsent");
    let b = e.submit(peer, &[wr(&data, src.addr, 4096)], opts(Transport::Only(TransportKind::Tcp))).unwrap();
    let queued = e.notify(peer, b"queued", Some(Duration::from_secs(1))).unwrap_err();
    assert_eq!(queued.status(), Status::TimedOut, "{queued}");
    assert!(
        queued.message().contains("not sent: requests submitted before it had not ended by the deadline"),
        "{queued}"
    );
    assert_eq!(notes(&e).not_sent, 1);
    src.signal(libc::SIGCONT);
    b.wait(LONG).unwrap();
    e.notify(peer, b"2", Some(LONG)).unwrap();
    let n = notes(&e);
    assert_eq!((n.sent, n.not_sent), (3, 1));
    assert_eq!(src.cmd("notes 3 60000"), "ok", "the queued one reached the wire");
    assert_eq!(src.stats()["notifications"]["received"].as_u64(), Some(3));
    e.close(Some(LONG)).unwrap();
    src.close();
}
