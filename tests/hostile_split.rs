//! A source that answers only some pieces of a request split by
//! `max_transfer_bytes`: the request is not reported done on the answers
//! it got; it waits for every piece and ends at its deadline.

mod common;

use common::read_request;
use orbite::control::frame::{FrameHeader, MsgKind};
use orbite::control::message::DataResponse;
use orbite::*;
use std::io::Write;
use std::time::Duration;

/// `max_transfer_bytes` of the requester: the READ below moves in three
/// pieces of this size.
const PIECE: usize = 4096;

/// A 12 KiB READ split into three 4 KiB pieces, whose source answers the
/// first piece (its bytes land) and never the other two: the request
/// ends TIMED_OUT at its 3 s deadline, with the first piece's bytes in
/// place and the rest of the local range untouched (reported OK on the
/// first answer, it would end before two thirds of its bytes were read).
/// Guards `transport/tcp/executor.rs` `batch.plan(i, n,
/// TransportKind::Tcp)` (every request is routed as one chunk before the
/// executor splits it).
#[test]
fn a_split_read_answered_for_one_piece_waits_for_the_others() {
    let src = Engine::from_json("").unwrap();
    let remote = vec![9u8; 3 * PIECE];
    src.register_memory(remote.as_ptr() as u64, remote.len() as u64, Access::READ_WRITE).unwrap();
    let req = Engine::from_json(&format!(r#"{{"max_transfer_bytes": {PIECE}}}"#)).unwrap();
    let local = vec![0xeeu8; 3 * PIECE];
    req.register_memory(local.as_ptr() as u64, local.len() as u64, Access::READ_WRITE).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let fake = common::connect_fake_source(&req, &src.endpoint(), move |mut s| {
        let tags = [read_request(&mut s), read_request(&mut s), read_request(&mut s)];
        let fixed = DataResponse { tag: tags[0], status: Status::Ok }.encode();
        s.write_all(&FrameHeader::encode(MsgKind::ReadResponse, (fixed.len() + PIECE) as u32)).unwrap();
        s.write_all(&fixed).unwrap();
        s.write_all(&[0x5a; PIECE]).unwrap();
        let _ = rx.recv();
    });
    let r = Request {
        op: Op::Read,
        local_addr: local.as_ptr() as u64,
        remote_addr: remote.as_ptr() as u64,
        len: 3 * PIECE as u64,
    };
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(3)) };
    let b = req.submit(fake, &[r], opts).unwrap();
    assert_eq!(b.wait(Duration::from_secs(60)).unwrap_err().status(), Status::TransferFailed);
    let r = &b.results()[0];
    assert_eq!((r.status, r.remote_effect), (Status::TimedOut, RemoteEffect::None), "{:?}", b.error(0));
    assert!(local[..PIECE].iter().all(|b| *b == 0x5a), "the answered piece did not land");
    assert!(local[PIECE..].iter().all(|b| *b == 0xee), "bytes landed that no answer carried");
    drop(tx);
}
