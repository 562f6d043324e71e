use super::*;
use crate::error::Status;
use crate::transport::ipc::messages::{OP_READ, OP_WRITE};

fn who(pid: u32) -> Identity {
    Identity { boot_id: [7; 16], process: ProcessIdentity { pid, start_time: 11 }, engine_epoch: 5 }
}

fn grant(conn: u64, requester: Option<Identity>, ops: u32) -> Grant {
    Grant {
        conn,
        requester,
        token: 0xABCD,
        base: 0x10000,
        logical: 4096,
        physical: 4096,
        region: 3,
        region_epoch: 9,
        ops,
        len: 1024,
        has_slot: true,
    }
}

fn r(id: u64, value: u64, extra: u32) -> ExportRef {
    ExportRef { export_id: id, token: 0xABCD, value, extra }
}

/// Offers, accepts and finishes an export on `conn`; returns its id.
fn exposed(c: &mut ExportsCore<&'static str>, conn: u64, who: Option<Identity>, now: Instant) -> u64 {
    let id = c.offer(grant(conn, who, OP_READ | OP_WRITE), now, "held");
    assert!(matches!(c.begin_answer(conn, &r(id, 1, 0)), Ok(Answering::Expose { base: 0x10000, writable: true })));
    assert!(matches!(c.finish_answer(conn, &r(id, 1, 0), true), Finished::Exposed));
    id
}

#[test]
fn an_accepted_offer_is_exposed_once_and_a_close_receipt_ends_it_exported() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = exposed(&mut c, 1, None, now);
    assert_eq!(c.state(id), Some(ExportState::Exposed));
    let again = c.begin_answer(1, &r(id, 1, 0)).err().expect("a second answer is refused");
    assert_eq!(again.status(), Status::ProtocolError);
    let gone = c.close_receipt(1, None, &r(id, 0, 0), |_| false).unwrap().expect("released");
    assert!(gone.exported);
    assert_eq!(gone.res, "held");
    assert_eq!(c.len(), 0);
    // A receipt repeated after a lost ACK is acknowledged, not refused.
    assert!(c.close_receipt(1, None, &r(id, 0, 0), |_| false).unwrap().is_none());
}

#[test]
fn a_wrong_token_or_channel_finds_no_export() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = exposed(&mut c, 1, None, now);
    let bad = ExportRef { token: 1, ..r(id, 0, 0) };
    assert_eq!(c.close_receipt(1, None, &bad, |_| false).err().unwrap().status(), Status::NotFound);
    assert_eq!(c.close_receipt(2, None, &r(id, 0, 0), |_| false).err().unwrap().status(), Status::NotFound);
    assert_eq!(c.op_complete(2, &r(id, 10, 1)).err().unwrap().status(), Status::NotFound);
    // The channel's own export under another token (`entry`'s token check).
    let v = Revalidate { tag: 1, export_id: id, token: 1, region_epoch: 9, addr: 0x10000, len: 16, ops: OP_READ };
    assert_eq!(c.check_revalidate(1, &v).err().unwrap().status(), Status::NotFound);
    c.check_revalidate(1, &Revalidate { token: 0xABCD, ..v }).unwrap();
    assert_eq!(c.len(), 1);
}

#[test]
fn a_later_channel_of_the_same_verified_requester_may_close_a_retained_export() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = exposed(&mut c, 1, Some(who(40)), now);
    let lost = c.connection_lost(1, |_| false, |_| true);
    assert_eq!((lost.released.len(), lost.retained, lost.watch.len()), (0, 1, 1));
    assert_eq!(c.counts(), (0, 1));
    assert_eq!(c.close_receipt(2, Some(who(41)), &r(id, 0, 0), |_| false).err().unwrap().status(), Status::NotFound);
    assert!(c.close_receipt(2, Some(who(40)), &r(id, 0, 0), |_| false).unwrap().unwrap().exported);
    assert_eq!(c.counts(), (0, 0));
}

