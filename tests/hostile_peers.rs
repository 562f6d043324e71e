//! Hostile peers against the control port and the IPC channel: slow-loris,
//! connection floods, receipts for grants that never existed, lying
//! identities. Each is cut off (or refused) with a typed answer within a
//! bounded time while a well-behaved peer keeps being served, and threads and
//! memory stay within a stated bound.

use orbite::control::frame::{FrameHeader, MsgKind};
use orbite::control::message::{DataRequest, Describe};
use orbite::control::{io, Identity};
use orbite::transport::ipc::channel::{deadline_tick, Channel};
use orbite::transport::ipc::messages::{decode_reject, ExportRef, Hello, Revalidate};
use orbite::*;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

mod hostile;
use hostile::*;

#[test]
fn slow_loris_is_cut_off_during_and_after_the_handshake() {
    let mut g = Good::new(r#"{"handshake_timeout_ms": 1000}"#);
    let ep = g.src.endpoint();
    let trickle = |bytes: Vec<u8>, prefix: Vec<u8>| {
        let mut s = TcpStream::connect(&ep).unwrap();
        s.write_all(&prefix).unwrap();
        let t0 = Instant::now();
        for b in bytes {
            // One byte every 100 ms: the attack itself, not synchronisation.
            if s.write_all(&[b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (error_text(&mut s), t0.elapsed())
    };
    std::thread::scope(|sc| {
        let during = sc.spawn(|| trickle(describe_bytes(), vec![]));
        let mut req = FrameHeader::encode(MsgKind::ReadRequest, 32).to_vec();
        req.extend_from_slice(&DataRequest { tag: 1, region_epoch: 1, addr: 1, len: 1 }.encode());
        let after = sc.spawn(|| trickle(req, describe_bytes()));
        // The well-behaved peer is served meanwhile.
        for _ in 0..20 {
            g.transfer();
        }
        let (text, took) = during.join().unwrap();
        assert!(text.as_deref().unwrap_or("").contains("handshake timeout"), "{text:?}");
        assert!(took < Duration::from_secs(30), "{took:?}");
        let (text, took) = after.join().unwrap();
        assert!(text.as_deref().unwrap_or("").contains("too slow"), "{text:?}");
        assert!(took < Duration::from_secs(30), "{took:?}");
    });
    g.transfer();
    assert!(g.src.stats().events.protocol_errors >= 2);
}

#[test]
fn ipc_receipts_for_grants_that_never_existed_are_refused() {
    let g = Good::new("");
    // Learn the source's IPC channel name from its Describe.
    let mut s = TcpStream::connect(g.src.endpoint()).unwrap();
    s.write_all(&describe_bytes()).unwrap();
    s.set_read_timeout(Some(io::TICK)).unwrap();
    let h = match io::read_header(&mut s, &mut || Ok(())).unwrap() {
        io::HeaderRead::Frame(h) => h,
        io::HeaderRead::Eof => panic!("no describe"),
    };
    let d = Describe::decode(&io::read_body(&mut s, h.body_len, &mut || Ok(())).unwrap()).unwrap();
    let deadline = || Instant::now() + LONG;

    // An IpcHello over TCP (a fabric channel) is refused by an engine that
    // runs no MNNVL fabric domain, with the reason.
    let mut tcp = Channel::connect_tcp(&g.src.endpoint(), deadline()).unwrap();
    let hello = Hello {
        identity: Identity::fresh().unwrap(),
        expected_source_epoch: d.identity.engine_epoch,
        transport: orbite::TransportKind::Mnnvl as u32,
        fabric_domain: [7; 16],
    };
    let f = tcp.call(MsgKind::IpcHello, &hello.encode(), deadline(), "hello").unwrap();
    assert_eq!(f.kind, MsgKind::ExportReject);
    let why = decode_reject(&f.body).unwrap().1;
    assert_eq!(why.status(), Status::NotSupported, "{why}");
    assert!(why.message().contains("fabric domain"), "{why}");

    // A Hello that lies about its pid is refused as stale.
    let mut liar = Channel::connect(&d.ipc_name).unwrap();
    let mut me = Identity::fresh().unwrap();
    me.process.pid = 1;
    let hello =
        Hello { identity: me, expected_source_epoch: d.identity.engine_epoch, transport: 1, fabric_domain: [0; 16] };
    let f = liar.call(MsgKind::IpcHello, &hello.encode(), deadline(), "hello").unwrap();
    assert_eq!(f.kind, MsgKind::ExportReject);
    assert_eq!(decode_reject(&f.body).unwrap().1.status(), Status::StalePeer);

    // An honest Hello is welcome; receipts for unknown exports are refused
    // with NOT_FOUND and the channel stays usable.
    let mut ch = Channel::connect(&d.ipc_name).unwrap();
    let hello = Hello {
        identity: Identity::fresh().unwrap(),
        expected_source_epoch: d.identity.engine_epoch,
        transport: 1,
        fabric_domain: [0; 16],
    };
    assert_eq!(ch.call(MsgKind::IpcHello, &hello.encode(), deadline(), "hello").unwrap().kind, MsgKind::IpcWelcome);
    let bogus = ExportRef { export_id: 12345, token: 999, value: 0, extra: 0 };
    for kind in [MsgKind::CloseReceipt, MsgKind::OpComplete, MsgKind::ExportAnswer] {
        let v = ExportRef { value: 1, ..bogus };
        let f = ch.call(kind, &v.encode(), deadline(), "receipt").unwrap();
        assert_eq!(f.kind, MsgKind::ExportReject, "{kind:?}");
        assert_eq!(decode_reject(&f.body).unwrap().1.status(), Status::NotFound, "{kind:?}");
    }
    let rv = Revalidate { tag: 5, export_id: 12345, token: 999, region_epoch: 1, addr: 4096, len: 8, ops: 1 };
    let f = ch.call(MsgKind::Revalidate, &rv.encode(), deadline(), "revalidate").unwrap();
    assert_eq!(decode_reject(&f.body).unwrap().1.status(), Status::NotFound);
    // A malformed frame is a protocol error: refused, then the channel closes.
    let f = ch.call(MsgKind::ExportRequest, b"garbage", deadline(), "garbage").unwrap();
    assert_eq!(decode_reject(&f.body).unwrap().1.status(), Status::ProtocolError);
    let mut tick = || deadline_tick(deadline(), "eof");
    assert!(ch.recv(&mut tick).is_err(), "the channel must be closed");
    assert_eq!(g.src.stats().ipc["shm"].exports.open, 0);
}
