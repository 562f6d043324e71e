use super::super::channel::{deadline_tick, listen};
use super::*;
use std::sync::atomic::AtomicBool;

/// A link to a fake source listening on a fresh abstract name, and
/// that source's identity.
fn link_to(name: &str) -> (Arc<IpcLink>, Identity) {
    let source = Identity::fresh().unwrap();
    let local = LocalEnd {
        identity: Identity::fresh().unwrap(),
        auth: None,
        faults: Arc::new(Faults::default()),
        reconnect_timeout: Duration::from_secs(5),
        log: Arc::new(crate::log::Logger::new(crate::log::Level::Error, "test")),
    };
    let link = IpcLink::new(
        crate::kinds::TransportKind::Shm,
        Route::Unix(name.into()),
        source,
        "127.0.0.1:1".into(),
        "test source".into(),
        local,
    );
    (Arc::new(link), source)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// A process sitting on a source's channel name (here: this process,
/// listening where the link expects another) gets no frame: the link
/// asks the kernel who holds the other end, finds a process other than
/// the source's and refuses PERMISSION_DENIED before sending anything.
#[test]
fn a_channel_held_by_another_process_than_the_sources_is_refused() {
    let name = format!("orbite-test-squat-{}", std::process::id());
    let l = listen(&name).unwrap();
    let (link, _) = link_to(&name);
    let mut squatted = link.source;
    squatted.process.pid = std::process::id() + 1;
    let link = Arc::new(IpcLink::new(
        crate::kinds::TransportKind::Shm,
        Route::Unix(name.clone()),
        squatted,
        "127.0.0.1:1".into(),
        "test source".into(),
        link.local.clone(),
    ));
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut c = Channel::from_stream(s).unwrap();
        let soon = Instant::now() + Duration::from_secs(60);
        c.recv(&mut || deadline_tick(soon, "anything")).map(|f| f.kind)
    });
    let Err(e) = link.call(MsgKind::ExportRequest, b"x", deadline(), "export request") else {
        panic!("a call went through a channel the source does not hold")
    };
    assert_eq!(e.status(), crate::error::Status::PermissionDenied, "{e}");
    assert!(e.message().contains("not by the source's process"), "{e}");
    drop(link);
    assert!(server.join().unwrap().is_err(), "the squatting process received a frame");
}

/// Accepts one channel, welcomes it as `source` (after `welcome_after`
/// says so), then reads two requests and answers them in order. Whether
/// the second request arrived before the first was answered goes into
/// `overlapped`.
fn serve_two(
    l: std::os::unix::net::UnixListener,
    source: Identity,
    welcome_after: impl FnOnce() + Send + 'static,
    overlapped: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut c = Channel::from_stream(s).unwrap();
        let patient = Instant::now() + Duration::from_secs(60);
        let hello = c.recv(&mut || deadline_tick(patient, "hello")).unwrap();
        assert_eq!(hello.kind, MsgKind::IpcHello);
        welcome_after();
        let w = Welcome { identity: source }.encode();
        c.send(MsgKind::IpcWelcome, &w, &[], &mut || Ok(())).unwrap();
        let first = c.recv(&mut || deadline_tick(patient, "first")).unwrap();
        // A link that holds one call at a time sends nothing more
        // until this one is answered: wait 3 s for the second.
        let soon = Instant::now() + Duration::from_secs(3);
        let second = c.recv(&mut || deadline_tick(soon, "second"));
        overlapped.store(second.is_ok(), Ordering::SeqCst);
        c.send(MsgKind::Ack, &first.body, &[], &mut || Ok(())).unwrap();
        let second = second.or_else(|_| c.recv(&mut || deadline_tick(patient, "second"))).unwrap();
        c.send(MsgKind::Ack, &second.body, &[], &mut || Ok(())).unwrap();
        // Stay until the link hangs up.
        let _ = c.recv(&mut || deadline_tick(patient, "end"));
    })
}

