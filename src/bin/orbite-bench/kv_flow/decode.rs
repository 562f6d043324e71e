//! kv-flow's decode role (`--mode kv-decode`): its engine connected to the
//! prefill, then steps of scattered READs checked byte for byte, WRITEs into
//! its own area and their read-back, each step reported on stdout.

use super::*;

pub(super) struct Decode<'a> {
    pub(super) o: &'a KvOpts,
    pub(super) engine: &'a Engine,
    pub(super) peer: u64,
    pub(super) pool: u64,
    pub(super) local: u64,
    pub(super) layout: Layout,
    pub(super) opts: SubmitOptions,
}

/// One batch: submitted, waited for, described.
pub(super) struct Outcome {
    pub(super) v: Value,
    pub(super) ok: bool,
    /// Per request: ended OK.
    pub(super) done: Vec<bool>,
}

pub(super) fn skipped(n: usize, bs: u64) -> Outcome {
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

pub(super) fn run_decode(o: &KvOpts) {
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
