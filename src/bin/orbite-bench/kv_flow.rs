//! `orbite-bench --mode kv-flow`: the multi-process KV pool flow serving
//! teams run, so that the engine's behaviour in it can be measured and
//! asserted (`tests/kv_pool.rs`).
//!
//! One prefill process owns a pool (`allocate_shared_host`, registered
//! READ|WRITE) of fixed-size blocks, each filled with its own pattern. N
//! decode processes, each with its own engine, run steps: READ scattered
//! distinct blocks of the pool in one batch and check every byte, WRITE
//! blocks into the decode's own area of the pool (a pattern of the decode,
//! the step and the block), READ those back and check them. The scattered
//! READs come from the part of the pool no decode writes (the prefill's
//! pattern); each write area is checked by its owner only.
//!
//! The driver (`--mode kv-flow`) re-executes this binary with the hidden
//! roles `--mode kv-prefill` and `--mode kv-decode`, which print JSON lines
//! on stdout and take commands on stdin; every synchronisation goes through
//! those lines and pipes. Faults: `kill-decode` SIGKILLs decode 0 when it
//! reports the start of the middle step; `freeze-prefill` SIGSTOPs the
//! prefill at that moment for `--freeze-seconds`, then SIGCONTs it. A failed
//! step is not fatal: the decode reports it and goes on (after
//! `--retry-ms`), and a failed step does not count towards `--steps`, so that
//! a fault cannot use up the steps that measure the recovery.

use orbite::{allocate_shared_host, Access, Engine, Op, Request, Status, SubmitOptions, Transport, TransportKind};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const HELP: &str = "orbite-bench --mode kv-flow: the multi-process KV pool flow

One prefill process owns a pool of blocks (shared host memory, READ|WRITE);
N decode processes each run steps: READ --read-blocks scattered distinct
blocks in one batch and verify them, WRITE --write-blocks blocks into the
decode's own area of the pool, READ them back and verify them.

usage: orbite-bench --mode kv-flow [options]
  --decodes N                decode processes (default 2)
  --transport shm|tcp|auto   forced for every batch (default shm)
  --steps S                  OK steps each decode runs (default 50); failed steps
                             are reported and retried, they do not count
  --pool SIZE                the prefill's pool (default 1GiB)
  --block-size SIZE          (default 256KiB)
  --read-blocks N            scattered READs per step, one batch (default 256)
  --write-blocks N           WRITEs per step, one batch, then READ back (default 32)
  --prefill-config JSON      the prefill's engine config (default {})
  --decode-config JSON       each decode's engine config (default {})
  --fault none|kill-decode|freeze-prefill
                             kill-decode: SIGKILL decode 0 when it starts step S/2;
                             freeze-prefill: SIGSTOP the prefill then, SIGCONT it
                             --freeze-seconds later (default none)
  --freeze-seconds SECONDS   (default 5)
  --deadline-ms MS           each batch's deadline, SubmitOptions timeout (default 5000)
  --retry-ms MS              pause after a failed step (default 100)
  --give-up-seconds SECONDS  a decode stops after failing steps for this long without
                             an OK one (default 30; at least freeze + 2 deadlines + 5)
  --seed N                   block choice (default 1)
  --json FILE                one JSON object summarising the run
Exit status 0 when every step of every surviving decode was OK (after the
fault's recovery), every byte verified, every close OK and the prefill
retains no export; 1 otherwise; 2 for a usage error.
";

/// Write areas hold this many times `--write-blocks` blocks per decode.
const AREA_FACTOR: u64 = 4;
/// Poison written into local buffers before each READ.
const POISON: u64 = 0xDEAD_BEEF_5A5A_A5A5;

#[derive(Debug, Clone)]
struct KvOpts {
    mode: String,
    decodes: usize,
    transport: String,
    steps: u64,
    pool: u64,
    block_size: u64,
    read_blocks: u64,
    write_blocks: u64,
    prefill_config: String,
    decode_config: String,
    fault: String,
    freeze_seconds: f64,
    deadline_ms: u64,
    retry_ms: u64,
    give_up_seconds: f64,
    close_timeout_s: f64,
    idle_timeout_s: f64,
    seed: u64,
    json: Option<String>,
    // roles
    index: usize,
    endpoint: String,
    addr: u64,
}

/// The `--mode` asked for, when it is one of this file's.
pub fn wanted() -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == "--mode")?;
    let m = args.get(i + 1)?;
    ["kv-flow", "kv-prefill", "kv-decode"].contains(&m.as_str()).then(|| m.clone())
}

fn num<T: std::str::FromStr>(k: &str, v: &str) -> T {
    v.parse().unwrap_or_else(|_| super::die(&format!("{k} needs a number, not {v:?}")))
}

fn parse() -> KvOpts {
    let mut o = KvOpts {
        mode: String::new(),
        decodes: 2,
        transport: "shm".into(),
        steps: 50,
        pool: 1 << 30,
        block_size: 256 << 10,
        read_blocks: 256,
        write_blocks: 32,
        prefill_config: "{}".into(),
        decode_config: "{}".into(),
        fault: "none".into(),
        freeze_seconds: 5.0,
        deadline_ms: 5000,
        retry_ms: 100,
        give_up_seconds: 30.0,
        close_timeout_s: 15.0,
        idle_timeout_s: 120.0,
        seed: 1,
        json: None,
        index: 0,
        endpoint: String::new(),
        addr: 0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        if k == "-h" || k == "--help" {
            print!("{HELP}");
            std::process::exit(0)
        }
        let v = it.next().cloned().unwrap_or_else(|| super::die(&format!("{k} needs a value")));
        match k.as_str() {
            "--mode" => o.mode = v,
            "--decodes" => o.decodes = num(k, &v),
            "--transport" => o.transport = v,
            "--steps" => o.steps = num(k, &v),
            "--pool" => o.pool = super::parse_size(&v),
            "--block-size" => o.block_size = super::parse_size(&v),
            "--read-blocks" => o.read_blocks = num(k, &v),
            "--write-blocks" => o.write_blocks = num(k, &v),
            "--prefill-config" => o.prefill_config = v,
            "--decode-config" => o.decode_config = v,
            "--fault" => o.fault = v,
            "--freeze-seconds" => o.freeze_seconds = num(k, &v),
            "--deadline-ms" => o.deadline_ms = num(k, &v),
            "--retry-ms" => o.retry_ms = num(k, &v),
            "--give-up-seconds" => o.give_up_seconds = num(k, &v),
            "--close-timeout" => o.close_timeout_s = num(k, &v),
            "--idle-timeout" => o.idle_timeout_s = num(k, &v),
            "--seed" => o.seed = num(k, &v),
            "--json" => o.json = Some(v),
            "--index" => o.index = num(k, &v),
            "--endpoint" => o.endpoint = v,
            "--addr" => o.addr = num(k, &v),
            other => super::die(&format!("unknown kv-flow option {other:?} (see --mode kv-flow --help)")),
        }
    }
    if !["shm", "tcp", "auto"].contains(&o.transport.as_str()) {
        super::die(&format!("--transport is shm, tcp or auto for kv-flow, not {:?}", o.transport));
    }
    if !["none", "kill-decode", "freeze-prefill"].contains(&o.fault.as_str()) {
        super::die(&format!("--fault is none, kill-decode or freeze-prefill, not {:?}", o.fault));
    }
    if o.decodes == 0 || o.steps == 0 || o.read_blocks == 0 || o.write_blocks == 0 || o.deadline_ms == 0 {
        super::die("--decodes, --steps, --read-blocks, --write-blocks and --deadline-ms must be positive");
    }
    if o.block_size % 8 != 0 {
        super::die("--block-size must be a multiple of 8 bytes");
    }
    if o.fault == "kill-decode" && o.decodes < 2 {
        super::die("--fault kill-decode needs at least 2 decodes (one is killed, the others survive)");
    }
    let floor = o.freeze_seconds + 2.0 * o.deadline_ms as f64 / 1000.0 + 5.0;
    if o.fault == "freeze-prefill" && o.give_up_seconds < floor {
        o.give_up_seconds = floor;
    }
    if let Err(e) = Layout::new(&o) {
        super::die(&e);
    }
    o
}