/// A grant whose handle went with its lost channel, released by its
/// requester from a later channel while the handle is still being made:
/// retried while the source has not seen the first channel end; once it
/// has (the grant is abandoned), acknowledged with nothing to release, and
/// the grant ends unexposed when its handle is made. Guards the two arms
/// of `close_receipt` for another channel.
#[test]
fn a_grant_lost_with_its_channel_may_be_released_while_its_handle_is_made() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = c.offer(grant(1, Some(who(40)), OP_READ), now, "held");
    assert!(matches!(c.begin_answer(1, &r(id, 1, 0)), Ok(Answering::Expose { .. })));
    let early = c.close_receipt(2, Some(who(40)), &r(id, 0, 0), |_| false).err().expect("refused while answered on 1");
    assert_eq!(early.status(), Status::Unavailable);
    // The same channel closing what it is being answered is a protocol
    // error, as before.
    assert_eq!(
        c.close_receipt(1, Some(who(40)), &r(id, 0, 0), |_| false).err().unwrap().status(),
        Status::ProtocolError
    );
    let lost = c.connection_lost(1, |_| false, |_| true);
    assert_eq!((lost.released.len(), lost.retained), (0, 0));
    assert_eq!(c.state(id), Some(ExportState::Abandoned));
    assert!(c.close_receipt(2, Some(who(40)), &r(id, 0, 0), |_| false).unwrap().is_none());
    assert_eq!(c.state(id), Some(ExportState::Abandoned));
    match c.finish_answer(1, &r(id, 1, 0), true) {
        Finished::Ended(g) => assert!(!g.exported),
        _ => panic!("an abandoned grant is exposed"),
    }
    assert_eq!(c.len(), 0);
}

#[test]
fn a_lost_channel_ends_offers_retains_exposed_and_reclaims_exited_importers() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let offered = c.offer(grant(1, Some(who(40)), OP_READ), now, "offer");
    let kept = exposed(&mut c, 1, Some(who(40)), now);
    let dead = exposed(&mut c, 1, Some(who(50)), now);
    let other = exposed(&mut c, 2, Some(who(40)), now);
    let lost = c.connection_lost(1, |p| p.pid == 50, |_| true);
    assert_eq!(
        lost.released.iter().map(|g| (g.res, g.exported)).collect::<Vec<_>>(),
        [("offer", false), ("held", true)]
    );
    assert_eq!((lost.reclaimed, lost.retained), (1, 1));
    assert_eq!(lost.pids.into_iter().collect::<Vec<_>>(), [40]);
    assert_eq!(c.state(offered), None);
    assert_eq!(c.state(dead), None);
    assert_eq!(c.state(kept), Some(ExportState::Retained));
    assert_eq!(c.state(other), Some(ExportState::Exposed));
    // Watched once however many exports it retains.
    let again = exposed(&mut c, 3, Some(who(40)), now);
    assert!(c.connection_lost(3, |_| false, |_| true).watch.is_empty());
    assert_eq!(c.retained().len(), 2);
    let gone = c.reclaim_exited(|p| p.pid == 40, |_| true);
    assert_eq!(gone.len(), 2);
    assert_eq!(c.state(again), None);
    assert_eq!(c.reclaimed(), 3);
    assert_eq!(c.counts(), (1, 0));
}

#[test]
fn a_grant_finished_after_its_channel_ended_ends_unexposed() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = c.offer(grant(1, None, OP_READ), now, "held");
    assert!(matches!(c.begin_answer(1, &r(id, 1, 0)), Ok(Answering::Expose { writable: false, .. })));
    let lost = c.connection_lost(1, |_| true, |_| true);
    assert!(lost.released.is_empty(), "the driver still exports from it");
    assert_eq!(c.state(id), Some(ExportState::Abandoned));
    // Nothing may release it under the driver's feet.
    assert_eq!(c.close_receipt(1, None, &r(id, 0, 0), |_| false).err().unwrap().status(), Status::ProtocolError);
    match c.finish_answer(1, &r(id, 1, 0), true) {
        Finished::Ended(g) => assert!(!g.exported, "never exposed: the driver unexports what it made"),
        _ => panic!("an abandoned grant must end"),
    }
    assert_eq!(c.len(), 0);
    assert!(matches!(c.finish_answer(1, &r(id, 1, 0), true), Finished::Gone));
}

