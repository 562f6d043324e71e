use super::*;
use crate::error::Status;
use crate::transport::ipc::messages::{encode_reject, OP_READ, OP_WRITE};

const TAG: u64 = 7;
const EPOCH: u64 = 3;
/// The envelope asked for: 4 KiB at 0x11000.
const ENV: (u64, u64) = (0x11000, 0x1000);

fn opening() -> Opening {
    Opening::new(TAG, EPOCH, ENV, OP_READ, 250)
}

/// An honest offer of the envelope inside a 64 KiB allocation at 0x10000.
fn honest() -> ExportOffer {
    ExportOffer {
        tag: TAG,
        export_id: 42,
        token: 0xABCD,
        base: 0x10000,
        physical: 0x10000,
        grant_addr: ENV.0,
        grant_len: ENV.1,
        region_epoch: EPOCH,
        ops: OP_READ | OP_WRITE,
        slot: 0,
        slot_generation: 1,
    }
}

fn handle_body(export_id: u64, token: u64, bytes: &[u8]) -> Vec<u8> {
    let mut b = ExportRef { export_id, token, value: 0, extra: 0 }.encode();
    b.extend_from_slice(bytes);
    b
}

#[test]
fn the_request_carries_the_fields_it_was_built_from() {
    let want = ExportRequest { tag: TAG, region_epoch: EPOCH, addr: ENV.0, len: ENV.1, ops: OP_READ, wait_ms: 250 };
    assert_eq!(opening().request(), want);
}

#[test]
fn an_honest_offer_passes_and_is_answered_by_its_export_and_token() {
    let mut o = opening();
    assert_eq!(o.offered(MsgKind::ExportOffer, &honest().encode(), "src"), Ok(Offered::Checked(honest())));
    assert_eq!(o.answer(true), ExportRef { export_id: 42, token: 0xABCD, value: 1, extra: 0 });
    assert_eq!(o.answer(false), ExportRef { export_id: 42, token: 0xABCD, value: 0, extra: 0 });
}

#[test]
fn a_grant_exactly_the_allocation_passes() {
    let mut o = opening();
    let offer = ExportOffer { grant_addr: 0x10000, grant_len: 0x10000, ..honest() };
    assert_eq!(o.offered(MsgKind::ExportOffer, &offer.encode(), "src"), Ok(Offered::Checked(offer)));
}

/// Every field of an offer that can be wrong: each is declined naming the
/// offered export and token, with a protocol error.
#[test]
fn each_wrong_offer_field_is_declined_with_a_protocol_error() {
    let h = honest();
    let wrong = [
        ("tag", ExportOffer { tag: TAG + 1, ..h }),
        ("zero token", ExportOffer { token: 0, ..h }),
        ("region epoch", ExportOffer { region_epoch: EPOCH + 1, ..h }),
        ("missing op", ExportOffer { ops: OP_WRITE, ..h }),
        ("grant starts after the envelope", ExportOffer { grant_addr: ENV.0 + 1, grant_len: ENV.1, ..h }),
        ("grant ends before the envelope's end", ExportOffer { grant_len: ENV.1 - 1, ..h }),
        ("grant beyond base+physical", ExportOffer { grant_len: 0xF001, ..h }),
        ("grant end overflows", ExportOffer { grant_len: u64::MAX, ..h }),
        ("base after grant_addr", ExportOffer { base: ENV.0 + 1, ..h }),
        ("base+physical overflows", ExportOffer { physical: u64::MAX, ..h }),
    ];
    for (what, offer) in wrong {
        let mut o = opening();
        let got = o.offered(MsgKind::ExportOffer, &offer.encode(), "src");
        let Ok(Offered::Declined { decline, error }) = got else { panic!("{what}: {got:?}") };
        assert_eq!(decline, ExportRef { export_id: 42, token: offer.token, value: 0, extra: 0 }, "{what}");
        assert_eq!(error.status(), Status::ProtocolError, "{what}");
        assert_eq!(error.message(), format!("src: the offer does not match the request ({offer:?})"), "{what}");
    }
}

/// A request for READ and WRITE offered READ alone is declined: an offer
/// must grant every operation asked, not some of them (a WRITE through a
/// read-only mapping would fault this process). Guards `matches`'s
/// `o.ops & r.ops == r.ops` (with `!= 0` a partial grant passes).
#[test]
fn an_offer_granting_only_some_of_the_operations_asked_is_declined() {
    let mut o = Opening::new(TAG, EPOCH, ENV, OP_READ | OP_WRITE, 250);
    let offer = ExportOffer { ops: OP_READ, ..honest() };
    let got = o.offered(MsgKind::ExportOffer, &offer.encode(), "src");
    let Ok(Offered::Declined { decline, error }) = got else { panic!("{got:?}") };
    assert_eq!(decline, ExportRef { export_id: 42, token: offer.token, value: 0, extra: 0 });
    assert_eq!(error.status(), Status::ProtocolError);
    let mut o = Opening::new(TAG, EPOCH, ENV, OP_READ | OP_WRITE, 250);
    assert_eq!(o.offered(MsgKind::ExportOffer, &honest().encode(), "src"), Ok(Offered::Checked(honest())));
}