#[test]
fn two_threads_calling_one_source_have_their_requests_in_flight_together() {
    let name = format!("orbite-link-test-{}-{}", std::process::id(), line!());
    let (link, source) = link_to(&name);
    let overlapped = Arc::new(AtomicBool::new(false));
    let src = serve_two(listen(&name).unwrap(), source, || {}, overlapped.clone());
    let calls: Vec<_> = [&b"one"[..], &b"two"[..]]
        .into_iter()
        .map(|body| {
            let link = link.clone();
            std::thread::spawn(move || link.call(MsgKind::Ack, body, deadline(), "test call").unwrap().body)
        })
        .collect();
    let mut answers: Vec<Vec<u8>> = calls.into_iter().map(|t| t.join().unwrap()).collect();
    answers.sort();
    assert_eq!(answers, vec![b"one".to_vec(), b"two".to_vec()]);
    assert!(overlapped.load(Ordering::SeqCst), "the second request waited for the first answer");
    assert_eq!(link.generation(), 1);
    link.close();
    src.join().unwrap();
}

#[test]
fn callers_arriving_while_the_channel_opens_wait_for_it_under_no_lock() {
    let name = format!("orbite-link-test-{}-{}", std::process::id(), line!());
    let (link, source) = link_to(&name);
    let overlapped = Arc::new(AtomicBool::new(false));
    let (opening_tx, opening_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    // The source welcomes nobody until told.
    let welcome_after = move || {
        opening_tx.send(()).unwrap();
        go_rx.recv().unwrap();
    };
    let src = serve_two(listen(&name).unwrap(), source, welcome_after, overlapped.clone());
    let l1 = link.clone();
    let first = std::thread::spawn(move || l1.call(MsgKind::Ack, b"one", deadline(), "first").unwrap().body);
    opening_rx.recv().unwrap();
    // The opening caller holds no lock: the link's state can be read.
    assert!(matches!(link.state.try_lock_for(Duration::from_secs(10)).unwrap().chan, ChanState::Connecting));
    assert!(link.dead_reason().is_none() && !link.is_dead());
    // A caller meanwhile waits for that channel (no second one) until
    // its deadline, and the channel being opened is not harmed.
    let e = link.call(MsgKind::Ack, b"x", Instant::now() + Duration::from_millis(300), "hasty").err().unwrap();
    assert_eq!(e.status(), crate::error::Status::TimedOut, "{e}");
    assert!(e.message().contains("still being opened"), "{e}");
    go_tx.send(()).unwrap();
    assert_eq!(first.join().unwrap(), b"one");
    assert_eq!(link.call(MsgKind::Ack, b"two", deadline(), "second").unwrap().body, b"two");
    assert_eq!(link.generation(), 1, "one channel served every call");
    link.close();
    src.join().unwrap();
}

#[test]
fn a_link_keeps_its_threads_within_the_offers_a_source_allows() {
    let (link, _) = link_to("orbite-link-test-unused");
    let places: Vec<_> =
        (0..super::super::messages::OFFERS_MAX).map(|_| link.offer_place(Instant::now()).unwrap()).collect();
    let e = link.offer_place(Instant::now() + Duration::from_millis(50)).err().unwrap();
    assert_eq!(e.status(), crate::error::Status::TimedOut, "{e}");
    assert!(e.message().contains("8 offers of this IPC link"), "{e}");
    // A place given back lets a waiting thread in.
    std::thread::scope(|s| {
        let waiter = s.spawn(|| link.offer_place(deadline()).map(|_| ()));
        drop(places);
        waiter.join().unwrap().unwrap();
    });
    assert_eq!(link.state.lock().offers, 0);
}

/// Whether a link can be used is read without its lock (what every
/// submission asks) and follows its channel: healthy before the first
/// channel, dead for good once its source is found gone, and once
/// closed. Guards `IpcLink::set` keeping `health` beside the state.
#[test]
fn a_links_health_is_read_without_its_lock_and_follows_its_channel() {
    let name = format!("orbite-link-test-{}-{}", std::process::id(), line!());
    let (link, _) = link_to(&name);
    let held = link.state.lock();
    let l2 = link.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send((l2.dead_reason().is_none(), l2.is_dead())).unwrap());
    let asked = rx.recv_timeout(Duration::from_secs(30)).expect("dead_reason waited for the link's lock");
    assert_eq!(asked, (true, false));
    drop(held);
    // No source listens under the name: the source is gone, and the link
    // is dead for good with the reason its first channel failed.
    let e = link.call(MsgKind::Ack, b"x", deadline(), "test call").err().expect("a call with no source");
    assert_eq!(e.status(), crate::error::Status::StalePeer, "{e}");
    assert!(link.is_dead());
    assert_eq!(link.dead_reason().expect("a dead link is not usable").to_string(), e.to_string());
    link.close();
    assert!(link.is_dead());
    let why = link.dead_reason().expect("a closed link is not usable");
    assert!(why.message().contains("IPC link closed by this engine"), "{why}");
}