/// Seconds on CLOCK_MONOTONIC: one clock for every process of the run.
fn mono() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`, which we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The pool's blocks: `[0, read_part)` hold the prefill's pattern and are
/// only read; decode `i` writes `[area_start(i), area_start(i) + area)`.
#[derive(Debug, Clone, Copy)]
struct Layout {
    blocks: u64,
    read_part: u64,
    area: u64,
}

impl Layout {
    fn new(o: &KvOpts) -> Result<Layout, String> {
        let blocks = o.pool / o.block_size;
        let area = o.write_blocks * AREA_FACTOR;
        let writes = area * o.decodes as u64;
        if o.pool % o.block_size != 0 {
            return Err(format!("--pool {} is not a multiple of --block-size {}", o.pool, o.block_size));
        }
        if writes + o.read_blocks > blocks {
            return Err(format!(
                "a pool of {blocks} blocks holds neither {} write-area blocks ({} decodes x {AREA_FACTOR} x \
                 --write-blocks {}) and {} distinct blocks to READ",
                writes, o.decodes, o.write_blocks, o.read_blocks
            ));
        }
        Ok(Layout { blocks, read_part: blocks - writes, area })
    }

    fn area_start(&self, decode: usize) -> u64 {
        self.read_part + decode as u64 * self.area
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of a block's contents: who wrote it (0: the prefill; decode i:
/// i + 1), at which step, which block.
fn key(writer: u64, step: u64, block: u64) -> u64 {
    mix(mix(mix(writer.wrapping_add(0x5EED)) ^ step.wrapping_add(0x57E9)) ^ block.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Word `i` of the block of `key`: distinct keys differ in every word, and
/// a block's words differ from each other (a shifted copy shows), while the
/// check stays as cheap as a memory pass.
fn word(key: u64, i: u64) -> u64 {
    key ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The block of `bytes` bytes at `addr` as words.
///
/// # Safety
/// `addr` is 8-aligned memory of this process, at least `bytes` long, that
/// nothing else touches while the slice lives (no batch in flight on it).
unsafe fn words<'a>(addr: u64, bytes: u64) -> &'a mut [u64] {
    std::slice::from_raw_parts_mut(addr as *mut u64, (bytes / 8) as usize)
}

fn fill(w: &mut [u64], key: u64) {
    for (i, x) in w.iter_mut().enumerate() {
        *x = word(key, i as u64);
    }
}

/// Bytes of `w` that differ from the block of `key`.
fn mismatched(w: &[u64], key: u64) -> u64 {
    let mut bad = 0u64;
    for (i, x) in w.iter().enumerate() {
        let d = *x ^ word(key, i as u64);
        if d != 0 {
            bad += d.to_le_bytes().iter().filter(|b| **b != 0).count() as u64;
        }
    }
    bad
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }

    /// The first `k` entries of `perm` become a uniform choice of distinct
    /// entries in random order (a partial Fisher-Yates; `perm` stays a
    /// permutation).
    fn choose(&mut self, perm: &mut [u64], k: usize) {
        for i in 0..k {
            let j = i + self.below((perm.len() - i) as u64) as usize;
            perm.swap(i, j);
        }
    }
}

fn sname(s: Status) -> String {
    s.c_name().trim_start_matches("ORBITE_STATUS_").to_string()
}

/// Prints one JSON line; a driver that went away ends this process.
fn emit(v: Value) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{v}").and_then(|_| out.flush()).is_err() {
        std::process::exit(3);
    }
}

fn fatal(what: &str, e: impl std::fmt::Display) -> ! {
    emit(json!({"event": "fatal", "message": format!("{what}: {e}")}));
    std::process::exit(1)
}

fn stats_value(e: &Engine) -> Value {
    serde_json::from_str(&e.stats().to_json()).unwrap_or(Value::Null)
}

// ---- the prefill --------------------------------------------------------

fn run_prefill(o: &KvOpts) {
    let layout = Layout::new(o).unwrap_or_else(|e| fatal("layout", e));
    let engine = Engine::from_json(&o.prefill_config).unwrap_or_else(|e| fatal("prefill engine", e));
    let pool = allocate_shared_host(o.pool).unwrap_or_else(|e| fatal("allocate_shared_host", e));
    let t0 = Instant::now();
    for b in 0..layout.blocks {
        // SAFETY: block b of the pool we own; no peer knows of it yet.
        fill(unsafe { words(pool.addr() + b * o.block_size, o.block_size) }, key(0, 0, b));
    }
    let fill_s = t0.elapsed().as_secs_f64();
    engine.register_memory(pool.addr(), o.pool, Access::READ_WRITE).unwrap_or_else(|e| fatal("register_memory", e));
    emit(json!({"event": "ready", "endpoint": engine.endpoint(), "addr": pool.addr(), "len": o.pool,
        "pid": std::process::id(), "fill_seconds": fill_s, "notes": engine.stats().notes}));
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "verify" => {
                // The part of the pool no decode writes still holds the
                // prefill's bytes (a WRITE that landed outside its area, or
                // a READ that wrote the pool, would show here).
                let mut wrong = Vec::new();
                for b in 0..layout.read_part {
                    // SAFETY: read only; the decodes are closed by now.
                    let w = unsafe { words(pool.addr() + b * o.block_size, o.block_size) };
                    if mismatched(w, key(0, 0, b)) != 0 {
                        wrong.push(b);
                    }
                }
                emit(json!({"event": "verify", "read_part_blocks": layout.read_part,
                    "wrong_blocks": wrong.len(), "first_wrong": &wrong[..wrong.len().min(16)]}));
            }
            "stats" => emit(json!({"event": "stats", "stats": stats_value(&engine)})),
            "close" => break,
            other => emit(json!({"event": "error", "message": format!("unknown command {other:?}")})),
        }
    }
    let t = Instant::now();
    let r = engine.close(Some(Duration::from_secs_f64(o.close_timeout_s)));
    let secs = t.elapsed().as_secs_f64();
    let (status, message) = match &r {
        Ok(()) => ("OK".to_string(), String::new()),
        Err(e) => (sname(e.status()), e.message().to_string()),
    };
    emit(json!({"event": "closed", "status": status, "message": message, "seconds": secs,
        "stats": stats_value(&engine)}));
    drop(engine);
    drop(pool);
}

// ---- a decode -----------------------------------------------------------

struct Decode<'a> {
    o: &'a KvOpts,
    engine: &'a Engine,
    peer: u64,
    pool: u64,
    local: u64,
    layout: Layout,
    opts: SubmitOptions,
}

/// One batch: submitted, waited for, described.
struct Outcome {
    v: Value,
    ok: bool,
    /// Per request: ended OK.
    done: Vec<bool>,
}

fn skipped(n: usize, bs: u64) -> Outcome {
    Outcome { v: json!({"status": "SKIPPED", "requests": n, "bytes": n as u64 * bs}), ok: false, done: vec![false; n] }
}

impl Decode<'_> {
    fn run(&self, reqs: &[Request]) -> Outcome {
        let bytes: u64 = reqs.iter().map(|r| r.len).sum();
        let deadline = Duration::from_millis(self.o.deadline_ms);
        let t0 = Instant::now();
        let batch = match self.engine.submit(self.peer, reqs, self.opts) {
            Ok(b) => b,
            Err(e) => {
                return Outcome {
                    v: json!({"status": sname(e.status()), "message": e.message(), "submitted": false,
                        "seconds": t0.elapsed().as_secs_f64(), "requests": reqs.len(), "bytes": bytes,
                        "failed": reqs.len()}),
                    ok: false,
                    done: vec![false; reqs.len()],
                }
            }
        };
        // The deadline is the batch's; waiting longer shows whether the
        // engine keeps it.
        let waited = batch.wait(deadline + Duration::from_secs(10));
        let secs = t0.elapsed().as_secs_f64();
        let mut pending = None;
        if matches!(&waited, Err(e) if e.status() == Status::TimedOut) && batch.poll() == Status::Pending {
            pending = Some(format!(
                "requests still pending {secs:.1} s after the submit (deadline {:.1} s); cancelled",
                deadline.as_secs_f64()
            ));
            batch.cancel();
            let _ = batch.wait(Duration::from_secs(30));
        }
        let results = batch.results();
        let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
        let mut transports: BTreeMap<String, u64> = BTreeMap::new();
        let mut first: Option<usize> = None;
        for (i, r) in results.iter().enumerate() {
            *statuses.entry(sname(r.status)).or_default() += 1;
            let t = match batch.transport(i) {
                Ok(Some(k)) => k.name().to_string(),
                Ok(None) => "unrouted".into(),
                Err(_) => "unknown".into(),
            };
            *transports.entry(t).or_default() += 1;
            if r.status != Status::Ok && first.is_none() {
                first = Some(i);
            }
        }
        let done: Vec<bool> = results.iter().map(|r| r.status == Status::Ok).collect();
        let failed = done.iter().filter(|d| !**d).count();
        let (status, message) = match (&pending, first) {
            (Some(p), _) => ("PENDING".to_string(), p.clone()),
            (None, Some(i)) => match batch.error(i) {
                Some(e) => (sname(e.status()), format!("request {i}: {}", e.message())),
                None => (sname(results[i].status), format!("request {i}")),
            },
            (None, None) => match &waited {
                Ok(()) => ("OK".to_string(), String::new()),
                Err(e) => (sname(e.status()), e.message().to_string()),
            },
        };
        let ok = status == "OK" && failed == 0;
        Outcome {
            v: json!({"status": status, "message": message, "seconds": secs, "requests": reqs.len(),
                "bytes": bytes, "failed": failed, "statuses": statuses, "transports": transports,
                "notes": batch.notes()}),
            ok,
            done,
        }
    }

    fn slot(&self, k: u64) -> u64 {
        self.local + k * self.o.block_size
    }

    /// Checks the requests of `out` that ended OK: local slot `first + k`
    /// holds `blocks[k]` as `key_of` says. Records and returns the
    /// mismatched bytes.
    fn verify(&self, out: &mut Outcome, first: u64, blocks: &[u64], key_of: impl Fn(u64) -> u64) -> u64 {
        let (mut bad, mut bad_blocks, mut verified) = (0u64, 0u64, 0u64);
        for (k, (&block, &done)) in blocks.iter().zip(&out.done).enumerate() {
            if done {
                // SAFETY: our local buffer; the batch has ended.
                let m = mismatched(unsafe { words(self.slot(first + k as u64), self.o.block_size) }, key_of(block));
                bad += m;
                bad_blocks += (m != 0) as u64;
                verified += 1;
            }
        }
        out.v["verified_blocks"] = json!(verified);
        out.v["mismatched_bytes"] = json!(bad);
        out.v["mismatched_blocks"] = json!(bad_blocks);
        bad
    }

    /// One step: READ scattered blocks, verify; WRITE into the own area;
    /// READ those back, verify. A failed batch skips the rest of the step.
    fn step(&self, step: u64, reads: &mut [u64], area: &mut [u64]) -> Value {
        let (o, bs) = (self.o, self.o.block_size);
        let (r, w) = (o.read_blocks as usize, o.write_blocks as usize);
        let mut rng = Rng(mix(o.seed ^ mix(self.o.index as u64 + 1)) ^ mix(step.wrapping_add(0xC0FFEE)));
        rng.choose(reads, r);
        rng.choose(area, w);
        let t_start = mono();
        emit(json!({"event": "step_start", "decode": o.index, "step": step, "t": t_start}));

        // SAFETY (every `words` below): the local buffer is ours, and no
        // batch is in flight on it (each was waited for, or cancelled and
        // waited for, before).
        unsafe { words(self.slot(0), (r + 2 * w) as u64 * bs) }.fill(POISON);
        let read_reqs: Vec<Request> = (0..r)
            .map(|k| Request {
                op: Op::Read,
                local_addr: self.slot(k as u64),
                remote_addr: self.pool + reads[k] * bs,
                len: bs,
            })
            .collect();
        let mut read = self.run(&read_reqs);
        let mut mismatches = self.verify(&mut read, 0, &reads[..r], |b| key(0, 0, b));

        let me = o.index as u64 + 1;
        let first_area = self.layout.area_start(o.index);
        let blocks: Vec<u64> = area[..w].iter().map(|a| first_area + a).collect();
        let (write, readback) = if !read.ok {
            (skipped(w, bs), skipped(w, bs))
        } else {
            let src = r as u64;
            let back = (r + w) as u64;
            for (j, &block) in blocks.iter().enumerate() {
                fill(unsafe { words(self.slot(src + j as u64), bs) }, key(me, step, block));
            }
            let reqs = |op: Op, first: u64| -> Vec<Request> {
                (blocks.iter().enumerate())
                    .map(|(j, &block)| Request {
                        op,
                        local_addr: self.slot(first + j as u64),
                        remote_addr: self.pool + block * bs,
                        len: bs,
                    })
                    .collect()
            };
            let write = self.run(&reqs(Op::Write, src));
            if !write.ok {
                (write, skipped(w, bs))
            } else {
                let mut rb = self.run(&reqs(Op::Read, back));
                mismatches += self.verify(&mut rb, back, &blocks, |b| key(me, step, b));
                (write, rb)
            }
        };
        let ok = read.ok && write.ok && readback.ok && mismatches == 0;
        json!({"event": "step", "decode": o.index, "step": step, "t_start": t_start, "t_end": mono(),
            "ok": ok, "mismatched_bytes": mismatches, "read": read.v, "write": write.v, "readback": readback.v})
    }
}

fn run_decode(o: &KvOpts) {
    let layout = Layout::new(o).unwrap_or_else(|e| fatal("layout", e));
    let engine = Engine::from_json(&o.decode_config).unwrap_or_else(|e| fatal("decode engine", e));
    let peer = engine.connect(&o.endpoint, Some(Duration::from_secs(30))).unwrap_or_else(|e| fatal("connect", e));
    let regions = engine.peer_regions(peer, None).unwrap_or_else(|e| fatal("peer_regions", e));
    if !regions.iter().any(|r| r.addr == o.addr && r.len >= o.pool) {
        fatal("the pool", format!("the prefill publishes no region of {} bytes at {:#x}", o.pool, o.addr));
    }
    let (r, w) = (o.read_blocks, o.write_blocks);
    let local_len = (r + 2 * w) * o.block_size;
    let local = allocate_shared_host(local_len).unwrap_or_else(|e| fatal("local memory", e));
    // SAFETY: our own fresh allocation; faults it in.
    unsafe { words(local.addr(), local_len) }.fill(POISON);
    engine.register_memory(local.addr(), local_len, Access::NONE).unwrap_or_else(|e| fatal("register local", e));
    let transport = match o.transport.as_str() {
        "shm" => Transport::Only(TransportKind::Shm),
        "tcp" => Transport::Only(TransportKind::Tcp),
        _ => Transport::Auto,
    };
    let d = Decode {
        o,
        engine: &engine,
        peer,
        pool: o.addr,
        local: local.addr(),
        layout,
        opts: SubmitOptions { transport, timeout: Some(Duration::from_millis(o.deadline_ms)) },
    };
    let names: Vec<&str> = engine.peer_transports(peer).unwrap_or_default().iter().map(|t| t.name()).collect();
    emit(json!({"event": "ready", "decode": o.index, "pid": std::process::id(), "peer_transports": names,
        "notes": engine.stats().notes}));
    // The driver's commands, one per line: "go", then "stop" (once it has
    // seen enough steps: with a fault, steps that started after it), then
    // "close". Read on a thread of their own so that steps go on meanwhile.
    let (cmd_tx, cmds) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { break };
            if cmd_tx.send(l.trim().to_string()).is_err() {
                break;
            }
        }
    });
    match cmds.recv() {
        Ok(l) if l == "go" => {}
        other => fatal("start", format!("expected \"go\" on stdin, got {other:?}")),
    }
    let stopped = || matches!(cmds.try_recv().as_deref(), Ok("stop") | Err(mpsc::TryRecvError::Disconnected));
    let mut reads: Vec<u64> = (0..layout.read_part).collect();
    let mut area: Vec<u64> = (0..layout.area).collect();
    let (mut step, mut ok_steps, mut failed) = (0u64, 0u64, 0u64);
    let mut failing_since: Option<Instant> = None;
    let mut gave_up = None;
    while !stopped() {
        let v = d.step(step, &mut reads, &mut area);
        let ok = v["ok"] == true;
        emit(v);
        step += 1;
        if ok {
            ok_steps += 1;
            failing_since = None;
            continue;
        }
        failed += 1;
        let since = *failing_since.get_or_insert_with(Instant::now);
        if since.elapsed().as_secs_f64() > o.give_up_seconds {
            gave_up = Some(format!("no OK step for {:.1} s", since.elapsed().as_secs_f64()));
            break;
        }
        if failed >= 1000 {
            gave_up = Some(format!("{failed} failed steps"));
            break;
        }
        std::thread::sleep(Duration::from_millis(o.retry_ms));
    }
    emit(json!({"event": "done", "decode": o.index, "steps_ok": ok_steps, "steps_failed": failed,
        "gave_up": gave_up}));
    // Closed when the driver says so (or goes away).
    let _ = cmds.recv();
    let t = Instant::now();
    let res = engine.close(Some(Duration::from_secs_f64(o.close_timeout_s)));
    let secs = t.elapsed().as_secs_f64();
    let (status, message) = match &res {
        Ok(()) => ("OK".to_string(), String::new()),
        Err(e) => (sname(e.status()), e.message().to_string()),
    };
    emit(json!({"event": "closed", "decode": o.index, "status": status, "message": message, "seconds": secs,
        "stats": stats_value(&engine)}));
    drop(engine);
    drop(local);
}

// ---- the driver ---------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Src {
    Prefill,
    Decode(usize),
}

/// A line from a child (None: its stdout ended).
struct Ev {
    src: Src,
    line: Option<Value>,
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    exited: bool,
}

impl Proc {
    fn spawn(args: &[String], src: Src, tx: &mpsc::Sender<Ev>) -> Proc {
        let exe = std::env::current_exe().unwrap_or_else(|e| super::die(&format!("current_exe: {e}")));
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| super::die(&format!("spawn {src:?}: {e}")));
        let out = child.stdout.take().expect("stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let v = serde_json::from_str(&line).unwrap_or_else(|_| json!({"event": "text", "text": line}));
                if tx.send(Ev { src, line: Some(v) }).is_err() {
                    return;
                }
            }
            let _ = tx.send(Ev { src, line: None });
        });
        let pid = child.id();
        Proc { stdin: child.stdin.take(), child, pid, exited: false }
    }

    fn send(&mut self, cmd: &str) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s, "{cmd}").and_then(|_| s.flush());
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.pid as i32, sig) };
    }

    fn reap(&mut self) -> Option<i32> {
        self.exited = true;
        drop(self.stdin.take());
        self.child.wait().ok().map(|s| s.code().unwrap_or(-1))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[derive(Default)]
struct DecodeState {
    ready: Option<Value>,
    steps: Vec<Value>,
    done: Option<Value>,
    closed: Option<Value>,
    eof: bool,
    killed: bool,
    fatal: Option<String>,
    exit: Option<i32>,
    /// The driver told it to stop stepping.
    stop_sent: bool,
}

#[derive(Default)]
struct Fault {
    /// When it happened: the SIGKILL, or the SIGSTOP and the SIGCONT.
    t_kill: Option<f64>,
    t_stop: Option<f64>,
    t_cont: Option<f64>,
    cont_at: Option<Instant>,
    at_step: Option<u64>,
}

struct Driver {
    o: KvOpts,
    rx: mpsc::Receiver<Ev>,
    prefill: Proc,
    prefill_ready: Value,
    decodes: Vec<Proc>,
    states: Vec<DecodeState>,
    fault: Fault,
    prefill_events: Vec<Value>,
}

impl Driver {
    /// The next line of any child, serving the freeze's SIGCONT on time.
    fn next(&mut self) -> Result<Ev, String> {
        let idle = Duration::from_secs_f64(self.o.idle_timeout_s);
        let start = Instant::now();
        loop {
            let mut wait = idle.saturating_sub(start.elapsed());
            if let Some(at) = self.fault.cont_at {
                wait = wait.min(at.saturating_duration_since(Instant::now()));
            }
            match self.rx.recv_timeout(wait) {
                Ok(ev) => return Ok(ev),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err("every child's output ended".into()),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if self.fault.cont_at.is_some_and(|at| Instant::now() >= at) {
                self.cont();
            } else if start.elapsed() >= idle {
                return Err(format!("no line from any process for {:.0} s", self.o.idle_timeout_s));
            }
        }
    }

    fn cont(&mut self) {
        self.fault.cont_at = None;
        self.prefill.signal(libc::SIGCONT);
        self.fault.t_cont = Some(mono());
        eprintln!("kv-flow: SIGCONT to the prefill");
    }

    /// Records a decode's line; injects the fault at its moment.
    fn on_decode(&mut self, i: usize, v: Option<Value>) -> Result<(), String> {
        let Some(v) = v else {
            self.states[i].eof = true;
            return Ok(());
        };
        match v["event"].as_str().unwrap_or("") {
            "ready" => self.states[i].ready = Some(v),
            "step_start" => {
                let step = v["step"].as_u64().unwrap_or(0);
                if i == 0 && step == self.o.steps / 2 && self.fault.at_step.is_none() {
                    self.inject(step)?;
                }
            }
            "step" => {
                self.states[i].steps.push(v);
                self.maybe_stop(i);
            }
            "done" => self.states[i].done = Some(v),
            "closed" => self.states[i].closed = Some(v),
            "fatal" => {
                let m = v["message"].as_str().unwrap_or("").to_string();
                self.states[i].fatal = Some(m.clone());
                return Err(format!("decode {i}: {m}"));
            }
            _ => eprintln!("kv-flow: decode {i}: {v}"),
        }
        Ok(())
    }

    /// Tells decode `i` to stop once it has its OK steps and, with a fault,
    /// two OK steps that started after the fault was over (the kill, or
    /// the SIGCONT): recovery is then measured on steps that really ran
    /// after it, however little the fault slowed the decodes.
    fn maybe_stop(&mut self, i: usize) {
        let st = &self.states[i];
        if st.stop_sent || st.killed {
            return;
        }
        let ok = |s: &&Value| s["ok"] == true;
        if (st.steps.iter().filter(ok).count() as u64) < self.o.steps {
            return;
        }
        let over = match self.o.fault.as_str() {
            "kill-decode" => self.fault.t_kill,
            "freeze-prefill" => self.fault.t_cont,
            _ => Some(f64::NEG_INFINITY),
        };
        let Some(t0) = over else { return };
        let after = st.steps.iter().filter(|s| s["t_start"].as_f64().unwrap_or(0.0) >= t0).filter(ok).count();
        if after < 2 {
            return;
        }
        self.states[i].stop_sent = true;
        self.decodes[i].send("stop");
    }

    fn inject(&mut self, step: u64) -> Result<(), String> {
        match self.o.fault.as_str() {
            "kill-decode" => {
                self.fault.at_step = Some(step);
                self.fault.t_kill = Some(mono());
                self.decodes[0].signal(libc::SIGKILL);
                self.states[0].exit = self.decodes[0].reap();
                self.states[0].killed = true;
                eprintln!("kv-flow: SIGKILL to decode 0 at the start of its step {step}");
            }
            "freeze-prefill" => {
                self.fault.at_step = Some(step);
                self.prefill.signal(libc::SIGSTOP);
                let mut status = 0;
                // SAFETY: waitpid on our own child; reports the completed
                // group stop without reaping it.
                let r = unsafe { libc::waitpid(self.prefill.pid as i32, &mut status, libc::WUNTRACED) };
                if r != self.prefill.pid as i32 || !libc::WIFSTOPPED(status) {
                    return Err(format!("the prefill did not stop (waitpid {r}, status {status})"));
                }
                self.fault.t_stop = Some(mono());
                self.fault.cont_at = Some(Instant::now() + Duration::from_secs_f64(self.o.freeze_seconds));
                eprintln!("kv-flow: SIGSTOP to the prefill at decode 0's step {step}");
            }
            _ => {}
        }
        Ok(())
    }

    fn prefill_line(&mut self, v: Option<Value>) -> Result<(), String> {
        match v {
            None => Err("the prefill's output ended".into()),
            Some(v) if v["event"] == "fatal" => Err(format!("prefill: {}", v["message"])),
            Some(v) => {
                self.prefill_events.push(v);
                Ok(())
            }
        }
    }

    /// Waits for the prefill's reply `event`.
    fn prefill_reply(&mut self, event: &str) -> Result<Value, String> {
        loop {
            let ev = self.next()?;
            match ev.src {
                Src::Prefill => {
                    self.prefill_line(ev.line)?;
                    let last = self.prefill_events.last().cloned().unwrap_or(Value::Null);
                    if last["event"] == event {
                        return Ok(last);
                    }
                }
                Src::Decode(i) => self.on_decode(i, ev.line)?,
            }
        }
    }

    fn run(&mut self) -> Result<Value, String> {
        while self.states.iter().any(|s| s.ready.is_none()) {
            let ev = self.next()?;
            match ev.src {
                Src::Prefill => self.prefill_line(ev.line)?,
                Src::Decode(i) => {
                    if ev.line.is_none() {
                        return Err(format!("decode {i} exited before it was ready"));
                    }
                    self.on_decode(i, ev.line)?
                }
            }
        }
        let t_go = mono();
        for d in &mut self.decodes {
            d.send("go");
        }
        // Until every decode is done (or gone).
        while self.states.iter().any(|s| s.done.is_none() && !s.eof) {
            let ev = self.next()?;
            match ev.src {
                Src::Prefill => self.prefill_line(ev.line)?,
                Src::Decode(i) => self.on_decode(i, ev.line)?,
            }
        }
        if self.fault.cont_at.is_some() {
            self.cont();
        }
        for (i, d) in self.decodes.iter_mut().enumerate() {
            if !self.states[i].killed {
                d.send("close");
            }
        }
        while self.states.iter().any(|s| s.closed.is_none() && !s.eof) {
            let ev = self.next()?;
            match ev.src {
                Src::Prefill => self.prefill_line(ev.line)?,
                Src::Decode(i) => self.on_decode(i, ev.line)?,
            }
        }
        for (i, d) in self.decodes.iter_mut().enumerate() {
            if !self.states[i].killed {
                self.states[i].exit = d.reap();
            }
        }
        self.prefill.send("verify");
        let verify = self.prefill_reply("verify")?;
        self.prefill.send("stats");
        let stats = self.prefill_reply("stats")?;
        self.prefill.send("close");
        let closed = self.prefill_reply("closed")?;
        let exit = self.prefill.reap();
        Ok(json!({"t_go": t_go, "verify": verify, "stats": stats["stats"], "closed": closed, "exit": exit}))
    }
}

fn role_args(o: &KvOpts) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--decodes".into(),
        o.decodes.to_string(),
        "--pool".into(),
        o.pool.to_string(),
        "--block-size".into(),
        o.block_size.to_string(),
        "--read-blocks".into(),
        o.read_blocks.to_string(),
        "--write-blocks".into(),
        o.write_blocks.to_string(),
        "--close-timeout".into(),
        o.close_timeout_s.to_string(),
    ];
    a.extend(["--seed".into(), o.seed.to_string()]);
    a
}

fn percentile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    super::percentile(&s, q)
}

/// Median and p90 of a batch kind's times over OK steps, and GB/s at each.
fn times(steps: &[&Value], batch: &str) -> Value {
    let secs: Vec<f64> = steps.iter().filter_map(|s| s[batch]["seconds"].as_f64()).collect();
    let bytes = steps.first().and_then(|s| s[batch]["bytes"].as_u64()).unwrap_or(0) as f64;
    let (m, p) = (percentile(&secs, 0.5), percentile(&secs, 0.9));
    let gbps = |t: f64| if t > 0.0 { bytes / t / 1e9 } else { 0.0 };
    json!({"median_ms": m * 1e3, "p90_ms": p * 1e3, "median_gbps": gbps(m), "p90_gbps": gbps(p),
        "samples": secs.len()})
}

fn step_times(steps: &[&Value]) -> Value {
    let secs: Vec<f64> = steps.iter().filter_map(|s| Some(s["t_end"].as_f64()? - s["t_start"].as_f64()?)).collect();
    json!({"median_ms": percentile(&secs, 0.5) * 1e3, "p90_ms": percentile(&secs, 0.9) * 1e3})
}

/// What a decode's steps did after `t0` (the kill, or the SIGCONT).
fn recovery(steps: &[Value], t0: f64) -> Value {
    let after: Vec<&Value> = steps.iter().filter(|s| s["t_start"].as_f64().unwrap_or(0.0) >= t0).collect();
    let first = after.first();
    let k = after.iter().position(|s| s["ok"] == true);
    let failed_before = steps.iter().filter(|s| s["t_end"].as_f64().unwrap_or(0.0) < t0 && s["ok"] != true).count();
    let overlapping_failed = steps
        .iter()
        .filter(|s| s["t_start"].as_f64().unwrap_or(0.0) < t0 && s["t_end"].as_f64().unwrap_or(0.0) >= t0)
        .filter(|s| s["ok"] != true)
        .count();
    json!({
        "first_step_after": first.map(|s| s["step"].clone()),
        "first_step_after_ok": first.map(|s| s["ok"] == true),
        "recovery_seconds": k.map(|k| after[k]["t_end"].as_f64().unwrap_or(0.0) - t0),
        "failed_before_recovery": k.unwrap_or(after.len()),
        "failed_after_recovery": k.map(|k| after[k + 1..].iter().filter(|s| s["ok"] != true).count()),
        "failed_overlapping_fault": overlapping_failed,
        "failed_before_fault": failed_before,
        "steps_after": after.len(),
    })
}

fn first_failure(s: &Value) -> Option<(String, String, String)> {
    for b in ["read", "write", "readback"] {
        let st = s[b]["status"].as_str().unwrap_or("");
        if st != "OK" && st != "SKIPPED" {
            return Some((b.into(), st.into(), s[b]["message"].as_str().unwrap_or("").into()));
        }
        if s[b]["mismatched_bytes"].as_u64().unwrap_or(0) > 0 {
            return Some((b.into(), "MISMATCH".into(), format!("{} bytes wrong", s[b]["mismatched_bytes"])));
        }
    }
    None
}

fn summarise(d: &Driver, end: &Result<Value, String>) -> Value {
    let o = &d.o;
    let layout = Layout::new(o).expect("checked");
    let mut problems: Vec<String> = Vec::new();
    if let Err(e) = end {
        problems.push(format!("aborted: {e}"));
    }
    let t_fault = d.fault.t_kill.or(d.fault.t_cont);
    let mut decodes = Vec::new();
    let mut all_ok_steps: Vec<&Value> = Vec::new();
    let (mut span0, mut span1, mut read_bytes, mut write_bytes) = (f64::MAX, 0f64, 0u64, 0u64);
    for (i, s) in d.states.iter().enumerate() {
        let ok: Vec<&Value> = s.steps.iter().filter(|x| x["ok"] == true).collect();
        let failed = s.steps.len() - ok.len();
        let mismatched: u64 = s.steps.iter().map(|x| x["mismatched_bytes"].as_u64().unwrap_or(0)).sum();
        let mut by_transport: BTreeMap<String, u64> = BTreeMap::new();
        for st in &s.steps {
            for b in ["read", "write", "readback"] {
                if let Some(m) = st[b]["transports"].as_object() {
                    for (k, v) in m {
                        *by_transport.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
                    }
                }
            }
        }
        let mut failures = Vec::new();
        let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
        for st in s.steps.iter().filter(|x| x["ok"] != true) {
            if let Some((b, status, msg)) = first_failure(st) {
                *kinds.entry(format!("{b} {status}")).or_default() += 1;
                if failures.len() < 20 {
                    failures.push(json!({"step": st["step"], "batch": b, "status": status, "message": msg,
                        "notes": st[b]["notes"]}));
                }
            }
        }
        for st in &s.steps {
            span0 = span0.min(st["t_start"].as_f64().unwrap_or(f64::MAX));
            span1 = span1.max(st["t_end"].as_f64().unwrap_or(0.0));
            if st["ok"] == true {
                read_bytes += st["read"]["bytes"].as_u64().unwrap_or(0);
                write_bytes += st["write"]["bytes"].as_u64().unwrap_or(0);
            }
        }
        let close = s.closed.as_ref().map(|c| {
            json!({"status": c["status"], "message": c["message"], "seconds": c["seconds"],
                "ipc_shm": c["stats"]["ipc"]["shm"], "notes": c["stats"]["notes"]})
        });
        let rec = match (t_fault, s.killed) {
            (Some(t), false) => recovery(&s.steps, t),
            _ => Value::Null,
        };
        // The verdict on this decode.
        if !s.killed {
            if mismatched > 0 {
                problems.push(format!("decode {i}: {mismatched} bytes read wrong"));
            }
            match &s.done {
                Some(done) if done["gave_up"].is_string() => {
                    problems.push(format!("decode {i} gave up: {}", done["gave_up"].as_str().unwrap_or("")))
                }
                Some(_) => {}
                None => problems.push(format!("decode {i} did not finish its steps")),
            }
            if o.fault == "none" && failed > 0 {
                problems.push(format!("decode {i}: {failed} failed steps ({kinds:?})"));
            }
            if !rec.is_null() {
                if rec["first_step_after_ok"] != true {
                    problems.push(format!("decode {i}: the first step started after the fault failed"));
                }
                match rec["failed_after_recovery"].as_u64() {
                    None => problems.push(format!(
                        "decode {i} never recovered: {} steps after the fault, none OK",
                        rec["steps_after"]
                    )),
                    Some(n) if n > 0 => problems.push(format!("decode {i}: {n} steps failed after its recovery")),
                    Some(_) => {}
                }
            }
            match &close {
                Some(c) if c["status"] == "OK" => {}
                Some(c) => problems.push(format!("decode {i} close: {} {}", c["status"], c["message"])),
                None => problems.push(format!("decode {i}: no close reported")),
            }
        }
        if let Some(f) = &s.fatal {
            problems.push(format!("decode {i}: {f}"));
        }
        all_ok_steps.extend(ok.iter().copied());
        decodes.push(json!({
            "index": i,
            "pid": d.decodes[i].pid,
            "killed": s.killed,
            "peer_transports": s.ready.as_ref().map(|r| r["peer_transports"].clone()),
            "steps_ok": ok.len(),
            "steps_failed": failed,
            "steps_attempted": s.steps.len(),
            "gave_up": s.done.as_ref().map(|x| x["gave_up"].clone()),
            "mismatched_bytes": mismatched,
            "requests_by_transport": by_transport,
            "failure_kinds": kinds,
            "failures": failures,
            "read": times(&ok, "read"),
            "write": times(&ok, "write"),
            "readback": times(&ok, "readback"),
            "step": step_times(&ok),
            "recovery": rec,
            "close": close,
            "exit": s.exit,
            "steps": s.steps,
        }));
    }
    let span = (span1 - span0).max(0.0);
    let overall = json!({
        "read": times(&all_ok_steps, "read"),
        "write": times(&all_ok_steps, "write"),
        "readback": times(&all_ok_steps, "readback"),
        "step": step_times(&all_ok_steps),
        "span_seconds": span,
        "aggregate_read_gbps": if span > 0.0 { read_bytes as f64 / span / 1e9 } else { 0.0 },
        "aggregate_write_gbps": if span > 0.0 { write_bytes as f64 / span / 1e9 } else { 0.0 },
    });
    let (mut prefill_ipc, mut prefill_close, mut verify, mut stats) =
        (Value::Null, Value::Null, Value::Null, Value::Null);
    if let Ok(end) = end {
        stats = end["stats"].clone();
        prefill_ipc = stats["ipc"]["shm"].clone();
        verify = end["verify"].clone();
        let c = &end["closed"];
        prefill_close = json!({"status": c["status"], "message": c["message"], "seconds": c["seconds"],
            "ipc_shm_after": c["stats"]["ipc"]["shm"], "exit": end["exit"]});
        if prefill_ipc["exports_retained"] != 0 {
            problems.push(format!("the prefill retains {} exports", prefill_ipc["exports_retained"]));
        }
        if c["status"] != "OK" {
            problems.push(format!("prefill close: {} {}", c["status"], c["message"]));
        }
        if verify["wrong_blocks"] != 0 {
            problems.push(format!("{} blocks of the pool's read part changed", verify["wrong_blocks"]));
        }
    }
    if o.fault != "none" && d.fault.at_step.is_none() {
        problems.push(format!("the fault {} was never injected", o.fault));
    }
    json!({
        "mode": "kv-flow",
        "decodes": o.decodes,
        "transport": o.transport,
        "steps": o.steps,
        "pool": o.pool,
        "block_size": o.block_size,
        "read_blocks": o.read_blocks,
        "write_blocks": o.write_blocks,
        "prefill_config": o.prefill_config,
        "decode_config": o.decode_config,
        "deadline_ms": o.deadline_ms,
        "fault": o.fault,
        "freeze_seconds": o.freeze_seconds,
        "layout": {"blocks": layout.blocks, "read_part_blocks": layout.read_part, "area_blocks": layout.area},
        "fault_event": {"at_step": d.fault.at_step, "t_kill": d.fault.t_kill, "t_stop": d.fault.t_stop,
            "t_cont": d.fault.t_cont},
        "prefill": {"pid": d.prefill.pid, "ready": d.prefill_ready, "verify": verify, "ipc_shm": prefill_ipc,
            "close": prefill_close, "stats": stats},
        "decode": decodes,
        "overall": overall,
        "ok": problems.is_empty(),
        "problems": problems,
    })
}

fn ms_gbps(v: &Value) -> String {
    format!(
        "{:.2} ms ({:.2} GB/s) p90 {:.2} ms ({:.2} GB/s)",
        v["median_ms"].as_f64().unwrap_or(0.0),
        v["median_gbps"].as_f64().unwrap_or(0.0),
        v["p90_ms"].as_f64().unwrap_or(0.0),
        v["p90_gbps"].as_f64().unwrap_or(0.0)
    )
}

fn print_summary(s: &Value) {
    let o = s;
    println!(
        "kv-flow: {} decodes over {}, {} OK steps each; pool {} of {} blocks of {} (read part {}, {} per write \
         area); READ {} / WRITE {} blocks per step; deadline {} ms; fault {}",
        o["decodes"],
        o["transport"].as_str().unwrap_or(""),
        o["steps"],
        super::fmt_size(o["pool"].as_u64().unwrap_or(0)),
        o["layout"]["blocks"],
        super::fmt_size(o["block_size"].as_u64().unwrap_or(0)),
        o["layout"]["read_part_blocks"],
        o["layout"]["area_blocks"],
        o["read_blocks"],
        o["write_blocks"],
        o["deadline_ms"],
        o["fault"].as_str().unwrap_or("")
    );
    println!(
        "  configs: prefill {} decode {}",
        o["prefill_config"].as_str().unwrap_or(""),
        o["decode_config"].as_str().unwrap_or("")
    );
    for d in o["decode"].as_array().into_iter().flatten() {
        println!(
            "decode {}{}: {} OK, {} failed, {} bytes mismatched; requests {}",
            d["index"],
            if d["killed"] == true { " (killed)" } else { "" },
            d["steps_ok"],
            d["steps_failed"],
            d["mismatched_bytes"],
            d["requests_by_transport"]
        );
        if d["steps_ok"].as_u64().unwrap_or(0) > 0 {
            println!("  READ     {}", ms_gbps(&d["read"]));
            println!("  WRITE    {}", ms_gbps(&d["write"]));
            println!("  readback {}", ms_gbps(&d["readback"]));
            println!(
                "  step (with verification) median {:.2} ms p90 {:.2} ms",
                d["step"]["median_ms"].as_f64().unwrap_or(0.0),
                d["step"]["p90_ms"].as_f64().unwrap_or(0.0)
            );
        }
        for f in d["failures"].as_array().into_iter().flatten().take(5) {
            println!("  failed step {}: {} {}: {}", f["step"], f["batch"], f["status"], f["message"]);
        }
        if d["failure_kinds"].as_object().is_some_and(|m| !m.is_empty()) {
            println!("  failures by kind: {}", d["failure_kinds"]);
        }
        if !d["recovery"].is_null() {
            let r = &d["recovery"];
            println!(
                "  after the fault: first step {} ok {}, recovered in {} s, failed before recovery {}, after {}, \
                 overlapping the fault {} (before the fault {})",
                r["first_step_after"],
                r["first_step_after_ok"],
                r["recovery_seconds"].as_f64().map_or("-".into(), |x| format!("{x:.3}")),
                r["failed_before_recovery"],
                r["failed_after_recovery"],
                r["failed_overlapping_fault"],
                r["failed_before_fault"]
            );
        }
        if let Some(c) = d["close"].as_object() {
            println!(
                "  close {} {} in {:.3} s; ipc.shm imports_retained {} imports_cached {} released_after_exit {}",
                c["status"],
                c["message"],
                c["seconds"].as_f64().unwrap_or(0.0),
                c["ipc_shm"]["imports_retained"],
                c["ipc_shm"]["imports_cached"],
                c["ipc_shm"]["imports_released_after_exit"]
            );
        }
    }
    let ov = &o["overall"];
    println!("overall READ     {}", ms_gbps(&ov["read"]));
    println!("overall WRITE    {}", ms_gbps(&ov["write"]));
    println!("overall readback {}", ms_gbps(&ov["readback"]));
    println!(
        "aggregate over {:.2} s: READ {:.2} GB/s, WRITE {:.2} GB/s (all decodes, OK steps)",
        ov["span_seconds"].as_f64().unwrap_or(0.0),
        ov["aggregate_read_gbps"].as_f64().unwrap_or(0.0),
        ov["aggregate_write_gbps"].as_f64().unwrap_or(0.0)
    );
    let p = &o["prefill"];
    let ipc = &p["ipc_shm"];
    println!(
        "prefill ipc.shm after the decodes closed: exports_open {} exports_retained {} imports_retained {} \
         exports_reclaimed_after_exit {} mapping_bytes_charged {}; offers_expired {}",
        ipc["exports_open"],
        ipc["exports_retained"],
        ipc["imports_retained"],
        ipc["exports_reclaimed_after_exit"],
        ipc["mapping_bytes_charged"],
        p["stats"]["offers_expired"]
    );
    if let Some(notes) = p["stats"]["notes"].as_array().filter(|n| !n.is_empty()) {
        println!("prefill notes: {notes:?}");
    }
    println!(
        "prefill close {} {} in {:.3} s; read part: {} wrong blocks",
        p["close"]["status"],
        p["close"]["message"],
        p["close"]["seconds"].as_f64().unwrap_or(0.0),
        p["verify"]["wrong_blocks"]
    );
    if o["ok"] == true {
        println!("verdict: OK");
    } else {
        println!("verdict: FAILED");
        for x in o["problems"].as_array().into_iter().flatten() {
            println!("  - {}", x.as_str().unwrap_or(""));
        }
    }
}

fn run_driver(o: &KvOpts) {
    let (tx, rx) = mpsc::channel();
    let mut pa = vec!["--mode".to_string(), "kv-prefill".into(), "--prefill-config".into(), o.prefill_config.clone()];
    pa.extend(role_args(o));
    let prefill = Proc::spawn(&pa, Src::Prefill, &tx);
    let ready = loop {
        match rx.recv_timeout(Duration::from_secs_f64(o.idle_timeout_s)) {
            Ok(Ev { src: Src::Prefill, line: Some(v) }) if v["event"] == "ready" => break v,
            Ok(Ev { src: Src::Prefill, line: Some(v) }) if v["event"] == "fatal" => {
                super::die(&format!("the prefill failed: {}", v["message"]))
            }
            Ok(Ev { line: Some(v), .. }) => eprintln!("kv-flow: prefill: {v}"),
            _ => super::die("the prefill did not start"),
        }
    };
    let endpoint = ready["endpoint"].as_str().unwrap_or("").to_string();
    let addr = ready["addr"].as_u64().unwrap_or(0);
    let decodes: Vec<Proc> = (0..o.decodes)
        .map(|i| {
            let mut a = vec!["--mode".to_string(), "kv-decode".into(), "--index".into(), i.to_string()];
            a.extend(["--endpoint".into(), endpoint.clone(), "--addr".into(), addr.to_string()]);
            a.extend(["--transport".into(), o.transport.clone(), "--steps".into(), o.steps.to_string()]);
            a.extend(["--decode-config".into(), o.decode_config.clone()]);
            a.extend(["--deadline-ms".into(), o.deadline_ms.to_string(), "--retry-ms".into(), o.retry_ms.to_string()]);
            a.extend(["--give-up-seconds".into(), o.give_up_seconds.to_string()]);
            a.extend(role_args(o));
            Proc::spawn(&a, Src::Decode(i), &tx)
        })
        .collect();
    drop(tx);
    let mut d = Driver {
        o: o.clone(),
        rx,
        prefill,
        prefill_ready: ready,
        states: (0..o.decodes).map(|_| DecodeState::default()).collect(),
        decodes,
        fault: Fault::default(),
        prefill_events: Vec::new(),
    };
    let end = d.run();
    if end.is_err() && d.fault.cont_at.is_some() {
        d.cont();
    }
    let summary = summarise(&d, &end);
    print_summary(&summary);
    if let Some(path) = &o.json {
        let text = serde_json::to_string(&summary).expect("json");
        std::fs::write(path, text + "\n").unwrap_or_else(|e| super::die(&format!("{path}: {e}")));
    }
    // Children still running (an aborted run) are killed by their Drop.
    drop(d);
    std::process::exit(if summary["ok"] == true { 0 } else { 1 })
}

/// Runs the `--mode` [`wanted`] found.
pub fn main(mode: &str) {
    let o = parse();
    match mode {
        "kv-prefill" => run_prefill(&o),
        "kv-decode" => run_decode(&o),
        _ => run_driver(&o),
    }
}
