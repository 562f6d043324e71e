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

mod decode;
mod driver;
mod prefill;
mod summary;

use decode::run_decode;
use driver::run_driver;
use prefill::run_prefill;
use summary::{print_summary, summarise};

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

/// Runs the `--mode` [`wanted`] found.
pub fn main(mode: &str) {
    let o = parse();
    match mode {
        "kv-prefill" => run_prefill(&o),
        "kv-decode" => run_decode(&o),
        _ => run_driver(&o),
    }
}
