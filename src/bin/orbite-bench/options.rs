//! `orbite-bench`'s options: the help text, [`Opts`] and their parsing
//! (sizes with suffixes, comma lists), and how a bad option ends the run.

use super::*;

pub(super) const HELP: &str = "orbite-bench: throughput and latency of OrbiTE transports, with baselines

usage: orbite-bench [options]
  --mode auto|target|initiator|kv-flow
                                 auto (default): start a target on loopback and measure;
                                 target: serve a buffer and print its endpoint;
                                 initiator: measure against --endpoint;
                                 kv-flow: the multi-process KV pool flow, one prefill and
                                 N decodes (options: --mode kv-flow --help)
  --endpoint IP:PORT             the target (initiator mode)
  --auth-key FILE                both engines use this auth_key_file (TCP then sealed)
  --wire-security integrity|encrypt
                                 with --auth-key: what the sealing protects (default integrity)
  --name NAME --etcd URL          target: publish under NAME in etcd (discovery); initiator:
                                 find the target by NAME instead of --endpoint
  --listen IP:PORT               where a target listens (default 127.0.0.1:0)
  --transport LIST               tcp, shm, cma, nvlink, mnnvl, auto (repeatable or comma list;
                                 default: every transport available here). nvlink and mnnvl
                                 move device memory and need a build with the cuda feature
  --memory device|host|mixed|foreign
                                 NVLink/MNNVL: the initiator's memory (device memory, pinned
                                 host memory, or both alternately; default device); the
                                 target always serves device memory. foreign: both sides
                                 register memory from malloc, which tcp, cma and auto move
                                 (default transports then tcp, shm, cma; shm moves its own
                                 shared memory beside them, for comparison). Each cma point
                                 is followed by cma_raw: process_vm_readv/writev alone, one
                                 thread, the same blocks (what the kernel gives one caller),
                                 and cma_raw_par: the same calls, each batch split over as
                                 many threads as the copy pool copies with (the kernel's
                                 limit for the pool; absent on one core)
  --devices A,B                  NVLink/MNNVL: the target's device and the initiator's (default 0,0)
  --op LIST                      read, write (default both)
  --block-size LIST              sizes with B/KiB/MiB/GiB suffixes (default 4KiB,64KiB,1MiB,8MiB)
  --batch-size N                 requests per submission (default 16; up to 1048576 as one submit)
  --pattern seq|random|kv        remote blocks in address order (default), or distinct blocks
                                 scattered over the working set (KV-cache shaped); kv: one
                                 descriptor-heavy submission over many regions, contiguous
                                 runs coalesced or not (options: --pattern kv --help)
  --latency                      latency mode: batch 1, p50/p99 against a raw ping-pong in the
                                 same run (a Unix socket pair for shm, TCP loopback for tcp)
  --notify                       also measure notifications: each WRITE point again with a
                                 notification per batch (op write+n; baseline: the same point
                                 without, ratio of p50s), and standalone notifications per
                                 second (op notify) against the raw ping-pong
  --direct                       SHM, NVLink, MNNVL: copy each request through a direct route
                                 (orbite_direct_copy, on the thread, no batch) instead of
                                 submitting batches; --batch-size requests per timed round
  --threads N                    submitting threads (default 1)
  --readers N                    also measure READ with N initiator processes at once, each with
                                 its own engine and cache, all reading the one target buffer
                                 (the aggregate of the N; default 1: no such points)
  --peers N                      TCP, SHM: N target processes, one engine connected to all,
                                 batches spread over them (aggregate GB/s, p99 per batch)
  --duration SECONDS             time per point (default 3)
  --buffer-size SIZE             working set on each side, blocks rotate over it (default 1GiB)
  --json FILE                    one JSON object per point, one per line
  --plot FILE.svg                throughput against block size, baselines dashed
  --no-baseline                  skip the baselines
";

#[derive(Debug, Clone)]
pub(super) struct Opts {
    pub(super) mode: String,
    pub(super) endpoint: Option<String>,
    /// `--name`: the target's engine name (discovery through `--etcd`).
    pub(super) name: Option<String>,
    pub(super) etcd: Option<String>,
    /// `--auth-key`: both engines authenticate with this key file (and
    /// seal their TCP connections).
    pub(super) auth_key: Option<String>,
    /// `--wire-security`: what sealing protects (with `--auth-key`).
    pub(super) wire_security: Option<String>,
    pub(super) listen: String,
    pub(super) transports: Vec<String>,
    pub(super) ops: Vec<Op>,
    pub(super) block_sizes: Vec<u64>,
    pub(super) batch: usize,
    pub(super) threads: usize,
    pub(super) readers: usize,
    pub(super) peers: usize,
    pub(super) random: bool,
    pub(super) latency: bool,
    pub(super) notify: bool,
    /// `--direct`: copies through direct routes instead of batches.
    pub(super) direct: bool,
    pub(super) duration: f64,
    pub(super) buffer_size: u64,
    pub(super) json: Option<String>,
    pub(super) plot: Option<String>,
    pub(super) baselines: bool,
    pub(super) memory: String,
    pub(super) devices: (i32, i32),
    // internal: the socket-baseline child and the spawned target
    pub(super) connect: Option<String>,
    pub(super) until_stdin_closes: bool,
    pub(super) target_kind: String,
}