#[test]
fn a_handle_that_could_not_be_made_ends_the_export() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = c.offer(grant(1, None, OP_READ), now, "held");
    c.begin_answer(1, &r(id, 1, 0)).unwrap();
    assert!(matches!(c.finish_answer(1, &r(id, 1, 0), false), Finished::Ended(Released { exported: false, .. })));
    assert_eq!(c.len(), 0);
}

#[test]
fn a_decline_ends_the_offer_and_offers_expire_at_their_timeout() {
    let t0 = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let declined = c.offer(grant(1, None, OP_READ), t0, "a");
    assert!(matches!(c.begin_answer(1, &r(declined, 0, 0)), Ok(Answering::Declined(Released { exported: false, .. }))));
    let late = c.offer(grant(1, None, OP_READ), t0, "b");
    let other = c.offer(grant(2, None, OP_READ), t0, "c");
    assert_eq!(c.unanswered(1), 1);
    assert!(c.expire_offers(1, t0 + Duration::from_millis(4999)).is_empty());
    assert_eq!(c.expire_offers(1, t0 + Duration::from_secs(5)).len(), 1);
    assert_eq!(c.state(late), None);
    assert_eq!(c.begin_answer(1, &r(late, 1, 0)).err().unwrap().status(), Status::NotFound);
    assert_eq!(c.withdraw_offers().len(), 1);
    assert_eq!(c.state(other), None);
}

#[test]
fn receipts_count_once_per_validated_subbatch_within_the_envelope() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = exposed(&mut c, 1, None, now);
    // 3 requests of at most 1024 bytes each (each bound of a receipt:
    // `receipt_bounds_take_their_documented_side`).
    assert!(c.op_complete(1, &r(id, 3072, 3)).unwrap());
    assert!(!c.op_complete(1, &r(id, 3072, 3)).unwrap(), "one grant, one counted receipt");
    let v =
        Revalidate { tag: 1, export_id: id, token: 0xABCD, region_epoch: 9, addr: 0x10000, len: 4096, ops: OP_READ };
    c.check_revalidate(1, &v).unwrap();
    assert!(c.revalidated(1, &v).unwrap().is_some(), "published: it has a slot");
    assert!(c.op_complete(1, &r(id, 4096 * 2, 2)).unwrap(), "the envelope grew with the revalidation");
}

#[test]
fn a_revalidation_outside_the_grant_is_refused() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = exposed(&mut c, 1, None, now);
    let ok =
        Revalidate { tag: 1, export_id: id, token: 0xABCD, region_epoch: 9, addr: 0x10000, len: 4096, ops: OP_READ };
    let refused = |c: &mut ExportsCore<&str>, v: Revalidate| c.check_revalidate(1, &v).err().unwrap().status();
    assert_eq!(refused(&mut c, Revalidate { region_epoch: 8, ..ok }), Status::StalePeer);
    assert_eq!(refused(&mut c, Revalidate { addr: 0x10001, ..ok }), Status::OutOfRange);
    assert_eq!(refused(&mut c, Revalidate { addr: 0xFFFF, ..ok }), Status::OutOfRange);
    let offered = c.offer(grant(1, None, OP_READ), now, "x");
    let v = Revalidate { export_id: offered, ops: OP_READ, ..ok };
    assert_eq!(refused(&mut c, v), Status::ProtocolError);
    c.check_revalidate(1, &ok).unwrap();
}

