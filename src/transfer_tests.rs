use super::*;

fn batch(n: usize) -> Arc<BatchShared> {
    let req = Request { op: Op::Read, local_addr: 0x1000, remote_addr: 0x2000, len: 8 };
    let deadline = Instant::now() + Duration::from_secs(60);
    BatchShared::routed(&vec![req; n], Some(TransportKind::Tcp), Arc::default(), deadline)
}

/// A coalesced WRITE run of three requests (8, 16 and 8 bytes) lost
/// after 9 bytes of its payload left: the first two may have landed
/// (`Unknown`), the third sent nothing (`None`); with 8 bytes out the
/// second sent nothing either; without `reached` all three are
/// `Unknown`. Guards `complete_run`'s split.
#[test]
fn a_write_run_cut_midway_splits_its_effect_by_the_bytes_that_left() {
    let effects = |reached: Option<u64>| {
        let w = |len| Request { op: Op::Write, local_addr: 0x1000, remote_addr: 0x2000, len };
        let deadline = Instant::now() + Duration::from_secs(60);
        let b = BatchShared::routed(&[w(8), w(16), w(8)], Some(TransportKind::Tcp), Arc::default(), deadline);
        let out = ChunkOutcome::failed(Error::Unavailable("cut".into()), RemoteEffect::Unknown);
        b.complete_run(0, 3, reached.map_or(out.clone(), |n| out.reaching(n)));
        b.results().iter().map(|r| (r.status, r.remote_effect)).collect::<Vec<_>>()
    };
    let (u, n) = ((Status::Unavailable, RemoteEffect::Unknown), (Status::Unavailable, RemoteEffect::None));
    assert_eq!(effects(Some(9)), [u, u, n]);
    assert_eq!(effects(Some(8)), [u, n, n]);
    assert_eq!(effects(Some(0)), [n, n, n]);
    assert_eq!(effects(None), [u, u, u]);
}

#[test]
fn cancelling_one_request_refuses_only_it() {
    let b = batch(3);
    assert!(b.cancel_request(1));
    assert!(b.start_run(0, 1));
    assert!(!b.start_run(1, 1));
    assert!(b.start_run(2, 1));
    assert!(!b.cancel_request(3), "no request 3");
}

#[test]
fn a_unit_is_refused_only_when_all_of_it_was_asked() {
    let some = batch(3);
    assert!(some.cancel_request(2));
    assert!(some.start_run(0, 3), "siblings not asked: the unit runs");
    let all = batch(3);
    for i in 0..3 {
        assert!(all.cancel_request(i));
    }
    assert!(!all.start_run(0, 3));
}

#[test]
fn a_request_started_or_done_is_unaffected_and_batch_cancel_still_refuses() {
    let b = batch(3);
    assert!(b.start(0));
    b.complete_chunk(1, ChunkOutcome::ok(Op::Read));
    assert!(b.cancel_request(0) && b.cancel_request(1));
    assert!(b.start(0), "started before it was asked");
    assert_eq!(b.result(1).unwrap().status, Status::Ok);
    b.cancel();
    assert!(!b.start_run(2, 1));
    assert!(!batch(1).cancel_request(usize::MAX));
    let c = batch(2);
    c.cancel();
    assert!(!c.start_run(0, 2), "no request asked, the batch cancelled");
}

/// What a notification after a batch waits for (the outbox sends it
/// once `requests_ended` holds, from the batch's end hook): the batch's
/// requests have ended only when the last one has, and its end hooks
/// run then, once each. Guards `requests_ended` and `on_end`.
#[test]
fn requests_end_with_the_last_one_and_end_hooks_run_then_once() {
    let b = batch(2);
    let ran = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let r = ran.clone();
    assert!(b.on_end(Box::new(move || {
        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    })));
    assert!(!b.requests_ended());
    b.complete_chunk(0, ChunkOutcome::ok(Op::Read));
    assert!(!b.requests_ended(), "one of two ended");
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);
    b.fail_request(1, Error::Unavailable("gone".into()), RemoteEffect::None);
    assert!(b.requests_ended());
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(!b.on_end(Box::new(|| panic!("a hook after the end runs never"))), "refused once ended");
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
}
