use super::*;
use crate::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use crate::control::identity::Identity;
use crate::control::message::DATA_REQUEST_LEN;
use crate::control::message::{DataRequest, DataResponse, DATA_RESPONSE_LEN};
use crate::error::Status;
use crate::kinds::TransportKind;
use crate::memory::{Access, RegionTable};
use crate::sync::admission::Budget;
use crate::transfer::{BatchShared, Op, Request};
use crate::transport::tcp::chunk::Step;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

/// A connection to a listener on loopback whose only I/O thread is
/// stopped: whatever moves, the calling thread moved. Returns the
/// source's end of the socket too.
fn connected(stats: &Arc<Counters>) -> (Arc<TcpConnection>, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (peer, _) = listener.accept().unwrap();
    let reactor = Reactor::new(1, Duration::ZERO);
    let log = Arc::new(crate::log::Logger::new(crate::log::Level::Off, "test"));
    let describe = Describe::bare(Identity::fresh().unwrap());
    let conn = TcpConnection::start(
        (client, Wire::Plain),
        describe,
        "test peer".into(),
        stats.clone(),
        Box::new(|| {}),
        &reactor,
        log,
    )
    .unwrap();
    reactor.stop();
    (conn, peer)
}

/// Why the connection ended, from the published snapshot.
fn ended(conn: &TcpConnection) -> Error {
    match &*conn.describe_live() {
        Ok(_) => panic!("the snapshot says the connection lives"),
        Err(e) => e.clone(),
    }
}

/// A submission reads the peer's Describe while another thread holds
/// the connection's lock (as an I/O turn does): from the published
/// snapshot. Once the connection is killed the snapshot gives the
/// end's reason, and once the peer is retired the retirement's (it
/// replaces the loss's). Guards `describe_live` reading the snapshot
/// and `publish` in `unlock`.
#[test]
fn the_describe_is_read_without_the_connections_lock_and_ends_with_it() {
    let (conn, _peer) = connected(&Arc::new(Counters::default()));
    let epoch = conn.describe().identity.engine_epoch;
    let held = conn.state.lock();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = conn.clone();
    let t = std::thread::spawn(move || {
        let epoch = reader.describe_live().as_ref().as_ref().map(|d| d.describe().identity.engine_epoch).ok();
        tx.send(epoch).unwrap()
    });
    let got = rx.recv_timeout(Duration::from_secs(20));
    drop(held);
    t.join().unwrap();
    assert_eq!(got.expect("read while the lock is held"), Some(epoch));
    conn.kill(Error::Unavailable("lost".into()));
    let e = ended(&conn);
    assert_eq!((e.status(), e.message()), (Status::Unavailable, "lost"));
    conn.retire(Error::from_status(Status::StalePeer, "retired"));
    let e = ended(&conn);
    assert_eq!((e.status(), e.message()), (Status::StalePeer, "retired"));
}

