//! One source engine serving 500 requester connections on its I/O
//! threads: its threads stay bounded, an idle connection costs little
//! resident memory, and the connections are served (pipelined READs
//! answered in order, bytes checked). In a test binary of its own: it
//! counts this process's threads and resident memory.

mod common;

use common::{eventually, pattern_vec, raise_fd_limit, raw_control, rss_kib, threads};
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
use orbite::control::message::{DataRequest, DataResponse, Describe, DATA_RESPONSE_LEN};
use orbite::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const CONNS: usize = 500;

#[test]
fn a_source_serves_500_requesters_on_its_io_threads() {
    raise_fd_limit(2048);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let before = threads();
    let src = Engine::from_json(r#"{"max_incoming_connections": 1000}"#).unwrap();
    let remote = pattern_vec(3, 1 << 20);
    src.register_memory(remote.as_ptr() as u64, remote.len() as u64, Access::READ).unwrap();
    let rss0 = rss_kib();
    let mut conns: Vec<(TcpStream, Describe)> = (0..CONNS).map(|_| raw_control(&src.endpoint())).collect();
    eventually("every connection is served and the handshake threads are gone", || {
        let st = src.stats();
        st.incoming_connections == CONNS
            && st.io.connections_per_thread.iter().sum::<usize>() == CONNS
            && threads() - before <= 2 * cores + 8
    });
    let per_conn = rss_kib().saturating_sub(rss0) * 1024 / CONNS as u64;
    let st = src.stats();
    eprintln!(
        "{CONNS} idle requesters: {} threads, {per_conn} bytes resident each, io {:?}",
        threads() - before,
        st.io
    );
    assert!(per_conn <= 64 * 1024, "an idle incoming connection costs {per_conn} bytes resident");
    assert_eq!(st.io.connections_per_thread.iter().sum::<usize>(), CONNS);

    // Every tenth connection pipelines 100 READs of 4 KiB; the answers come
    // back in order, each with its bytes.
    for (s, d) in conns.iter_mut().step_by(10) {
        let r = d.regions[0];
        let mut frames = Vec::new();
        for tag in 0..100u64 {
            let off = (tag * 4096) % (1 << 20);
            frames.extend_from_slice(&FrameHeader::encode(MsgKind::ReadRequest, 32));
            frames
                .extend_from_slice(&DataRequest { tag, region_epoch: r.epoch, addr: r.addr + off, len: 4096 }.encode());
        }
        s.write_all(&frames).unwrap();
        for tag in 0..100u64 {
            let mut h = [0u8; FRAME_HEADER_LEN];
            s.read_exact(&mut h).unwrap();
            let h = FrameHeader::decode(&h).unwrap();
            assert_eq!((h.kind, h.body_len as usize), (MsgKind::ReadResponse, DATA_RESPONSE_LEN + 4096));
            let mut fixed = [0u8; DATA_RESPONSE_LEN];
            s.read_exact(&mut fixed).unwrap();
            let resp = DataResponse::decode(&fixed).unwrap();
            assert_eq!((resp.tag, resp.status), (tag, Status::Ok));
            let mut payload = vec![0u8; 4096];
            s.read_exact(&mut payload).unwrap();
            let off = ((tag * 4096) % (1 << 20)) as usize;
            assert!(payload[..] == remote[off..off + 4096], "tag {tag}: bytes differ");
        }
    }
    assert_eq!(src.stats().transports["tcp"].served_requests, 100 * CONNS as u64 / 10);
    assert!(threads() - before <= 2 * cores + 8);

    // Half hang up: their records go, the rest stay served.
    conns.truncate(CONNS / 2);
    eventually("the closed half is gone", || src.stats().incoming_connections == CONNS / 2);
    src.close(Some(Duration::from_secs(30))).unwrap();
    for (s, _) in &mut conns {
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
}