#[test]
fn suspend_revokes_each_slot_once_until_resumed() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let a = exposed(&mut c, 1, None, now);
    let b = c.offer(Grant { region: 4, ..grant(1, None, OP_READ) }, now, "b");
    let slotless = c.offer(Grant { has_slot: false, ..grant(1, None, OP_READ) }, now, "c");
    assert_eq!(c.suspend(Some(3)), [a]);
    assert!(c.suspend(Some(3)).is_empty(), "a second unregistration revokes nothing again");
    assert_eq!(c.suspend(None), [b]);
    let v = Revalidate { tag: 1, export_id: a, token: 0xABCD, region_epoch: 9, addr: 0x10000, len: 16, ops: OP_READ };
    assert!(c.revalidated(1, &v).unwrap().is_none(), "suspended: no board generation");
    assert_eq!(c.resume(3), [a]);
    assert!(c.revalidated(1, &v).unwrap().is_some());
    assert_eq!(c.suspend(Some(3)), [a]);
    assert_ne!(c.state(slotless), None);
}

#[test]
fn acknowledgements_in_flight_keep_the_table_busy() {
    let mut c = ExportsCore::<()>::new(Duration::from_secs(5));
    assert!(c.is_empty());
    c.ack_begin();
    assert!(!c.is_empty());
    c.ack_end();
    assert!(c.is_empty());
}

#[test]
fn a_handle_never_sent_ends_its_export_exported_even_once_retained() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let queued = exposed(&mut c, 1, None, now);
    let late = exposed(&mut c, 1, None, now);
    let g = c.handle_not_sent(1, &r(queued, 0, 0)).expect("ended");
    assert!(g.exported, "the driver unexports the handle it made");
    c.connection_lost(1, |_| false, |_| true);
    assert_eq!(c.state(late), Some(ExportState::Retained));
    assert!(c.handle_not_sent(2, &r(late, 0, 0)).is_none(), "only its own channel's answers");
    assert!(c.handle_not_sent(1, &r(late, 0, 0)).is_some());
    assert_eq!(c.len(), 0);
    let offered = c.offer(grant(1, None, OP_READ), now, "x");
    assert!(c.handle_not_sent(1, &r(offered, 0, 0)).is_none(), "an offer has no handle");
    // Accepted, its handle still being made: no answer carrying it was
    // dropped yet, so it stays (guards `handle_not_sent`'s `Exposed |
    // Retained`: with `Exposing` too, the export ends under the driver
    // making its handle).
    assert!(matches!(c.begin_answer(1, &r(offered, 1, 0)), Ok(Answering::Expose { .. })));
    assert!(c.handle_not_sent(1, &r(offered, 0, 0)).is_none(), "a handle being made was not dropped");
    assert_eq!(c.state(offered), Some(ExportState::Exposing));
    assert!(matches!(c.finish_answer(1, &r(offered, 1, 0), true), Finished::Exposed));
    assert_eq!(c.len(), 1);
}

