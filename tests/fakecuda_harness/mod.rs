//! The child-process harness of the tests that run the NVLink and MNNVL
//! transports through the CPU stand-in for the CUDA driver: a test binary
//! re-runs itself as a child (its `child_case` test, selected by
//! `ORBITE_FAKECUDA_CASE`) with the stand-in on its loader path and its own
//! `FAKECUDA_*` settings; the child is the requester and starts
//! `orbite-gpu-qual` source processes. Used by `tests/fakecuda_faults.rs`
//! and `tests/seed_rows_cuda.rs` (each declares `mod common; mod fakecuda;`).
#![allow(dead_code)]

use crate::common::pattern;
use crate::fakecuda::{self, Variant};
use orbite::cuda::raw::device_to_host;
use orbite::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::Duration;

pub const MIB: u64 = 1 << 20;
pub const SIZE: u64 = 4 * MIB;

/// An `orbite-gpu-qual` source process (inherits the stand-in).
pub struct Source {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub endpoint: String,
    pub addrs: Vec<u64>,
}

impl Source {
    /// `kind`: ipc, adopted, mnnvl or egm; `fail`: the source's own FAKECUDA_FAIL.
    pub fn start(config: &str, kind: &str, allocs: usize, fail: Option<&str>) -> Source {
        let env: Vec<(&str, &str)> = fail.map(|f| ("FAKECUDA_FAIL", f)).into_iter().collect();
        Source::start_with(config, kind, allocs, &env, &[])
    }

