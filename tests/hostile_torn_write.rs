//! A WRITE cut mid-payload (issue 58, item 12): a requester killed with -9
//! while its WRITE's payload arrives leaves the source's range part new,
//! part old. The source counts it (`transports.tcp.served_torn`, and the
//! WRITE in `served_failed`) and logs one WARN line naming the peer, the
//! region and the ranges. One binary: the log sink is process-wide (each
//! test reads the lines of its own engine).

mod common;

use common::*;
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::message::{DataRequest, DataResponse, DATA_RESPONSE_LEN};
use orbite::log::{set_sink, Level};
use orbite::*;
use parking_lot::Mutex;
use std::io::Write;
use std::sync::{Arc, OnceLock};

/// Lines logged, with their level.
type Lines = Arc<Mutex<Vec<(Level, String)>>>;

/// Every line logged in this process.
fn lines() -> &'static Lines {
    static LINES: OnceLock<Lines> = OnceLock::new();
    LINES.get_or_init(|| {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        set_sink(Some(Box::new(move |l, m| sink.lock().push((l, m.to_string()))))).unwrap();
        lines
    })
}

/// The torn-WRITE lines `src` logged, with their level.
fn torn_lines(src: &Engine) -> Vec<(Level, String)> {
    let ep = src.endpoint();
    lines().lock().iter().filter(|(_, m)| m.contains("torn WRITE") && m.contains(&ep)).cloned().collect()
}

/// The ranges a torn-WRITE line names: `[a, b) holds the new bytes, [b, c)`.
fn ranges(line: &str) -> (u64, u64, u64) {
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap();
    let new = line.split("had landed: [").nth(1).unwrap();
    let (a, rest) = new.split_once(", ").unwrap();
    let (b, rest) = rest.split_once(") holds the new bytes, [").unwrap();
    let (b2, rest) = rest.split_once(", ").unwrap();
    let (c, _) = rest.split_once(')').unwrap();
    assert_eq!(b, b2, "{line}");
    (hex(a), hex(b), hex(c))
}