pub(super) fn die(msg: &str) -> ! {
    eprintln!("orbite-bench: {msg}");
    std::process::exit(2)
}

pub(super) fn parse_size(s: &str) -> u64 {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (num, mul) = [
        ("gib", 1u64 << 30),
        ("mib", 1 << 20),
        ("kib", 1 << 10),
        ("g", 1 << 30),
        ("m", 1 << 20),
        ("k", 1 << 10),
        ("b", 1),
    ]
    .iter()
    .find(|(suf, _)| lower.ends_with(suf))
    .map(|(suf, m)| (&t[..t.len() - suf.len()], *m))
    .unwrap_or((t, 1));
    let n: u64 = num.trim().parse().unwrap_or_else(|_| die(&format!("bad size {s:?} (e.g. 4KiB, 1MiB)")));
    if n == 0 {
        die(&format!("size {s:?} is zero"));
    }
    n * mul
}

pub(super) fn list(v: &str) -> Vec<String> {
    v.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect()
}

pub(super) fn parse_opts() -> Opts {
    let mut o = Opts {
        mode: "auto".into(),
        endpoint: None,
        name: None,
        etcd: None,
        auth_key: None,
        wire_security: None,
        listen: "127.0.0.1:0".into(),
        transports: Vec::new(),
        ops: Vec::new(),
        block_sizes: Vec::new(),
        batch: 16,
        threads: 1,
        readers: 1,
        peers: 1,
        random: false,
        latency: false,
        notify: false,
        direct: false,
        duration: 3.0,
        buffer_size: 1 << 30,
        json: None,
        plot: None,
        baselines: true,
        memory: "device".into(),
        devices: (0, 0),
        connect: None,
        until_stdin_closes: false,
        target_kind: "host".into(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| die(&format!("{k} needs a value")));
        match k.as_str() {
            "--mode" => o.mode = val(),
            "--endpoint" => o.endpoint = Some(val()),
            "--name" => o.name = Some(val()),
            "--etcd" => o.etcd = Some(val()),
            "--auth-key" => o.auth_key = Some(val()),
            "--wire-security" => o.wire_security = Some(val()),
            "--listen" => o.listen = val(),
            "--transport" => o.transports.extend(list(&val())),
            "--op" => {
                for x in list(&val()) {
                    o.ops.push(match x.as_str() {
                        "read" => Op::Read,
                        "write" => Op::Write,
                        _ => die(&format!("unknown op {x:?} (read, write)")),
                    })
                }
            }
            "--block-size" => o.block_sizes.extend(list(&val()).iter().map(|s| parse_size(s))),
            "--batch-size" => o.batch = val().parse().unwrap_or_else(|_| die("--batch-size N")),
            "--threads" => o.threads = val().parse().unwrap_or_else(|_| die("--threads N")),
            "--readers" => o.readers = val().parse().unwrap_or_else(|_| die("--readers N")),
            "--peers" => o.peers = val().parse().unwrap_or_else(|_| die("--peers N")),
            "--pattern" => {
                o.random = match val().as_str() {
                    "seq" => false,
                    "random" => true,
                    other => die(&format!("unknown pattern {other:?} (seq, random)")),
                }
            }
            "--latency" => o.latency = true,
            "--notify" => o.notify = true,
            "--direct" => o.direct = true,
            "--duration" => o.duration = val().parse().unwrap_or_else(|_| die("--duration SECONDS")),
            "--buffer-size" => o.buffer_size = parse_size(&val()),
            "--json" => o.json = Some(val()),
            "--plot" => o.plot = Some(val()),
            "--no-baseline" => o.baselines = false,
            "--memory" => o.memory = val(),
            "--devices" => {
                let v = val();
                let d: Vec<i32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
                let [a, b] = d[..] else { die(&format!("--devices A,B, not {v:?}")) };
                o.devices = (a, b);
            }
            "--target-kind" => o.target_kind = val(),
            "--connect" => o.connect = Some(val()),
            "--until-stdin-closes" => o.until_stdin_closes = true,
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0)
            }
            other => die(&format!("unknown option {other:?} (see --help)")),
        }
    }
    for t in &o.transports {
        if !["tcp", "shm", "cma", "nvlink", "mnnvl", "auto"].contains(&t.as_str()) {
            die(&format!("unknown transport {t:?} (tcp, shm, cma, nvlink, mnnvl, auto)"));
        }
    }
    if !["device", "host", "mixed", "foreign"].contains(&o.memory.as_str()) {
        die(&format!("unknown memory {:?} (device, host, mixed, foreign)", o.memory));
    }
    if o.ops.is_empty() {
        o.ops = vec![Op::Read, Op::Write];
    }
    if o.block_sizes.is_empty() {
        o.block_sizes = vec![4 << 10, 64 << 10, 1 << 20, 8 << 20];
    }
    if o.batch == 0 || o.threads == 0 || o.readers == 0 || o.duration <= 0.0 {
        die("--batch-size, --threads, --readers and --duration must be positive");
    }
    if o.batch > 1 << 20 {
        die("--batch-size is at most 1048576");
    }
    if o.latency {
        o.batch = 1;
    }
    o
}