    /// As [`Source::start`], with the source's own `FAKECUDA_*` settings
    /// and extra arguments (e.g. `--device 1`).
    pub fn start_with(config: &str, kind: &str, allocs: usize, env: &[(&str, &str)], args: &[&str]) -> Source {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_orbite-gpu-qual"));
        for k in fakecuda::ENV {
            c.env_remove(k);
        }
        c.envs(env.iter().copied());
        let mut child = c
            .args(["source", "--size", &SIZE.to_string(), "--allocs", &allocs.to_string(), "--seed", "1"])
            .args(["--config", config, "--kind", kind])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("orbite-gpu-qual");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("source said {line:?}: {e}"));
        Source {
            endpoint: v["endpoint"].as_str().unwrap().to_string(),
            addrs: v["addrs"].as_array().unwrap().iter().map(|a| a.as_u64().unwrap()).collect(),
            child,
            stdin,
            stdout,
        }
    }

    pub fn cmd(&mut self, c: &str) -> String {
        self.send(c);
        self.reply()
    }

    /// Sends a command line without waiting for its reply.
    pub fn send(&mut self, c: &str) {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next reply line.
    pub fn reply(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    /// Asks the source to exit and waits for it (its stand-in trace, if
    /// any, is written at exit).
    pub fn exit(mut self) {
        writeln!(self.stdin, "exit").unwrap();
        self.stdin.flush().unwrap();
        assert!(self.child.wait().unwrap().success());
    }

    pub fn ipc(&mut self, transport: &str, key: &str) -> u64 {
        let v: serde_json::Value = serde_json::from_str(&self.cmd("stats")).unwrap();
        v["ipc"][transport][key].as_u64().unwrap_or_else(|| panic!("no ipc.{transport}.{key} in {v}"))
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The requester side: an engine, two local device buffers, one peer.
pub struct Req {
    pub e: Engine,
    pub peer: u64,
    pub local: Vec<Allocation>,
    pub regions: Vec<u64>,
    pub transport: TransportKind,
}

impl Req {
    pub fn new(config: &str, endpoint: &str, transport: TransportKind) -> Req {
        let e = Engine::from_json(config).unwrap();
        let local: Vec<Allocation> = (0..2).map(|_| CudaMemory::allocate(0, SIZE).unwrap()).collect();
        let regions = local.iter().map(|a| e.register_memory(a.addr(), SIZE, Access::NONE).unwrap()).collect();
        let peer = e.connect(endpoint, None).unwrap();
        Req { e, peer, local, regions, transport }
    }

    pub fn l(&self, i: usize) -> u64 {
        self.local[i].addr()
    }

    pub fn go_within(&self, reqs: &[Request], timeout: Duration) -> Vec<RequestResult> {
        let opts = SubmitOptions { transport: Transport::Only(self.transport), timeout: Some(timeout) };
        let b = self.e.submit(self.peer, reqs, opts).unwrap();
        let _ = b.wait(Duration::from_secs(120));
        b.results()
    }

    pub fn go(&self, reqs: &[Request]) -> Vec<RequestResult> {
        self.go_within(reqs, Duration::from_secs(60))
    }

    pub fn ipc(&self) -> orbite::engine::stats::IpcStats {
        self.e.stats().ipc[self.transport.name()].clone()
    }

    /// Local buffer `i` at `off` holds `len` bytes of the source pattern from `roff`.
    pub fn holds(&self, i: usize, off: u64, len: u64, seed: u64, roff: u64) -> bool {
        let mut host = vec![0u8; len as usize];
        device_to_host(&mut host, self.l(i) + off).unwrap();
        (0..len).all(|k| host[k as usize] == pattern(seed, roff + k))
    }
}

pub fn rd(local: u64, remote: u64, len: u64) -> Request {
    Request { op: Op::Read, local_addr: local, remote_addr: remote, len }
}

pub fn wr(local: u64, remote: u64, len: u64) -> Request {
    Request { op: Op::Write, local_addr: local, remote_addr: remote, len }
}

pub fn res(status: Status, remote_effect: RemoteEffect) -> RequestResult {
    RequestResult { status, remote_effect }
}

pub const NVLINK: &str = r#"{"nvlink": true}"#;
pub const NVLINK_CACHED: &str = r#"{"nvlink": true, "nvlink_cache_entries": 4}"#;
pub const MNNVL_FD: &str = r#"{"mnnvl": {"handle_type": "posix_fd"}}"#;

pub fn nvlink_source(fail: Option<&str>) -> (Source, u64) {
    let s = Source::start(NVLINK, "ipc", 1, fail);
    let a = s.addrs[0];
    (s, a)
}

/// In a child process: the case to run (`None` when run directly, as the
/// test binary's own `child_case` test). Panics when the stand-in did not
/// load, so that a child never passes without it.
pub fn child_case_name() -> Option<String> {
    let case = std::env::var("ORBITE_FAKECUDA_CASE").ok()?;
    if let Some(why) = orbite::cuda::unavailable_reason() {
        panic!("the stand-in did not load: {why}");
    }
    Some(case)
}

pub fn run(case: &str, env: &[(&str, &str)]) {
    run_as(case, Variant::Full, env);
}

/// As [`run`], with the stand-in of `variant` on the child's loader path.
pub fn run_as(case: &str, variant: Variant, env: &[(&str, &str)]) {
    let mut c = fakecuda::command(std::env::current_exe().unwrap(), variant);
    c.args(["--exact", "child_case", "--nocapture", "--test-threads", "1"]).env("ORBITE_FAKECUDA_CASE", case);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("child case passed"),
        "case {case}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a case with `FAKECUDA_TRACE` set and returns the trace it left.
pub fn run_traced(case: &str, env: &[(&str, &str)]) -> Vec<(u32, String, u64)> {
    let trace = std::env::temp_dir().join(format!("orbite-fakecuda-{case}-{}", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let mut all = env.to_vec();
    all.push(("FAKECUDA_TRACE", trace.to_str().unwrap()));
    run(case, &all);
    let lines = fakecuda::read_trace(&trace);
    let _ = std::fs::remove_file(&trace);
    lines
}

/// Host memory pinned for every context (`cuMemHostAlloc`, portable),
/// read and written as a byte slice: what a producer stream copies from or
/// into so that its copies stay asynchronous. From pageable memory the
/// driver synchronises the stream and stages the bytes at the call (the
/// stand-in does too), so a pageable producer is never "still writing"
/// and one behind a gate would block its caller.
pub struct Pinned(Allocation);

/// `data` in pinned host memory.
pub fn pinned_copy(data: &[u8]) -> Pinned {
    let mut p = Pinned(allocate_pinned_host(data.len() as u64).unwrap());
    p.copy_from_slice(data);
    p
}

impl std::ops::Deref for Pinned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: pinned host memory of this allocation, CPU-accessible,
        // `len` bytes, alive while `self` is.
        unsafe { std::slice::from_raw_parts(self.0.addr() as *const u8, self.0.len() as usize) }
    }
}

impl std::ops::DerefMut for Pinned {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes the slice the only one.
        unsafe { std::slice::from_raw_parts_mut(self.0.addr() as *mut u8, self.0.len() as usize) }
    }
}

/// The caller's own VMM storage, created with the driver directly.
pub struct CallerVmm {
    pub va: u64,
    pub size: u64,
    pub handle: u64,
}

pub fn caller_vmm(handle_types: u32, size: u64) -> CallerVmm {
    use cudarc::driver::sys::{self, CUresult};
    use orbite::cuda::driver::{primary_context, ContextGuard};
    let g = ContextGuard::bind(primary_context(0).unwrap()).unwrap();
    // SAFETY: zeroed property block, the fields that matter set below.
    let mut pr: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    pr.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    pr.requestedHandleTypes = sys::CUmemAllocationHandleType_enum(handle_types);
    pr.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    pr.location.id = 0;
    let (mut handle, mut va) = (0u64, 0u64);
    // SAFETY: plain driver calls on out-parameters we own; the access
    // descriptor names device 0 read/write.
    unsafe {
        assert_eq!(sys::cuMemCreate(&mut handle, size as usize, &pr, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuMemAddressReserve(&mut va, size as usize, 0, 0, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuMemMap(va, size as usize, 0, handle, 0), CUresult::CUDA_SUCCESS);
        let d = sys::CUmemAccessDesc {
            location: pr.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        assert_eq!(sys::cuMemSetAccess(va, size as usize, &d, 1), CUresult::CUDA_SUCCESS);
    }
    g.restore().unwrap();
    CallerVmm { va, size, handle }
}