/// A raw requester sends a WRITE of 256 KiB, 100 000 bytes of its payload,
/// and goes: the source lands those, then counts the WRITE torn once and
/// failed once, and logs one WARN line naming the peer's address, the
/// region and the exact ranges, which hold what it says. A WRITE that
/// lands whole afterwards is no torn one. Guards `proto/source/mod.rs`
/// `close`'s `Want::Landing` arm (without it: `served_torn` 0, no line)
/// and `torn.rs` `report` (the count and the line).
#[test]
fn a_write_cut_mid_payload_is_counted_once_and_logged_with_its_ranges() {
    lines();
    let src = Engine::from_json(r#"{"log_level": "warn"}"#).unwrap();
    let mut mem = pattern_vec(3, 1 << 20);
    let base = mem.as_mut_ptr() as u64;
    let id = src.register_memory(base, mem.len() as u64, Access::READ_WRITE).unwrap();
    let (mut s, d) = raw_control(&src.endpoint());
    let epoch = d.regions[0].epoch;
    let (off, len, sent) = (4096usize, 256usize << 10, 100_000usize);
    let new = pattern_vec(9, len);
    let write = |s: &mut std::net::TcpStream, tag: u64, payload: &[u8]| {
        let mut f = FrameHeader::encode(MsgKind::WriteRequest, (32 + len) as u32).to_vec();
        f.extend(DataRequest { tag, region_epoch: epoch, addr: base + off as u64, len: len as u64 }.encode());
        f.extend_from_slice(payload);
        s.write_all(&f).unwrap();
    };
    write(&mut s, 7, &new[..sent]);
    let me = s.local_addr().unwrap().to_string();
    // It goes: the source reads what came before the end.
    drop(s);
    eventually("the torn WRITE is counted", || src.stats().transports["tcp"].served_torn == 1);
    eventually("the torn WRITE is logged", || !torn_lines(&src).is_empty());
    let tcp = src.stats().transports["tcp"].clone();
    assert_eq!((tcp.served_torn, tcp.served_failed, tcp.served_requests), (1, 1, 0));
    let logged = torn_lines(&src);
    assert_eq!(logged.len(), 1, "{logged:?}");
    let (level, line) = &logged[0];
    assert_eq!(*level, Level::Warn);
    let (a, b, c) = (base + off as u64, base + (off + sent) as u64, base + (off + len) as u64);
    assert_eq!(ranges(line), (a, b, c), "{line}");
    for needle in [
        format!("the connection from {me} "),
        format!("after {sent} of the {len} bytes of its WRITE (tag 7) to region {id} had landed"),
        "(torn WRITEs on this engine so far: 1)".to_string(),
    ] {
        assert!(line.contains(&needle), "{needle:?} not in {line:?}");
    }
    assert!(mem[off..off + sent] == new[..sent], "the bytes that landed");
    assert!(mem[off + sent..off + len] == pattern_vec(3, 1 << 20)[off + sent..off + len], "the old bytes");

    // A WRITE that lands whole on a new connection: served, nothing torn.
    let (mut s, _) = raw_control(&src.endpoint());
    write(&mut s, 8, &new);
    let mut answer = [0u8; FRAME_HEADER_LEN + DATA_RESPONSE_LEN];
    std::io::Read::read_exact(&mut s, &mut answer).unwrap();
    let h = FrameHeader::decode(answer[..FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!(h.kind, MsgKind::WriteResponse);
    let r = DataResponse::decode(answer[FRAME_HEADER_LEN..].try_into().unwrap()).unwrap();
    assert_eq!((r.tag, r.status), (8, Status::Ok));
    drop(s);
    assert!(mem[off..off + len] == new[..]);
    let tcp = src.stats().transports["tcp"].clone();
    assert_eq!((tcp.served_torn, tcp.served_failed, tcp.served_requests), (1, 1, 1));
    src.close(Some(LONG)).unwrap();
    assert_eq!(torn_lines(&src).len(), 1);
}

/// A requester process (`orbite-peer`) killed with -9 while the payload
/// of its 128 MiB WRITE arrives: the source counts exactly one torn WRITE
/// and logs one line whose ranges are what its memory holds (new bytes up
/// to the cut, old after). A kill that came too late (the WRITE had
/// landed whole, on a very slow machine) is tried again with a new
/// process. Guards the same lines as above, end to end.
#[test]
fn a_requester_killed_mid_write_leaves_one_torn_write_counted_and_logged() {
    const LEN: usize = 128 << 20;
    lines();
    let src = Engine::from_json(r#"{"log_level": "warn"}"#).unwrap();
    let mut mem = pattern_vec(3, LEN);
    let base = mem.as_mut_ptr() as u64;
    let id = src.register_memory(base, LEN as u64, Access::READ_WRITE).unwrap();
    let old0 = mem[0];
    let new = pattern_vec(9, LEN);
    assert_ne!(old0, new[0]);
    for attempt in 0.. {
        let t = src.stats().transports["tcp"].clone();
        assert!(attempt < 5, "no torn WRITE counted in 5 kills mid-WRITE: {t:?}");
        // Over TCP: on one host AUTO would copy this heap memory over CMA.
        let policy = r#"{"transport_policy": ["tcp"]}"#;
        let mut req = PeerProc::spawn_requester(&src.endpoint(), &format!("{base}:4096"), policy);
        req.send(&format!("write {base} {LEN} 9"));
        // The first byte changes as the payload starts landing.
        // SAFETY: `mem` lives to the end of the test; the source's I/O
        // thread writes it meanwhile, so it is read with volatile loads.
        let first = || unsafe { std::ptr::read_volatile(mem.as_ptr()) };
        eventually("the payload starts landing", || first() != old0);
        req.kill();
        eventually("its connections end", || src.stats().incoming_connections == 0);
        if src.stats().transports["tcp"].served_torn > 0 {
            break;
        }
        // It landed whole: again.
        mem.copy_from_slice(&pattern_vec(3, LEN));
    }
    eventually("the torn WRITE is logged", || !torn_lines(&src).is_empty());
    let t = src.stats().transports["tcp"].clone();
    assert_eq!(t.served_torn, 1);
    let logged = torn_lines(&src);
    assert_eq!(logged.len(), 1, "{logged:?}");
    let (level, line) = &logged[0];
    assert_eq!(*level, Level::Warn);
    assert!(line.contains(&format!("to region {id} had landed")), "{line}");
    let (a, b, c) = ranges(line);
    assert!(a >= base && a < b && b < c && c <= base + LEN as u64, "{line}");
    assert!(line.contains(&format!("after {} of the {} bytes", b - a, c - a)), "{line}");
    // Pieces before the torn one (`max_transfer_bytes`) landed whole; the
    // torn one holds the new bytes up to the cut, the old after; nothing
    // after it came.
    let cut = (b - base) as usize;
    assert!(mem[..cut] == new[..cut], "the new bytes end where the line says ({line})");
    assert!(mem[cut..] == pattern_vec(3, LEN)[cut..], "the old bytes start where the line says ({line})");
    src.close(Some(LONG)).unwrap();
}