/// A thread waiting for a fresh Describe learns at once that the
/// connection ended (here killed, as the I/O thread does when it reads
/// the peer's end), not at its deadline a minute later. Guards the wake
/// of `deliver` on `Event::DescribeLost`.
#[test]
fn a_describe_waiter_learns_the_end_at_once() {
    let stats = Arc::new(Counters::default());
    let (conn, _peer) = connected(&stats);
    let (tx, rx) = std::sync::mpsc::channel();
    let c = conn.clone();
    std::thread::spawn(move || {
        let r = c.refresh_describe(Instant::now() + Duration::from_secs(60));
        let _ = tx.send(r.map(|_| ()).map_err(|e| e.status()));
    });
    // The request is queued, and the waiter released the lock only to
    // wait: it waits now.
    let give_up = Instant::now() + Duration::from_secs(60);
    while conn.outstanding() == 0 {
        assert!(Instant::now() < give_up, "the Describe request was never queued");
        std::thread::yield_now();
    }
    let t0 = Instant::now();
    conn.kill(Error::Unavailable("test peer closed the connection".into()));
    let got = rx.recv_timeout(Duration::from_secs(20)).expect("the waiter slept on after the end");
    assert_eq!(got, Err(Status::Unavailable));
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// A batch of one 4096-byte READ of remote 0x7000 into `local`
/// (registered in `regions`), planned on TCP.
struct OneRead {
    local: Vec<u8>,
    regions: RegionTable,
    deadline: Instant,
    batch: Arc<BatchShared>,
}

impl OneRead {
    fn new(stats: Arc<Counters>) -> OneRead {
        let mut local = vec![0u8; 4096];
        let addr = local.as_mut_ptr() as u64;
        let regions = RegionTable::default();
        regions.register(addr, 4096, Access::READ | Access::WRITE).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let req = Request { op: Op::Read, local_addr: addr, remote_addr: 0x7000, len: 4096 };
        let batch = BatchShared::new(&[req], stats, deadline);
        batch.plan(0, 1, TransportKind::Tcp);
        OneRead { local, regions, deadline, batch }
    }
}

/// An admission step of one chunk of `bytes` of `batch`, on a budget and
/// gates of its own.
fn one_step(batch: &Arc<BatchShared>, bytes: u64) -> Step {
    let permit = Budget::new(bytes).try_acquire(bytes).unwrap();
    let guards = Gate::new("requester gate").enter_many(1).unwrap();
    Step::new(batch, permit, guards, Gate::new("connection gate").enter_many(1).unwrap())
}

/// The chunk of that READ into `addr`.
fn read_chunk(batch: &Arc<BatchShared>, regions: &RegionTable, addr: u64, deadline: Instant) -> Chunk {
    read_chunk_of(batch, regions, (0, addr, 4096), deadline)
}

/// The chunk of request `index` of `batch`: a READ of `len` bytes of
/// remote 0x7000 into `addr` (registered in `regions`).
fn read_chunk_of(
    batch: &Arc<BatchShared>,
    regions: &RegionTable,
    (index, addr, len): (usize, u64, u64),
    deadline: Instant,
) -> Chunk {
    let epoch = regions.lease(addr, len).unwrap().region().epoch;
    Chunk {
        op: Op::Read,
        local_addr: addr,
        remote_addr: 0x7000,
        len,
        region_epoch: epoch,
        deadline,
        done: one_step(batch, len).record(index, 1, len),
        hold: Arc::new(regions.lease(addr, len).unwrap()),
    }
}

/// A batch's waiter reads its answer itself: the connection's only I/O
/// thread is stopped before the request leaves, so nothing else could
/// (without `assist` the batch stays pending).
#[test]
fn a_spinning_waiter_reads_its_answer_itself() {
    let stats = Arc::new(Counters::default());
    let (conn, mut peer) = connected(&stats);
    let OneRead { mut local, regions, deadline, batch } = OneRead::new(stats);
    batch.assisted_by(Arc::downgrade(&conn) as std::sync::Weak<dyn Assist>);
    conn.enqueue(vec![read_chunk(&batch, &regions, local.as_mut_ptr() as u64, deadline)]);

    let payload = answer_one_read(&mut peer);

    // Each wait spins (and assists) before it sleeps for the rest of
    // its millisecond; a loaded machine may take several.
    let give_up = Instant::now() + Duration::from_secs(20);
    while batch.wait(Duration::from_millis(1)) == Status::Pending {
        assert!(Instant::now() < give_up, "the waiter never read its answer");
    }
    assert_eq!(batch.poll(), Status::Ok);
    assert_eq!(local, payload);
    drop(batch);
    conn.kill(Error::Unavailable("test over".into()));
}

/// A waiter that does not spin (here a zero timeout; on a busy host,
/// `spin::allowed` off) still reads an answer already waiting, once,
/// before it sleeps. Guards the one `assist` try in `BatchShared::wait`
/// (without it the batch stays pending: the I/O thread is stopped).
#[test]
fn a_waiter_that_does_not_spin_reads_a_waiting_answer() {
    let stats = Arc::new(Counters::default());
    let (conn, mut peer) = connected(&stats);
    let OneRead { mut local, regions, deadline, batch } = OneRead::new(stats);
    batch.assisted_by(Arc::downgrade(&conn) as std::sync::Weak<dyn Assist>);
    conn.enqueue(vec![read_chunk(&batch, &regions, local.as_mut_ptr() as u64, deadline)]);
    let payload = answer_one_read(&mut peer);
    let give_up = Instant::now() + Duration::from_secs(20);
    while batch.wait(Duration::ZERO) == Status::Pending {
        assert!(Instant::now() < give_up, "the waiter never read its answer");
        std::thread::yield_now();
    }
    assert_eq!(local, payload);
    drop(batch);
    conn.kill(Error::Unavailable("test over".into()));
}

/// Reads the one READ request the connection sent (it left from the
/// calling thread) and answers it; returns the payload sent.
fn answer_one_read(peer: &mut TcpStream) -> Vec<u8> {
    let mut frame = [0u8; FRAME_HEADER_LEN + DATA_REQUEST_LEN];
    peer.read_exact(&mut frame).unwrap();
    let h = FrameHeader::decode(frame[..FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!(h.kind, MsgKind::ReadRequest);
    let r = DataRequest::decode(frame[FRAME_HEADER_LEN..].try_into().unwrap()).unwrap();
    assert_eq!((r.addr, r.len), (0x7000, 4096));
    let payload: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    peer.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (DATA_RESPONSE_LEN + 4096) as u32)).unwrap();
    peer.write_all(&DataResponse { tag: r.tag, status: Status::Ok }.encode()).unwrap();
    peer.write_all(&payload).unwrap();
    payload
}

/// Bytes waiting in `s`'s receive queue (`FIONREAD`).
fn waiting(s: &TcpStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD on an open socket, into a valid int.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(r, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    n as usize
}

/// Lets `s` queue `bytes` received (`SO_RCVBUFFORCE` where allowed, else
/// up to the host's `rmem_max`); asserts it may queue at least 4 MiB.
fn receive_buffer(s: &TcpStream, bytes: libc::c_int) {
    let set = |opt| {
        // SAFETY: setsockopt on an open socket, with a valid int.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    if set(libc::SO_RCVBUFFORCE) != 0 {
        assert_eq!(set(libc::SO_RCVBUF), 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
    }
    let (mut got, mut len): (libc::c_int, libc::socklen_t) = (0, std::mem::size_of::<libc::c_int>() as _);
    // SAFETY: getsockopt on an open socket, into a valid int and its length.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut got as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "getsockopt SO_RCVBUF: {}", std::io::Error::last_os_error());
    assert!(got >= 4 << 20, "the receive buffer is {got} bytes: this test needs 4 MiB (root, or net.core.rmem_max)");
}

/// A source floods answers: megabytes of READ payload (1 MiB answers,
/// which land straight in local memory) wait on the socket, and one
/// assist, given all the time it wants, takes at most its 256 KiB off
/// it: a poller or waiter reading for another batch is not held
/// copying a large batch's megabytes (the I/O thread takes over). Guards
/// the budget in `assist` (`ASSIST_BYTES`) and `pump::receive` capping
/// each read at the budget left (without it one read into memory takes
/// all the socket holds, about 1 MiB here).
#[test]
fn one_assist_takes_at_most_its_budget_off_a_flooded_socket() {
    const N: usize = 8;
    const LEN: usize = 1 << 20;
    let stats = Arc::new(Counters::default());
    let (conn, mut peer) = connected(&stats);
    receive_buffer(&conn.stream, 8 << 20);
    let mut local = vec![0u8; N * LEN];
    let base = local.as_mut_ptr() as u64;
    let regions = RegionTable::default();
    regions.register(base, (N * LEN) as u64, Access::READ | Access::WRITE).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let at = |i: usize| base + (i * LEN) as u64;
    let reqs: Vec<_> =
        (0..N).map(|i| Request { op: Op::Read, local_addr: at(i), remote_addr: 0x7000, len: LEN as u64 }).collect();
    let batch = BatchShared::new(&reqs, stats, deadline);
    batch.plan_each(0..N, 1, TransportKind::Tcp);
    conn.enqueue((0..N).map(|i| read_chunk_of(&batch, &regions, (i, at(i), LEN as u64), deadline)).collect::<Vec<_>>());
    // The READs left from this thread (the I/O thread is stopped); the
    // source answers them all from a thread of its own.
    let mut frame = [0u8; FRAME_HEADER_LEN + DATA_REQUEST_LEN];
    let tags: Vec<u64> = (0..N)
        .map(|_| {
            peer.read_exact(&mut frame).unwrap();
            DataRequest::decode(frame[FRAME_HEADER_LEN..].try_into().unwrap()).unwrap().tag
        })
        .collect();
    std::thread::spawn(move || {
        let payload = vec![0x5au8; LEN];
        for tag in tags {
            let head = FrameHeader::encode(MsgKind::ReadResponse, (DATA_RESPONSE_LEN + LEN) as u32);
            let fixed = DataResponse { tag, status: Status::Ok }.encode();
            // The connection is killed before the last are taken.
            if peer.write_all(&head).and(peer.write_all(&fixed)).and(peer.write_all(&payload)).is_err() {
                return;
            }
        }
    });
    let give_up = Instant::now() + Duration::from_secs(60);
    while waiting(&conn.stream) < 3 << 20 {
        assert!(Instant::now() < give_up, "the answers never filled the socket: {} bytes", waiting(&conn.stream));
        std::thread::yield_now();
    }
    assert!(conn.assist(Instant::now() + Duration::from_secs(60)), "the assist read nothing");
    let landed = local.iter().filter(|&&b| b == 0x5a).count();
    assert!(
        landed > 0 && landed <= 256 * 1024,
        "one assist landed {landed} payload bytes (its budget is 256 KiB), with {} bytes still waiting",
        waiting(&conn.stream)
    );
    drop(batch);
    conn.kill(Error::Unavailable("test over".into()));
}

/// A thread polling a batch (`orbite_batch_status`, `orbite_batch_result`:
/// what TENT's getTransferStatus calls) reads the answer waiting on the
/// socket itself: the connection's only I/O thread is stopped, so nothing
/// else could. Guards `Batch::poll` calling `BatchShared::assist_once`
/// (without it the request stays pending).
#[test]
fn a_polling_thread_reads_its_answer_itself() {
    let stats = Arc::new(Counters::default());
    let (conn, mut peer) = connected(&stats);
    let OneRead { mut local, regions, deadline, batch } = OneRead::new(stats);
    batch.assisted_by(Arc::downgrade(&conn) as std::sync::Weak<dyn Assist>);
    conn.enqueue(vec![read_chunk(&batch, &regions, local.as_mut_ptr() as u64, deadline)]);
    let payload = answer_one_read(&mut peer);

    // The answer's bytes may reach the socket in pieces: poll until it
    // is read, each poll one non-blocking try.
    let polled = crate::engine::Batch::new(batch.clone());
    let give_up = Instant::now() + Duration::from_secs(20);
    while polled.poll() == Status::Pending {
        assert!(Instant::now() < give_up, "the poller never read its answer");
        std::thread::yield_now();
    }
    assert_eq!(polled.poll(), Status::Ok);
    assert_eq!(polled.result(0).unwrap().status, Status::Ok);
    assert_eq!(local, payload);
    drop((polled, batch));
    conn.kill(Error::Unavailable("test over".into()));
}

/// A submitter never waits for the connection's lock: while another
/// thread holds it (as an I/O turn or a poller does), `enqueue` hands its
/// chunk over and returns, and the holder writes it when it lets go (the
/// connection's only I/O thread is stopped: nobody else could). Guards the
/// `try_lock` in `enqueue` (with a waiting lock the submitter is still
/// stuck when the holder gives up) and `take_handed` in `release` (without
/// it the request never reaches the peer).
#[test]
fn a_submitter_hands_its_chunks_to_the_lock_holder() {
    let stats = Arc::new(Counters::default());
    let (conn, mut peer) = connected(&stats);
    let OneRead { mut local, regions, deadline, batch } = OneRead::new(stats);
    let held = conn.state.lock();
    let (tx, rx) = std::sync::mpsc::channel();
    let (c, chunk) = (conn.clone(), read_chunk(&batch, &regions, local.as_mut_ptr() as u64, deadline));
    let t = std::thread::spawn(move || {
        c.enqueue(vec![chunk]);
        tx.send(()).unwrap();
    });
    let returned = rx.recv_timeout(Duration::from_secs(20));
    conn.unlock(held);
    t.join().unwrap();
    assert!(returned.is_ok(), "the submitter waited for the lock");
    peer.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let payload = answer_one_read(&mut peer);
    batch.assisted_by(Arc::downgrade(&conn) as std::sync::Weak<dyn Assist>);
    let polled = crate::engine::Batch::new(batch.clone());
    let give_up = Instant::now() + Duration::from_secs(20);
    while polled.poll() == Status::Pending {
        assert!(Instant::now() < give_up, "the answer was never read");
        std::thread::yield_now();
    }
    assert_eq!(polled.poll(), Status::Ok);
    assert_eq!(local, payload);
    drop((polled, batch));
    conn.kill(Error::Unavailable("test over".into()));
}

/// A READ of a cancelled batch fails inside the send path, on the
/// thread that enqueues it, and its batch's end hook queues a
/// notification on the same connection, as an outbox does. Returns
/// whether the hook ran within `patience`, the connection and batch
/// (the caller ends them if it did) and where the notification's
/// verdict arrives.
fn end_hook_on_failed_send(under_lock: bool, patience: Duration) -> (bool, Arc<TcpConnection>, OneRead, Verdicts) {
    let stats = Arc::new(Counters::default());
    let (conn, _peer) = connected(&stats);
    conn.deliver_under_lock.store(under_lock, Ordering::Relaxed);
    let mut one = OneRead::new(stats);
    one.batch.cancel();
    let (hook_ran, ran) = std::sync::mpsc::channel();
    let (answered, answer) = std::sync::mpsc::channel();
    let weak = Arc::downgrade(&conn);
    let deadline = one.deadline;
    assert!(one.batch.on_end(Box::new(move || {
        let c = weak.upgrade().expect("the connection lives");
        let tell = move |r: Result<()>, written: bool| answered.send((r.map_err(|e| e.status()), written)).unwrap();
        c.send_notify(|_tag| vec![0u8; 8], deadline, Box::new(tell));
        hook_ran.send(()).unwrap();
    })));
    let (c, chunk) = (conn.clone(), read_chunk(&one.batch, &one.regions, one.local.as_mut_ptr() as u64, deadline));
    std::thread::spawn(move || c.enqueue(vec![chunk]));
    (ran.recv_timeout(patience).is_ok(), conn, one, answer)
}

/// A notification's verdict: its status and whether it may have left.
type Verdicts = std::sync::mpsc::Receiver<(std::result::Result<(), Status>, bool)>;

/// A batch's end hook may use the connection its request failed on.
/// Guards `unlock` delivering only after the lock is dropped (the past
/// race: delivered under the connection's lock, the hook waits for
/// that lock on the thread that holds it).
#[test]
fn a_batch_end_hook_may_use_the_connection_its_request_failed_on() {
    let (ran, conn, one, answer) = end_hook_on_failed_send(false, Duration::from_secs(60));
    assert!(ran, "the end hook waited for the connection's lock for good");
    assert_eq!(one.batch.poll(), Status::TransferFailed);
    assert_eq!(one.batch.error(0).map(|e| e.status()), Some(Status::Cancelled));
    // The notification was queued there: the end answers it unsent.
    conn.kill(Error::Unavailable("test over".into()));
    assert_eq!(answer.recv_timeout(Duration::from_secs(60)).unwrap(), (Err(Status::Unavailable), false));
}

/// The same with the race switched back on: the hook never runs (its
/// thread waits for the lock it holds). The connection and its thread
/// are left behind, deadlocked; nothing else uses them.
#[test]
fn the_end_hook_deadlocks_when_delivered_under_the_lock() {
    let (ran, conn, one, answer) = end_hook_on_failed_send(true, Duration::from_secs(3));
    assert!(!ran, "an end hook delivered under the lock ran: the switch does not put the race back");
    std::mem::forget((conn, one, answer));
}
