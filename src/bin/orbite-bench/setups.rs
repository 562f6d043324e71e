//! What a point runs on: the target's memory (shared host, foreign, or a
//! CUDA device's) and the target process spawned on loopback, the engine
//! configurations of both sides, and the initiator's [`Setup`] (its engine,
//! memory and connection, host or CUDA).

use super::*;

/// Fills (and so faults in) a buffer.
pub(super) fn touch(p: *mut u8, len: usize) {
    // SAFETY: callers pass memory they own of at least `len` bytes.
    let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
    for (i, b) in s.iter_mut().enumerate().step_by(4096) {
        *b = i as u8;
    }
}

/// Why NVLink and MNNVL cannot be measured by this build.
#[cfg_attr(feature = "cuda", allow(dead_code))]
pub(super) const NO_CUDA_BUILD: &str =
    "NVLink and MNNVL need orbite-bench built with the cuda feature (cargo build --release --features cuda)";

pub(super) fn is_cuda_transport(t: &str) -> bool {
    t == "nvlink" || t == "mnnvl"
}

/// Memory from the C library's `malloc`, as an application allocates its
/// own buffers (`--memory foreign`), touched once; freed when dropped.
pub(super) struct Foreign {
    pub(super) addr: u64,
}

impl Foreign {
    pub(super) fn new(len: u64) -> Foreign {
        // SAFETY: malloc of `len` bytes; checked below.
        let p = unsafe { libc::malloc(len as usize) };
        if p.is_null() {
            die(&format!("malloc of {len} bytes failed"));
        }
        touch(p.cast(), len as usize);
        Foreign { addr: p as u64 }
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        // SAFETY: the pointer malloc returned in `new`, freed once; its
        // registration ended with its engine, before this drop.
        unsafe { libc::free(self.addr as *mut libc::c_void) };
    }
}

/// What keeps a target's memory alive.
pub(super) enum Served {
    Allocation(orbite::Allocation),
    Foreign(Foreign),
}

impl Served {
    pub(super) fn addr(&self) -> u64 {
        match self {
            Served::Allocation(a) => a.addr(),
            Served::Foreign(f) => f.addr,
        }
    }
}

/// The target's engine and the memory it serves: shared host memory, memory
/// from malloc (`--target-kind foreign`), or (`--target-kind nvlink|mnnvl`)
/// device memory on the first of `--devices`.
pub(super) fn target_memory(o: &Opts) -> (Engine, Served) {
    if is_cuda_transport(&o.target_kind) {
        #[cfg(feature = "cuda")]
        return cuda::target(&o.target_kind, &o.listen, o.devices.0, o.buffer_size, &engine_keys(o, None))
            .map(|(e, a)| (e, Served::Allocation(a)))
            .unwrap_or_else(|e| die(&e));
        #[cfg(not(feature = "cuda"))]
        die(NO_CUDA_BUILD);
    }
    let engine = Engine::from_json(&format!(r#"{{"listen": "{}"{}}}"#, o.listen, engine_keys(o, None)))
        .unwrap_or_else(|e| die(&e.to_string()));
    let served = match o.target_kind.as_str() {
        "foreign" => Served::Foreign(Foreign::new(o.buffer_size)),
        _ => {
            let alloc = allocate_shared_host(o.buffer_size).unwrap_or_else(|e| die(&e.to_string()));
            touch(alloc.addr() as *mut u8, o.buffer_size as usize);
            Served::Allocation(alloc)
        }
    };
    engine.register_memory(served.addr(), o.buffer_size, Access::READ_WRITE).unwrap_or_else(|e| die(&e.to_string()));
    (engine, served)
}

/// A target process started by this run; it exits when its stdin closes.
pub(super) struct Target {
    pub(super) child: std::process::Child,
    pub(super) endpoint: String,
    /// The target process's pid (the raw cross-memory calls of `cma_raw`).
    pub(super) pid: u32,
}

pub(super) fn spawn_target(o: &Opts, kind: &str) -> Target {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--mode", "target", "--until-stdin-closes", "--buffer-size", &o.buffer_size.to_string()])
        .args(["--target-kind", kind, "--devices", &format!("{},{}", o.devices.0, o.devices.1)])
        .args(o.auth_key.iter().flat_map(|k| ["--auth-key", k.as_str()]))
        .args(o.wire_security.iter().flat_map(|w| ["--wire-security", w.as_str()]))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| die(&format!("spawn target: {e}")));
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("target line");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| die(&format!("target said {line:?}")));
    let pid = v["pid"].as_u64().unwrap_or(0) as u32;
    Target { endpoint: v["endpoint"].as_str().expect("endpoint").to_string(), child, pid }
}

