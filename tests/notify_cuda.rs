//! Notifications over NVLink and MNNVL, through the CPU stand-in for the
//! CUDA driver with every asynchronous copy delayed (`FAKECUDA_COPY_DELAY_US`):
//! a notification sent with a WRITE batch leaves only after the copies'
//! completion events, so the receiver, already waiting for it, finds the
//! bytes in its device memory the instant it takes it. Sent at enqueue
//! time, it would find them missing. Cases run as child processes
//! (`tests/fakecuda_harness`); the child is the sender.
#![cfg(feature = "cuda")]

mod common;
mod fakecuda;
mod fakecuda_harness;

use common::pattern_vec;
use fakecuda_harness::*;
use orbite::cuda::raw::host_to_device;
use orbite::*;
use std::time::Duration;

/// Four 1 MiB blocks of distinct patterns WRITten with a notification that
/// names the last one; three rounds.
fn write_then_told(cfg: &str, kind: &str, transport: TransportKind) {
    let mut src = Source::start_with(cfg, kind, 1, &[], &[]);
    let a = src.addrs[0];
    let e = Engine::from_json(&format!(r#"{{"name": "prefill-gpu", {}"#, &cfg[1..])).unwrap();
    let local = CudaMemory::allocate(0, SIZE).unwrap();
    for k in 0..4u64 {
        host_to_device(local.addr() + k * MIB, &pattern_vec(9 + k, MIB as usize)).unwrap();
    }
    e.register_memory(local.addr(), SIZE, Access::NONE).unwrap();
    let peer = e.connect(&src.endpoint, None).unwrap();
    let blocks: Vec<Request> = (0..4u64).map(|k| wr(local.addr() + k * MIB, a + k * MIB, MIB)).collect();
    let opts = SubmitOptions { transport: Transport::Only(transport), timeout: Some(Duration::from_secs(60)) };
    for round in 0..3 {
        src.send("note 60000");
        let msg = format!("verify 0 12 {} {MIB}", 3 * MIB);
        let b = e.submit_with_notification(peer, &blocks, opts, msg.as_bytes()).unwrap();
        b.wait(Duration::from_secs(60)).unwrap();
        assert_eq!(b.transport(3).unwrap(), Some(transport));
        assert_eq!(src.reply(), "prefill-gpu ok", "round {round}");
        assert_eq!(src.cmd(&format!("verify 0 9 0 {MIB}")), "ok");
    }
    let n = e.stats().notifications;
    assert_eq!((n.sent, n.delivered, n.not_sent), (3, 3, 0));
    e.close(Some(Duration::from_secs(60))).unwrap();
}

/// Runs in a child process; does nothing when run directly.
#[test]
fn child_case() {
    let Some(case) = child_case_name() else { return };
    match case.as_str() {
        "nvlink" => {
            write_then_told(r#"{"nvlink": true, "nvlink_async_memcpy_threshold_kb": 0}"#, "ipc", TransportKind::Nvlink)
        }
        "mnnvl" => write_then_told(
            r#"{"mnnvl": {"handle_type": "posix_fd"}, "nvlink_async_memcpy_threshold_kb": 0}"#,
            "mnnvl",
            TransportKind::Mnnvl,
        ),
        other => panic!("unknown case {other}"),
    }
    println!("child case passed");
}

const SLOW: (&str, &str) = ("FAKECUDA_COPY_DELAY_US", "100000");

#[test]
fn a_write_over_nvlink_is_in_place_when_its_notification_is_taken() {
    run("nvlink", &[SLOW]);
}

#[test]
fn a_write_over_mnnvl_is_in_place_when_its_notification_is_taken() {
    run("mnnvl", &[SLOW]);
}
