//! The GPU qualification (`tests/hardware/qualify.py` driving the unchanged
//! `orbite-gpu-qual` binary) run against the CPU stand-in for the CUDA
//! driver: the real NVLink and MNNVL transports across real processes, on
//! every CI run. Only the driver library differs from a GPU machine.
#![cfg(feature = "cuda")]

mod fakecuda;

use fakecuda::Variant;
use std::path::PathBuf;

const SIZE: &str = "4194304";

fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("orbite-fakecuda-{}-{name}", std::process::id()))
}

/// Runs the qualification with `args`, extra environment `env`; returns
/// (exit code, table rows as (transport, memory, mode, result, detail), stdout).
fn qualify(variant: Variant, args: &[&str], env: &[(&str, String)]) -> (i32, Vec<Vec<String>>, String) {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut c = fakecuda::command("python3", variant);
    c.arg(format!("{root}/tests/hardware/qualify.py"))
        .args(["--binary", env!("CARGO_BIN_EXE_orbite-gpu-qual"), "--size", SIZE, "--out"])
        .arg(out_dir(args.join("_").replace(['/', ','], "-").as_str()))
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let rows = stdout
        .lines()
        .filter(|l| l.contains(" | ") && !l.starts_with("transport"))
        .map(|l| l.split(" | ").map(|c| c.trim().to_string()).collect())
        .collect();
    (out.status.code().unwrap_or(-1), rows, stdout)
}

fn count(rows: &[Vec<String>], transport: &str, result: &str) -> usize {
    rows.iter().filter(|r| r[0] == transport && r[3] == result).count()
}

#[test]
fn every_qualification_mode_passes_on_the_stand_in() {
    let (code, rows, out) = qualify(Variant::Full, &[], &[]);
    assert_eq!(code, 0, "{out}");
    // NVLink: 6 modes x device/host/mixed + bandwidth on device; MNNVL:
    // healthy, batch, cache, bandwidth for POSIX-fd and fabric handles.
    assert_eq!(count(&rows, "nvlink", "PASS"), 19, "{out}");
    assert_eq!(count(&rows, "mnnvl-posix_fd", "PASS"), 4, "{out}");
    assert_eq!(count(&rows, "mnnvl-fabric", "PASS"), 4, "{out}");
    assert_eq!(count(&rows, "mnnvl-fabric_domain", "PASS"), 4, "{out}");
    assert_eq!(rows.len(), 31, "{out}");
    let batch = rows.iter().find(|r| r[0] == "nvlink" && r[2] == "batch").unwrap();
    assert_eq!(batch[4], "3 slices, 2 imports", "{out}");
}

#[test]
fn the_ordered_fallback_serves_batches_when_the_driver_lacks_the_batch_symbol() {
    let trace = out_dir("nobatch-trace");
    let _ = std::fs::remove_file(&trace);
    let args = ["--memory", "device,mixed", "--modes", "batch,cache", "--mnnvl", "posix_fd"];
    let env = [("FAKECUDA_TRACE", trace.display().to_string())];
    let (code, rows, out) = qualify(Variant::NoBatch, &args, &env);
    assert_eq!(code, 0, "{out}");
    assert_eq!(rows.len(), 6, "{out}");
    let t = fakecuda::read_trace(&trace);
    assert_eq!(fakecuda::calls(&t, "cuMemcpyBatchAsync_v2"), 0);
    assert!(fakecuda::calls(&t, "cuMemcpyAsync") >= 3, "{t:?}");

    // With the symbol, the independent three-slice batch goes native (and
    // the stand-in runs its copies last to first: the bytes still match).
    let trace = out_dir("batch-trace");
    let _ = std::fs::remove_file(&trace);
    let env = [("FAKECUDA_TRACE", trace.display().to_string())];
    let (code, _, out) = qualify(Variant::Full, &["--memory", "device", "--modes", "batch", "--mnnvl", ""], &env);
    assert_eq!(code, 0, "{out}");
    assert_eq!(fakecuda::calls(&fakecuda::read_trace(&trace), "cuMemcpyBatchAsync_v2"), 1);
}

#[test]
fn fabric_handles_without_an_imex_channel_are_skipped_and_posix_fd_still_passes() {
    for when in ["create", "export"] {
        let env = [("FAKECUDA_NO_FABRIC", when.to_string())];
        let (code, rows, out) = qualify(Variant::Full, &["--memory", "device", "--modes", "healthy"], &env);
        assert_eq!(code, 0, "{when}: {out}");
        assert_eq!(count(&rows, "mnnvl-fabric", "SKIP"), 1, "{when}: {out}");
        assert_eq!(count(&rows, "mnnvl-fabric_domain", "SKIP"), 1, "{when}: {out}");
        assert_eq!(count(&rows, "mnnvl-posix_fd", "PASS"), 1, "{when}: {out}");
        assert!(rows.iter().any(|r| r[0] == "mnnvl-fabric" && r[4].contains("IMEX")), "{out}");
    }
}

#[test]
fn two_visible_devices_are_granted_access_and_served() {
    let env = [("FAKECUDA_DEVICES", "2".to_string())];
    let (code, rows, out) = qualify(Variant::Full, &["--memory", "device,host", "--modes", "healthy,batch"], &env);
    assert_eq!(code, 0, "{out}");
    assert_eq!(rows.len(), 4 + 6, "{out}");
}
