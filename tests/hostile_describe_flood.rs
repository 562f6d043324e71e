//! A DescribeRequest flood (issue 31, item 3), alone in its test binary so
//! that the resident memory it measures is this test's only: 1024
//! DescribeRequests of 16 bytes in one write, against a source of 1024
//! regions (each Describe about 40 KiB), used to queue every Describe at
//! once (40 MiB from 16 KiB sent) and starve the I/O thread's other peers.
mod common;

use common::{pattern_vec, raw_control, rss_kib};
use orbite::control::frame::{FrameHeader, MsgKind};
use orbite::*;
use std::io::Write;
use std::time::Duration;

const REGIONS: usize = 1024;
const BLOCK: usize = 4096;

/// The source (one I/O thread) queues one Describe at a time for the
/// flooder, which never reads: its memory grows by less than 2 MiB, and an
/// honest peer on the same I/O thread completes 1000 READs meanwhile,
/// every byte checked. Guards the source core's one-Describe-at-a-time
/// rule (`tcp/proto/source/receive.rs` `header`'s `DescribeRequest if
/// self.describing` arm: without it, 4.3 MiB) and behind it the
/// per-frame answer bound (without both, about 40 MiB).
#[test]
fn a_describe_flood_queues_one_describe_at_a_time() {
    let src = Engine::from_json(r#"{"io_threads": 1}"#).unwrap();
    let blocks: Vec<Vec<u8>> = (0..REGIONS as u64).map(|i| pattern_vec(i, BLOCK)).collect();
    for b in &blocks {
        src.register_memory(b.as_ptr() as u64, BLOCK as u64, Access::READ).unwrap();
    }
    let req = Engine::from_json("{}").unwrap();
    let mut local = vec![0u8; BLOCK];
    req.register_memory(local.as_mut_ptr() as u64, BLOCK as u64, Access::READ_WRITE).unwrap();
    let peer = req.connect(&src.endpoint(), None).unwrap();
    let opts = SubmitOptions { transport: Transport::Only(TransportKind::Tcp), timeout: Some(Duration::from_secs(30)) };
    let read = |k: usize, local: &mut Vec<u8>| {
        local.fill(0);
        let r = Request {
            op: Op::Read,
            local_addr: local.as_mut_ptr() as u64,
            remote_addr: blocks[k % REGIONS].as_ptr() as u64,
            len: BLOCK as u64,
        };
        let b = req.submit(peer, &[r], opts).unwrap();
        b.wait(Duration::from_secs(60)).unwrap_or_else(|e| panic!("READ {k}: {e}"));
        assert!(local[..] == blocks[k % REGIONS][..], "READ {k}: wrong bytes");
    };
    // Warm: the allocator's pools and the connection's buffers settle.
    for k in 0..100 {
        read(k, &mut local);
    }
    let (mut flooder, d) = raw_control(&src.endpoint());
    assert_eq!(d.regions.len(), REGIONS);
    let rss0 = rss_kib();
    let flood: Vec<u8> = (0..REGIONS).flat_map(|_| FrameHeader::encode(MsgKind::DescribeRequest, 0)).collect();
    flooder.write_all(&flood).unwrap();
    for k in 0..1000 {
        read(k, &mut local);
    }
    let grown = rss_kib().saturating_sub(rss0);
    // About 120 KiB here; one Describe per request (the per-frame bound
    // alone) grows it by 4.3 MiB, every Describe at once by about 40 MiB.
    assert!(grown < 2 * 1024, "the flood grew the source by {grown} KiB");
    drop(flooder);
    req.close(Some(Duration::from_secs(30))).unwrap();
    src.close(Some(Duration::from_secs(30))).unwrap();
}