#[test]
fn a_reject_of_this_tag_gives_its_own_error_and_of_another_a_protocol_error() {
    let mut o = opening();
    let mine = encode_reject(TAG, Status::OutOfRange, "outside");
    assert_eq!(o.offered(MsgKind::ExportReject, &mine, "src"), Err(Error::OutOfRange("outside".into())));
    // Another tag, tag 0 included (no request has it: a reject of tag 0
    // is no answer to this one; guards `offered`'s `t != tag` against an
    // exemption for it).
    for t in [TAG + 1, 0] {
        let other = encode_reject(t, Status::OutOfRange, "outside");
        let e = o.offered(MsgKind::ExportReject, &other, "src").unwrap_err();
        assert_eq!(e, Error::Protocol(format!("reject for tag {t}, expected {TAG}")));
    }
}

#[test]
fn a_request_answered_by_another_kind_or_a_bad_offer_is_a_protocol_error() {
    let mut o = opening();
    let e = o.offered(MsgKind::Ack, &[], "src").unwrap_err();
    assert_eq!(e, Error::Protocol("export request answered with Ack".into()));
    let e = o.offered(MsgKind::ExportOffer, &honest().encode()[..20], "src").unwrap_err();
    assert_eq!(e.status(), Status::ProtocolError);
}

fn checked() -> Opening {
    let mut o = opening();
    assert!(matches!(o.offered(MsgKind::ExportOffer, &honest().encode(), "src"), Ok(Offered::Checked(_))));
    o
}

#[test]
fn the_handle_of_the_checked_offer_gives_the_backend_bytes() {
    let o = checked();
    assert_eq!(o.handle(MsgKind::ExportHandle, &handle_body(42, 0xABCD, b"shm:9")), Ok(b"shm:9".to_vec()));
    assert_eq!(o.handle(MsgKind::ExportHandle, &handle_body(42, 0xABCD, b"")), Ok(Vec::new()));
}

#[test]
fn a_handle_naming_another_export_or_token_is_refused() {
    let o = checked();
    let another = Error::Protocol("ExportHandle names another export".into());
    assert_eq!(o.handle(MsgKind::ExportHandle, &handle_body(43, 0xABCD, b"x")), Err(another.clone()));
    assert_eq!(o.handle(MsgKind::ExportHandle, &handle_body(42, 0xABCE, b"x")), Err(another));
}

#[test]
fn a_short_handle_body_is_refused() {
    let o = checked();
    let body = handle_body(42, 0xABCD, b"");
    let e = o.handle(MsgKind::ExportHandle, &body[..27]).unwrap_err();
    assert_eq!(e, Error::Protocol("ExportHandle body too short".into()));
}

#[test]
fn an_answer_refused_or_answered_by_another_kind_fails_the_handle() {
    let o = checked();
    let reject = encode_reject(42, Status::NotFound, "no such offer");
    assert_eq!(o.handle(MsgKind::ExportReject, &reject), Err(Error::NotFound("no such offer".into())));
    let e = o.handle(MsgKind::Ack, &handle_body(42, 0xABCD, b"")).unwrap_err();
    assert_eq!(e, Error::Protocol("export answer answered with Ack".into()));
}

#[test]
fn a_revalidation_answer_gives_the_slot_generation_or_the_error() {
    let mut ok = TAG.to_le_bytes().to_vec();
    assert_eq!(revalidated(MsgKind::RevalidateOk, &ok), Ok(0));
    ok.extend_from_slice(&9u64.to_le_bytes());
    assert_eq!(revalidated(MsgKind::RevalidateOk, &ok), Ok(9));
    let reject = encode_reject(TAG, Status::Unavailable, "being unregistered");
    assert_eq!(revalidated(MsgKind::ExportReject, &reject), Err(Error::Unavailable("being unregistered".into())));
    let e = revalidated(MsgKind::Ack, &[]).unwrap_err();
    assert_eq!(e, Error::Protocol("revalidate answered with Ack".into()));
}

fn end(entered: bool, uncertain: bool, all_ok: bool) -> GroupEnd {
    GroupEnd { entered, uncertain, all_ok, requests: 3, bytes: 12288 }
}

#[test]
fn an_uncached_group_is_retained_when_uncertain_else_closed() {
    assert_eq!(Ending::<u8>::of(None, end(false, true, false)), Ending::Retain);
    assert_eq!(Ending::<u8>::of(None, end(false, false, true)), Ending::Close);
    assert_eq!(Ending::<u8>::of(None, end(false, false, false)), Ending::Close);
}

#[test]
fn a_cached_uncertain_group_marks_its_entry_uncertain_entered_or_not() {
    assert_eq!(Ending::of(Some(1), end(false, true, false)), Ending::MarkUncertain(1));
    assert_eq!(Ending::of(Some(1), end(true, true, false)), Ending::MarkUncertain(1));
}

#[test]
fn an_entered_group_counts_in_its_slot_only_when_all_succeeded() {
    assert_eq!(Ending::of(Some(1), end(true, false, true)), Ending::Leave { key: 1, requests: 3, bytes: 12288 });
    assert_eq!(Ending::of(Some(1), end(true, false, false)), Ending::Leave { key: 1, requests: 0, bytes: 0 });
}

#[test]
fn a_group_outside_the_slot_sends_its_receipt_only_when_all_succeeded() {
    assert_eq!(Ending::of(Some(1), end(false, false, true)), Ending::Receipt { key: 1, bytes: 12288, requests: 3 });
    assert_eq!(Ending::of(Some(1), end(false, false, false)), Ending::Release(1));
}