/// A hostile channel holds 10 000 exports and offers; another channel's
/// whole life — offers counted, made, answered, revalidated, receipts,
/// expiries at every tick, its loss, its process's reclaim — looks at its
/// own exports only: the table is walked not once. Guards the per-channel
/// and per-process indexes (`unanswered`, `expire_offers`,
/// `connection_lost`, `reclaim_process`): any of them scanning the table
/// again walks it.
#[test]
fn a_request_or_tick_walks_no_other_export() {
    let t0 = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    for i in 0..10_000u64 {
        if i % 10 == 0 {
            c.offer(grant(1, Some(who(66)), OP_READ), t0 + Duration::from_millis(i), "hoarded");
        } else {
            exposed(&mut c, 1, Some(who(66)), t0);
        }
    }
    let before = c.walked();
    assert_eq!(c.unanswered(2), 0);
    let id = exposed(&mut c, 2, Some(who(40)), t0);
    assert_eq!(c.unanswered(2), 0);
    let v = Revalidate { tag: 1, export_id: id, token: 0xABCD, region_epoch: 9, addr: 0x10000, len: 64, ops: OP_READ };
    c.check_revalidate(2, &v).unwrap();
    c.revalidated(2, &v).unwrap();
    assert!(c.op_complete(2, &r(id, 64, 1)).unwrap());
    let offered = c.offer(grant(2, Some(who(40)), OP_READ), t0, "late");
    assert_eq!((c.unanswered(1), c.unanswered(2)), (1000, 1));
    // Ticks: nothing of either channel due yet, then channel 2's offer.
    assert!(c.expire_offers(1, t0 + Duration::from_secs(1)).is_empty());
    assert!(c.expire_offers(2, t0 + Duration::from_secs(1)).is_empty());
    assert_eq!(c.expire_offers(2, t0 + Duration::from_secs(5)).len(), 1);
    assert_eq!(c.state(offered), None);
    // The first hoarded offer expires alone at its own time.
    assert_eq!(c.expire_offers(1, t0 + Duration::from_secs(5)).len(), 1);
    assert_eq!(c.unanswered(1), 999);
    let lost = c.connection_lost(2, |_| false, |_| true);
    assert_eq!((lost.retained, lost.released.len()), (1, 0));
    assert_eq!(c.counts(), (10_000 - 1, 1));
    let (gone, left) = c.reclaim_process(&who(40).process, true, |_| true);
    assert_eq!((gone.len(), left), (1, 0));
    let closed = exposed(&mut c, 3, Some(who(40)), t0);
    assert!(c.close_receipt(3, Some(who(40)), &r(closed, 0, 0), |_| false).unwrap().is_some());
    assert!(c.close_receipt(3, Some(who(40)), &r(closed, 0, 0), |_| false).unwrap().is_none(), "remembered as closed");
    assert_eq!(c.walked(), before, "a request, a tick or a lost channel walked the table");
    assert_eq!(c.holding(Holder::Process(66, 11)).0, 9_999);
    assert_eq!(c.holding(Holder::Process(40, 11)), (0, 0));
}

/// What the indexes say agrees with the table itself (walked) through a
/// seeded run of offers, answers, receipts, expiries, lost channels and
/// reclaims over three channels of two processes and one unverified one.
#[test]
fn the_indexes_agree_with_the_table_through_a_random_run() {
    let t0 = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let requester = |conn: u64| match conn {
        1 | 2 => Some(who(40)),
        3 => Some(who(50)),
        _ => None,
    };
    let dead = std::cell::Cell::new(false);
    for step in 0..5_000u64 {
        let now = t0 + Duration::from_millis(step * 3);
        let conn = 1 + next(4);
        let ids: Vec<u64> = c.list().into_iter().filter(|(_, k, _, _)| *k == conn).map(|(id, ..)| id).collect();
        let pick = (!ids.is_empty()).then(|| ids[next(ids.len() as u64) as usize]);
        match next(8) {
            0 | 1 => {
                c.offer(Grant { base: 0x10000 * (1 + next(3)), ..grant(conn, requester(conn), OP_READ) }, now, "x");
            }
            2 => {
                if let Some(id) = pick {
                    if c.begin_answer(conn, &r(id, 1, 0)).is_ok() {
                        let _ = c.finish_answer(conn, &r(id, 1, 0), next(5) != 0);
                    }
                }
            }
            3 => {
                if let Some(id) = pick {
                    let _ = c.close_receipt(conn, requester(conn), &r(id, 0, 0), |_| false);
                }
            }
            4 => {
                c.expire_offers(conn, now);
            }
            5 if next(10) == 0 => {
                dead.set(next(2) == 0);
                c.connection_lost(conn, |p| dead.get() && p.pid == 50, |_| true);
            }
            6 => {
                c.reclaim_exited(|p| dead.get() && p.pid == 50, |_| true);
            }
            _ => {}
        }
        let all = c.list();
        for k in 1..=4u64 {
            let offers = all.iter().filter(|(_, ch, s, _)| *ch == k && *s == ExportState::Offered).count();
            assert_eq!(c.unanswered(k), offers, "step {step}: offers of channel {k}");
        }
        let retained = all.iter().filter(|(_, _, s, _)| *s == ExportState::Retained).count() as u64;
        assert_eq!(c.counts(), (all.len() as u64 - retained, retained), "step {step}");
        for (h, n) in [
            (Holder::Process(40, 11), all.iter().filter(|(.., p)| p.is_some_and(|p| p.pid == 40)).count()),
            (Holder::Process(50, 11), all.iter().filter(|(.., p)| p.is_some_and(|p| p.pid == 50)).count()),
            (Holder::Channel(4), all.iter().filter(|(_, ch, ..)| *ch == 4).count()),
        ] {
            assert_eq!(c.holding(h).0, n, "step {step}: exports of {h:?}");
        }
    }
}

