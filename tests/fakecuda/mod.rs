//! Builds the CPU stand-in for the CUDA driver (`tests/fakecuda/fakecuda.c`)
//! as `libcuda.so.1` under the cargo target directory, once per variant and
//! test binary (concurrent test binaries each write a temporary file and
//! rename it into place), and the NVML stand-in (`fakenvml.c`) as
//! `libnvidia-ml.so.1` in a directory of its own. Test processes find them
//! through `LD_LIBRARY_PATH` (NVML only where a test puts its directory
//! there: [`with_nvml`]).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Which library to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Every symbol, including `cuMemcpyBatchAsync_v2`.
    Full,
    /// Built with `-DFAKECUDA_OMIT_BATCH`: no native batch copy symbol.
    NoBatch,
    /// Built with `-DFAKECUDA_OMIT_HOST_UNREGISTER`: `cuMemHostRegister_v2`
    /// but no `cuMemHostUnregister` (a pin could never be released).
    NoHostUnregister,
}

/// The directory holding `libcuda.so.1` of `variant` (built on first use).
pub fn libdir(variant: Variant) -> PathBuf {
    let (name, flags): (&str, &[&str]) = match variant {
        Variant::Full => ("full", &[]),
        Variant::NoBatch => ("nobatch", &["-DFAKECUDA_OMIT_BATCH"]),
        Variant::NoHostUnregister => ("nohostunregister", &["-DFAKECUDA_OMIT_HOST_UNREGISTER"]),
    };
    build(name, "fakecuda.c", "libcuda.so.1", flags)
}

/// The directory holding the NVML stand-in, `libnvidia-ml.so.1` (built on
/// first use).
pub fn nvml_libdir() -> PathBuf {
    build("nvml", "fakenvml.c", "libnvidia-ml.so.1", &[])
}

/// A loader path with the CUDA stand-in of `variant` and the NVML one.
pub fn with_nvml(variant: Variant) -> String {
    format!("{}:{}", libdir(variant).display(), nvml_libdir().display())
}

/// Compiles `tests/fakecuda/{source}` as `{lib}` into a directory `name`
/// under the cargo target directory, once per test binary.
fn build(name: &str, source: &str, lib: &str, flags: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<Vec<(String, PathBuf)>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(|| Mutex::new(Vec::new())).lock().unwrap();
    if let Some((_, d)) = built.iter().find(|(n, _)| n == name) {
        return d.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fakecuda").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!("{lib}.{}.tmp", std::process::id()));
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-fvisibility=hidden"]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakecuda").join(source);
    let out = cc.args(flags).arg("-o").arg(&tmp).arg(src).output().expect("a C compiler (cc)");
    assert!(out.status.success(), "building the {name} stand-in: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&tmp, dir.join(lib)).unwrap();
    built.push((name.to_string(), dir.clone()));
    dir
}

/// `FAKECUDA_*` variables a test process should not inherit by accident.
pub const ENV: &[&str] = &[
    "FAKECUDA_DEVICES",
    "FAKECUDA_DRIVER_VERSION",
    "FAKECUDA_NO_FABRIC",
    "FAKECUDA_COPY_DELAY_US",
    "FAKECUDA_DEAD_EXPORTER",
    "FAKECUDA_FAIL",
    "FAKECUDA_NO_PEER",
    "FAKECUDA_NO_P2P",
    "FAKECUDA_VISIBLE_DEVICES",
    "FAKECUDA_TRACE",
    "FAKECUDA_DEVICE_NAME",
    "FAKECUDA_IMEX_DIR",
    "FAKENVML_GPUS",
    "FAKENVML_CLUSTER",
    "FAKENVML_CLIQUE",
    "FAKENVML_STATE",
    "FAKENVML_STATUS",
    "FAKENVML_INIT",
];

/// A command with the stand-in first on the loader path and no inherited
/// `FAKECUDA_*` settings.
pub fn command(program: impl AsRef<std::ffi::OsStr>, variant: Variant) -> Command {
    let mut c = Command::new(program);
    c.env("LD_LIBRARY_PATH", libdir(variant));
    for k in ENV {
        c.env_remove(k);
    }
    c
}

/// Per-process call counts a `FAKECUDA_TRACE` file recorded:
/// (pid, function, calls).
pub fn read_trace(path: &Path) -> Vec<(u32, String, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect()
}

/// Total calls of `func` in a trace.
pub fn calls(trace: &[(u32, String, u64)], func: &str) -> u64 {
    trace.iter().filter(|(_, f, _)| f == func).map(|(_, _, n)| n).sum()
}

/// The resources the stand-in reports as still live at a process's exit.
pub const LIVE: &[&str] = &[
    "device_allocs",
    "pinned_host",
    "host_registrations",
    "ipc_imports",
    "vmm_handles",
    "reservations",
    "streams",
    "events",
];

/// The live-resource report of every process in a trace: pid -> (resource
/// -> count). A traced process without a complete report (a missing line,
/// or the stand-in's `live:incomplete`) fails the caller: an absent report
/// never reads as a clean one.
pub fn live_reports(trace: &[(u32, String, u64)]) -> BTreeMap<u32, BTreeMap<String, u64>> {
    let mut out: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    for (pid, f, n) in trace {
        let entry = out.entry(*pid).or_default();
        if let Some(what) = f.strip_prefix("live:") {
            assert!(entry.insert(what.to_string(), *n).is_none(), "two live:{what} lines for pid {pid}: {trace:?}");
        }
    }
    for (pid, r) in &out {
        assert!(!r.contains_key("incomplete"), "pid {pid}: the stand-in could not take its report: {trace:?}");
        for what in LIVE {
            assert!(r.contains_key(*what), "pid {pid} left no live:{what} line: {trace:?}");
        }
    }
    out
}