/// Guards `|| a.extra != kind as u32` in `receipt`: a source answering a
/// CloseReceipt with the ACK of an OpComplete (same export id and token)
/// is a protocol error, not a recorded close; the ACK naming the
/// CloseReceipt is taken.
#[test]
fn a_receipts_ack_naming_another_receipt_kind_is_a_protocol_error() {
    let name = format!("orbite-link-test-{}-{}", std::process::id(), line!());
    let (link, source) = link_to(&name);
    let l = listen(&name).unwrap();
    let src = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut c = Channel::from_stream(s).unwrap();
        let patient = Instant::now() + Duration::from_secs(60);
        assert_eq!(c.recv(&mut || deadline_tick(patient, "hello")).unwrap().kind, MsgKind::IpcHello);
        c.send(MsgKind::IpcWelcome, &Welcome { identity: source }.encode(), &[], &mut || Ok(())).unwrap();
        for acked in [MsgKind::CloseReceipt, MsgKind::OpComplete] {
            let f = c.recv(&mut || deadline_tick(patient, "receipt")).unwrap();
            assert_eq!(f.kind, MsgKind::CloseReceipt);
            let r = ExportRef::decode(&f.body, "CloseReceipt").unwrap();
            let ack = ExportRef { value: 0, extra: acked as u32, ..r };
            c.send(MsgKind::Ack, &ack.encode(), &[], &mut || Ok(())).unwrap();
        }
        let _ = c.recv(&mut || deadline_tick(patient, "end"));
    });
    let r = ExportRef { export_id: 7, token: 0x5eed, value: 0, extra: 0 };
    link.receipt(MsgKind::CloseReceipt, &r, deadline()).unwrap();
    let e = link.receipt(MsgKind::CloseReceipt, &r, deadline()).unwrap_err();
    assert_eq!(e.status(), crate::error::Status::ProtocolError, "{e}");
    assert!(e.message().contains("ACK for another receipt"), "{e}");
    link.close();
    src.join().unwrap();
}

/// A pid of another boot names no process of this one: a link to a
/// source of another boot never judges the source exited by a process
/// descriptor of that pid here, while a link to a source of this boot
/// naming the same (local) process sees it exit. Guards
/// `!self.source.same_boot(&self.local.identity)` in `source_exited`
/// (round 18 S11). A unit test: no engine makes a Unix link to a source
/// of another boot (`engine/peers.rs` `ipc_links` refuses it, "runs on
/// another host or boot", before any route; killed by `tests/seed_rows.rs`
/// `s2_the_requester_refuses_shm_to_a_peer_of_another_boot`).
#[test]
fn a_source_of_another_boot_is_never_judged_exited_by_a_local_pid() {
    use crate::control::identity::{process_start_time, ProcessIdentity};
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let process = ProcessIdentity { pid: child.id(), start_time: process_start_time(child.id()) };
    let here = Identity { process, ..Identity::fresh().unwrap() };
    let mut elsewhere = here;
    elsewhere.boot_id[0] ^= 0xff;
    let (template, _) = link_to("orbite-test-never-connected");
    let links = [here, elsewhere].map(|source| {
        let route = Route::Unix("orbite-test-never-connected".into());
        let (label, local) = ("test source".to_string(), template.local.clone());
        IpcLink::new(crate::kinds::TransportKind::Shm, route, source, "127.0.0.1:1".into(), label, local)
    });
    // Asked while the process lives: a link that judges by a process
    // descriptor opens it now.
    assert_eq!(links.each_ref().map(|l| l.source_exited()), [false, false]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(links.each_ref().map(|l| l.source_exited()), [true, false]);
}