/// One requester is bounded over all its channels, retained exports
/// included; an unverified channel is bounded alone; others are not held
/// back.
#[test]
fn a_requester_is_bounded_over_its_channels_and_its_retained_exports() {
    let now = Instant::now();
    let limits = Limits { exports: 3, sole_bytes: u64::MAX };
    let mut c: ExportsCore<&str> = ExportsCore::bounded(Duration::from_secs(5), limits);
    for conn in [1, 1, 2] {
        let g = grant(conn, Some(who(40)), OP_READ);
        c.admit(&g).unwrap();
        c.offer(g, now, "x");
    }
    exposed(&mut c, 3, None, now);
    let refused = c.admit(&grant(5, Some(who(40)), OP_READ)).unwrap_err();
    assert_eq!(refused.status(), Status::ResourceExhausted);
    assert!(refused.message().contains("ipc_max_exports_per_requester = 3"), "{refused}");
    c.admit(&grant(5, Some(who(41)), OP_READ)).unwrap();
    c.admit(&grant(3, None, OP_READ)).unwrap();
    // Its channels lost: offers end, and room comes back.
    c.connection_lost(1, |_| false, |_| true);
    assert_eq!(c.holding(Holder::Process(40, 11)).0, 1);
    c.admit(&grant(5, Some(who(40)), OP_READ)).unwrap();
}

/// An importer whose process exited is reclaimed only once nothing else
/// holds its handle (a child it forked keeps the mapping): the export is
/// retained meanwhile, and its process's count of exports left says the
/// watch goes on. Guards `let_go` in `connection_lost` and
/// `reclaim_process`.
#[test]
fn an_exited_importer_whose_handle_is_still_held_keeps_its_export() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let forked = c.offer(grant(1, Some(who(40)), OP_READ), now, "held by a child");
    c.begin_answer(1, &r(forked, 1, 0)).unwrap();
    assert!(matches!(c.finish_answer(1, &r(forked, 1, 0), true), Finished::Exposed));
    let plain = exposed(&mut c, 1, Some(who(40)), now);
    let still_held = std::cell::Cell::new(true);
    let let_go = |res: &&str| !(*res == "held by a child" && still_held.get());
    let lost = c.connection_lost(1, |p| p.pid == 40, let_go);
    assert_eq!((lost.reclaimed, lost.retained), (1, 1));
    assert_eq!(c.state(plain), None);
    assert_eq!(c.state(forked), Some(ExportState::Retained));
    let (again, left) = c.reclaim_process(&who(40).process, true, let_go);
    assert_eq!((again.len(), left), (0, 1));
    still_held.set(false);
    let (none, left) = c.reclaim_process(&who(40).process, false, let_go);
    assert_eq!((none.len(), left), (0, 1), "retained: its process must have exited");
    let (last, left) = c.reclaim_process(&who(40).process, true, let_go);
    assert_eq!((last.len(), left), (1, 0));
    assert!(last[0].exported);
    assert_eq!(c.reclaimed(), 2);
}