impl Drop for Target {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

pub(super) fn transport_of(name: &str) -> Transport {
    match name {
        "tcp" => Transport::Only(TransportKind::Tcp),
        "shm" => Transport::Only(TransportKind::Shm),
        "nvlink" => Transport::Only(TransportKind::Nvlink),
        "mnnvl" => Transport::Only(TransportKind::Mnnvl),
        "cma" => Transport::Only(TransportKind::Cma),
        _ => Transport::Auto,
    }
}

/// One transport's setup: the engine, its peer, the remote region, the
/// local buffers (requests rotate over them), and what keeps them alive.
pub(super) struct Setup {
    pub(super) engine: Engine,
    /// The target's endpoint.
    pub(super) endpoint: String,
    pub(super) peer: u64,
    pub(super) remote: u64,
    pub(super) remote_len: u64,
    pub(super) locals: Vec<u64>,
    pub(super) memory: String,
    pub(super) _allocs: Vec<orbite::Allocation>,
    /// Local memory from malloc (`--memory foreign`).
    pub(super) _foreign: Option<Foreign>,
    pub(super) _target: Option<Target>,
    /// More targets (`--peers`): (peer, remote region address, length).
    pub(super) others: Vec<(u64, u64, u64)>,
    pub(super) _others: Vec<Target>,
}

impl Setup {
    /// A setup with one target (no `--peers`): `allocs` are the local
    /// buffers, of memory kind `memory`.
    pub(super) fn new(
        engine: Engine,
        endpoint: String,
        peer: u64,
        region: &orbite::RegionInfo,
        allocs: Vec<orbite::Allocation>,
        memory: &str,
        target: Option<Target>,
    ) -> Setup {
        Setup {
            engine,
            endpoint,
            peer,
            remote: region.addr,
            remote_len: region.len,
            locals: allocs.iter().map(|a| a.addr()).collect(),
            memory: memory.to_string(),
            _allocs: allocs,
            _foreign: None,
            _target: target,
            others: Vec::new(),
            _others: Vec::new(),
        }
    }
}

pub(super) fn max_inflight(o: &Opts) -> u64 {
    (o.batch as u64 * o.threads as u64 * o.block_sizes.iter().max().copied().unwrap_or(1 << 20))
        .max(1 << 30)
        .next_power_of_two()
        .min(1 << 40)
}

/// The keys every engine of the run shares, for its JSON config: `,
/// "auth_key_file": ...` with `--auth-key`, and `, "name": ...,
/// "discovery": {...}` when `--name` and `--etcd` are given: the target's
/// own name, or for an initiator (`role`) a name of its own beside the
/// target's. "" without them.
pub(super) fn engine_keys(o: &Opts, role: Option<&str>) -> String {
    let wire =
        o.wire_security.as_ref().map(|w| format!(r#", "wire_security": {}"#, serde_json::Value::from(w.as_str())));
    let key = o
        .auth_key
        .as_ref()
        .map(|k| format!(r#", "auth_key_file": {}{}"#, serde_json::Value::from(k.as_str()), wire.unwrap_or_default()));
    let key = key.unwrap_or_default();
    let (Some(target), Some(etcd)) = (&o.name, &o.etcd) else { return key };
    let name = match role {
        None => target.clone(),
        Some(r) => format!("orbite-bench-{}-{r}", std::process::id()),
    };
    format!(r#"{key}, "name": "{name}", "discovery": {{"etcd": ["{etcd}"]}}"#)
}

/// `cfg` (a JSON object) with the discovery keys of an initiator engine.
pub(super) fn initiator_json(o: &Opts, cfg: &str, role: &str) -> String {
    let keys = engine_keys(o, Some(role));
    match cfg.rfind('}') {
        Some(end) if !keys.is_empty() => format!("{}{keys}}}", &cfg[..end]),
        _ => cfg.to_string(),
    }
}

/// Connects `engine` to the target (by `--name` through discovery, or at
/// `endpoint`) and finds the largest region it publishes. Also returns the
/// target's endpoint.
pub(super) fn connect(
    engine: &Engine,
    o: &Opts,
    endpoint: &str,
) -> Result<(u64, orbite::control::message::RegionInfo, String), String> {
    let (peer, endpoint) = match &o.name {
        Some(name) => {
            let p = engine.connect_name(name, None).map_err(|e| format!("connect to {name:?}: {e}"))?;
            (p, engine.peer_endpoint(p).map_err(|e| e.to_string())?)
        }
        None => (engine.connect(endpoint, None).map_err(|e| format!("connect {endpoint}: {e}"))?, endpoint.to_string()),
    };
    let regions = engine.peer_regions(peer, None).map_err(|e| e.to_string())?;
    let region = regions.iter().max_by_key(|r| r.len).copied().ok_or("the target publishes no region")?;
    Ok((peer, region, endpoint))
}

/// Whether transport `t` is measured on memory from malloc: CMA always
/// (it moves nothing else), TCP and auto with `--memory foreign`; SHM never
/// (it moves only the library's shared memory).
pub(super) fn foreign_for(o: &Opts, t: &str) -> bool {
    t == "cma" || (t != "shm" && o.memory == "foreign")
}

/// TCP, SHM, CMA and auto: shared host memory on both sides, or memory
/// from malloc (`foreign`).
pub(super) fn host_setup(o: &Opts, endpoint: Option<&str>, foreign: bool) -> Result<Setup, String> {
    let kind = if foreign { "foreign" } else { "host" };
    let target = (endpoint.is_none() && o.name.is_none()).then(|| spawn_target(o, kind));
    let endpoint =
        endpoint.map(str::to_string).or_else(|| target.as_ref().map(|t| t.endpoint.clone())).unwrap_or_default();
    let cfg = format!(
        r#"{{"shm_cache_entries": 64, "max_inflight_bytes": {}, "max_transfer_bytes": 67108864}}"#,
        max_inflight(o)
    );
    let engine = Engine::from_json(&initiator_json(o, &cfg, "host")).map_err(|e| e.to_string())?;
    let (peer, region, endpoint) = connect(&engine, o, &endpoint)?;
    // `--peers N`: N-1 more targets, all connected to this engine.
    let _others: Vec<Target> = match (target.is_some(), o.peers > 1) {
        (true, true) => (1..o.peers).map(|_| spawn_target(o, kind)).collect(),
        _ => Vec::new(),
    };
    let mut others = Vec::new();
    for t in &_others {
        let (p, r, _) = connect(&engine, &Opts { name: None, ..o.clone() }, &t.endpoint)?;
        others.push((p, r.addr, r.len));
    }
    if foreign {
        let local = Foreign::new(o.buffer_size);
        engine.register_memory(local.addr, o.buffer_size, Access::NONE).map_err(|e| e.to_string())?;
        let mut s = Setup::new(engine, endpoint, peer, &region, Vec::new(), "foreign", target);
        s.locals = vec![local.addr];
        return Ok(Setup { others, _others, _foreign: Some(local), ..s });
    }
    let local = allocate_shared_host(o.buffer_size).map_err(|e| e.to_string())?;
    touch(local.addr() as *mut u8, o.buffer_size as usize);
    engine.register_memory(local.addr(), o.buffer_size, Access::NONE).map_err(|e| e.to_string())?;
    Ok(Setup { others, _others, ..Setup::new(engine, endpoint, peer, &region, vec![local], "shared_host", target) })
}

/// NVLink and MNNVL: the target serves device memory; the initiator's is
/// `--memory`.
#[cfg(feature = "cuda")]
pub(super) fn cuda_setup(o: &Opts, kind: &str, endpoint: Option<&str>) -> Result<Setup, String> {
    let target = (endpoint.is_none() && o.name.is_none()).then(|| spawn_target(o, kind));
    let endpoint =
        endpoint.map(str::to_string).or_else(|| target.as_ref().map(|t| t.endpoint.clone())).unwrap_or_default();
    let cfg = initiator_json(o, &cuda::initiator_config(kind, max_inflight(o)), kind);
    let engine = Engine::from_json(&cfg).map_err(|e| e.to_string())?;
    let (peer, region, endpoint) = connect(&engine, o, &endpoint)?;
    let allocs = cuda::local(&engine, &o.memory, o.devices.1, o.buffer_size)?;
    Ok(Setup::new(engine, endpoint, peer, &region, allocs, &o.memory, target))
}

#[cfg(not(feature = "cuda"))]
pub(super) fn cuda_setup(_: &Opts, _: &str, _: Option<&str>) -> Result<Setup, String> {
    Err(NO_CUDA_BUILD.into())
}
