//! orbite-bench measures NVLink and MNNVL with device memory on both sides
//! (the target's `allocate_ipc` / `allocate_mnnvl` memory, the initiator's
//! device, pinned host or mixed memory) against an in-run CUDA copy
//! baseline, here through the CPU stand-in for the driver. No timing is
//! asserted: the figures are memmove through the stand-in.
#![cfg(feature = "cuda")]

mod fakecuda;

use serde_json::Value;

fn bench(name: &str, args: &[&str], env: &[(&str, &str)]) -> (Vec<Value>, Vec<(u32, String, u64)>) {
    let dir = std::env::temp_dir().join(format!("orbite-bench-cuda-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("points.json");
    let trace = dir.join("trace");
    let _ = std::fs::remove_file(&trace);
    let out = fakecuda::command(env!("CARGO_BIN_EXE_orbite-bench"), fakecuda::Variant::Full)
        .args(["--duration", "0.2", "--buffer-size", "4MiB", "--block-size", "64KiB,1MiB", "--batch-size", "4"])
        .args(["--json", json.to_str().unwrap()])
        .args(args)
        .env("FAKECUDA_TRACE", &trace)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let points = std::fs::read_to_string(&json).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let trace = fakecuda::read_trace(&trace);
    let _ = std::fs::remove_dir_all(&dir);
    (points, trace)
}

#[test]
fn nvlink_and_mnnvl_points_move_device_memory_against_a_cuda_copy_baseline() {
    for (memory, baseline) in [("device", "cuda_d2d"), ("host", "cuda_pinned_h2d"), ("mixed", "cuda_d2d")] {
        let (points, trace) = bench(memory, &["--transport", "nvlink,mnnvl", "--memory", memory], &[]);
        assert_eq!(points.len(), 2 * 2 * 2, "transports x ops x block sizes: {points:?}");
        for p in &points {
            assert!(p["transport"] == "nvlink" || p["transport"] == "mnnvl", "{p}");
            assert_eq!(p["memory"], memory, "{p}");
            assert_eq!(p["baseline"], baseline, "{p}");
            assert!(p["baseline_gbps"].as_f64().unwrap() > 0.0, "{p}");
            assert!(p["bytes"].as_u64().unwrap() > 0, "{p}");
            assert_eq!(p["requests_failed"], 0, "{p}");
            let (bytes, secs, gbps) =
                (p["bytes"].as_f64().unwrap(), p["seconds"].as_f64().unwrap(), p["gbps"].as_f64().unwrap());
            assert!((gbps - bytes / secs / 1e9).abs() <= 1e-9 * gbps.max(1.0), "{p}");
        }
        // Device memory on the target side: an allocate_ipc export (NVLink:
        // one IPC handle for the allocation, opened again after each
        // point's flush) and an MNNVL allocation, imported by the initiator.
        let calls = |f: &str| fakecuda::calls(&trace, f);
        assert_eq!(calls("cuIpcGetMemHandle"), 1, "{trace:?}");
        assert!(calls("cuIpcOpenMemHandle_v2") >= 1, "{trace:?}");
        assert!(calls("cuMemImportFromShareableHandle") >= 1, "{trace:?}");
        // And on the initiator's side, per --memory.
        let pinned = calls("cuMemHostAlloc");
        match memory {
            "device" => assert_eq!(pinned, 0, "{trace:?}"),
            _ => assert!(pinned >= 2, "{trace:?}"),
        }
    }
}

#[test]
fn the_baseline_copies_between_the_two_devices() {
    let env = [("FAKECUDA_DEVICES", "2")];
    let (points, trace) = bench("two", &["--transport", "nvlink", "--devices", "0,1", "--op", "read"], &env);
    assert_eq!(points.len(), 2);
    assert!(points.iter().all(|p| p["baseline"] == "cuda_d2d" && p["memory"] == "device"), "{points:?}");
    assert_eq!(fakecuda::calls(&trace, "cuCtxEnablePeerAccess"), 2, "one per baseline point: {trace:?}");
}

/// `--pattern kv` on the CUDA paths: device memory at both ends (the
/// target's allocation cut into regions), READ bytes checked by the bench
/// (exit 1 on a wrong block), one copy per contiguous run with coalescing
/// and one per request without, posting and end-to-end times reported,
/// and a contiguous device copy as the baseline.
#[test]
fn the_kv_pattern_measures_nvlink_and_mnnvl_posting_and_copies() {
    let dir = std::env::temp_dir().join(format!("orbite-bench-cuda-{}-kv", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("points.json");
    let out = fakecuda::command(env!("CARGO_BIN_EXE_orbite-bench"), fakecuda::Variant::Full)
        .args(["--pattern", "kv", "--transport", "nvlink,mnnvl", "--requests", "2048", "--regions", "4"])
        .args(["--repeat", "1", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let points: Vec<Value> =
        std::fs::read_to_string(&json).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(points.len(), 2 * 2 * 2, "transports x ops x coalesce: {points:?}");
    for p in &points {
        assert!(p["transport"] == "nvlink" || p["transport"] == "mnnvl", "{p}");
        assert_eq!(
            (p["requests"].as_u64(), p["requests_failed"].as_u64(), p["wrong_bytes"].as_u64()),
            (Some(2048), Some(0), Some(0)),
            "{p}"
        );
        let copies = p["copies_issued"].as_u64().unwrap();
        let want = if p["coalesce"] == true { p["runs"].as_u64().unwrap() } else { 2048 };
        assert_eq!(copies, want, "{p}");
        assert!(p["posting_ms"].as_f64().unwrap() > 0.0 && p["end_to_end_ms"].as_f64().unwrap() > 0.0, "{p}");
        assert_eq!(p["baseline"], "cuda_d2d_contiguous", "{p}");
        assert!(p["baseline_gbps"].as_f64().unwrap() > 0.0, "{p}");
    }
}