/// A close receipt for a handle still open or mapped somewhere (the
/// importer forked, and its child keeps the mapping) leaves the export
/// lingering, watched, counted as kept; a repeated receipt is acknowledged;
/// it ends once nothing holds the handle, whether or not the importer
/// lives. Guards the `held` check in `release`.
#[test]
fn a_close_receipt_for_a_handle_still_held_leaves_the_export_lingering() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = exposed(&mut c, 1, Some(who(40)), now);
    assert!(c.close_receipt(1, Some(who(40)), &r(id, 0, 0), |_| true).unwrap().is_none());
    assert_eq!(c.state(id), Some(ExportState::Lingering));
    assert_eq!(c.counts(), (0, 1));
    assert_eq!(c.lingering(id), Some(who(40).process), "watched");
    assert_eq!(c.lingering(id), None, "once");
    assert!(c.close_receipt(1, Some(who(40)), &r(id, 0, 0), |_| false).unwrap().is_none(), "acknowledged again");
    assert_eq!(c.op_complete(1, &r(id, 1, 1)).err().unwrap().status(), Status::ProtocolError);
    let lost = c.connection_lost(1, |_| true, |_| true);
    assert_eq!((lost.released.len(), lost.retained), (0, 0), "its channel's end changes nothing");
    let (none, left) = c.reclaim_process(&who(40).process, false, |_| false);
    assert_eq!((none.len(), left), (0, 1));
    let (gone, left) = c.reclaim_process(&who(40).process, false, |_| true);
    assert_eq!((gone.len(), left), (1, 0));
    assert!(gone[0].exported);
    assert_eq!(c.counts(), (0, 0));
}

/// An accept answered again while its handle is being made, or for a
/// lingering export (close receipt in, handle still held), is
/// PROTOCOL_ERROR naming the export and changes nothing: no second handle
/// is asked for, the first is still finished, and a lingering export is
/// not revived. Guards `begin_answer`'s `if e.state != ExportState::Offered {`.
#[test]
fn an_offer_is_answered_once_while_exposing_or_lingering() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = c.offer(grant(1, Some(who(40)), OP_READ), now, "held");
    assert!(matches!(c.begin_answer(1, &r(id, 1, 0)), Ok(Answering::Expose { base: 0x10000, writable: false })));
    let again = c.begin_answer(1, &r(id, 1, 0)).err().expect("a second accept while exposing");
    assert_eq!(again.status(), Status::ProtocolError);
    assert!(again.message().contains(&format!("export {id} was already answered")), "{again}");
    assert_eq!(c.state(id), Some(ExportState::Exposing));
    assert!(matches!(c.finish_answer(1, &r(id, 1, 0), true), Finished::Exposed));
    assert!(c.close_receipt(1, Some(who(40)), &r(id, 0, 0), |_| true).unwrap().is_none());
    assert_eq!(c.state(id), Some(ExportState::Lingering));
    let late = c.begin_answer(1, &r(id, 1, 0)).err().expect("an accept of a lingering export");
    assert_eq!(late.status(), Status::ProtocolError);
    assert_eq!(c.state(id), Some(ExportState::Lingering), "not revived");
    assert_eq!(c.counts(), (0, 1));
}

/// An offer waits for its answer only on the channel it was offered on:
/// `offered_base` (whether an accept first waits for the producer stream
/// of its allocation) finds it on that channel under its token, and not
/// on another channel presenting the same id and token, nor under another
/// token, nor once it was answered. Guards `offered_base`'s
/// `e.grant.conn == conn` (round 17 R11: without it a second channel
/// naming another channel's offer made the source wait for, and consume,
/// that allocation's producer stream). Only the CUDA backends' accepts
/// wait (`export_waits`), so no SHM or CMA path reaches it.
#[test]
fn an_offer_waits_for_its_answer_only_on_its_own_channel() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let id = c.offer(grant(1, Some(who(40)), OP_READ), now, "held");
    assert_eq!(c.offered_base(1, &r(id, 1, 0)), Some(0x10000));
    assert_eq!(c.offered_base(2, &r(id, 1, 0)), None, "another channel found the offer");
    assert_eq!(c.offered_base(1, &ExportRef { token: 1, ..r(id, 1, 0) }), None);
    assert!(matches!(c.begin_answer(1, &r(id, 1, 0)), Ok(Answering::Expose { base: 0x10000, writable: false })));
    assert_eq!(c.offered_base(1, &r(id, 1, 0)), None, "an answered offer still waits");
}

/// Each bound of an operation receipt, at the bound and one past it, on
/// an export whose envelope is the grant's 1024 bytes: at least one
/// request, at most `MAX_REQUESTS`; at least a byte per request, at most
/// the envelope per request. Guards `op_complete`'s `bounded` (sweep B:
/// `bytes >= n`, with `n >= 1`, `n <= MAX_REQUESTS` and `bytes <= most`).
#[test]
fn receipt_bounds_take_their_documented_side() {
    let most = crate::transfer::MAX_REQUESTS as u32;
    let cases: [(&str, u32, u64, bool); 8] = [
        ("one request of one byte", 1, 1, true),
        ("no request", 0, 0, false),
        ("three requests of a byte each", 3, 3, true),
        ("three requests in two bytes", 3, 2, false),
        ("three full envelopes", 3, 3072, true),
        ("a byte past three envelopes", 3, 3073, false),
        ("MAX_REQUESTS full envelopes", most, most as u64 * 1024, true),
        ("a byte past MAX_REQUESTS envelopes", most, most as u64 * 1024 + 1, false),
    ];
    for (name, n, bytes, taken) in cases {
        let mut c = ExportsCore::new(Duration::from_secs(5));
        let id = exposed(&mut c, 1, None, Instant::now());
        match c.op_complete(1, &r(id, bytes, n)) {
            Ok(counted) => assert!(taken && counted, "{name}: counted {counted}"),
            Err(e) => {
                assert!(!taken, "{name}: {e}");
                assert_eq!(e.status(), Status::ProtocolError, "{name}: {e}");
                let claim = format!("claims {n} requests of {bytes} bytes within an envelope of 1024 bytes");
                assert!(e.message().contains(&claim), "{name}: {e}");
            }
        }
    }
}

/// The table remembers the last `RECENTLY_CLOSED` closed exports, so a
/// close receipt repeated after a lost ACK is acknowledged: with one
/// more closed, exactly the oldest is forgotten (its repeat finds no
/// export) and the next oldest is still acknowledged. Guards
/// `remember`'s `self.recently_closed.len() > RECENTLY_CLOSED` (sweep B).
#[test]
fn exactly_the_last_recently_closed_exports_are_remembered() {
    let now = Instant::now();
    let mut c = ExportsCore::new(Duration::from_secs(5));
    let ids: Vec<u64> = (0..=RECENTLY_CLOSED)
        .map(|_| {
            let id = exposed(&mut c, 1, None, now);
            assert!(c.close_receipt(1, None, &r(id, 0, 0), |_| false).unwrap().is_some(), "export {id} released");
            id
        })
        .collect();
    assert_eq!(c.len(), 0);
    let oldest = c.close_receipt(1, None, &r(ids[0], 0, 0), |_| false).err().expect("the oldest is forgotten");
    assert_eq!(oldest.status(), Status::NotFound, "{oldest}");
    assert!(c.close_receipt(1, None, &r(ids[1], 0, 0), |_| false).unwrap().is_none(), "the next is remembered");
    let last = ids[RECENTLY_CLOSED];
    assert!(c.close_receipt(1, None, &r(last, 0, 0), |_| false).unwrap().is_none(), "the last is remembered");
}
