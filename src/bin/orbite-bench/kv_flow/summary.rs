//! kv-flow's summary: the steps' times and throughput, the recovery after
//! the fault, the first failure named, as JSON and as the table printed.

use super::driver::Driver;
use super::*;

pub(super) fn percentile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    crate::percentile(&s, q)
}

/// Median and p90 of a batch kind's times over OK steps, and GB/s at each.
pub(super) fn times(steps: &[&Value], batch: &str) -> Value {
    let secs: Vec<f64> = steps.iter().filter_map(|s| s[batch]["seconds"].as_f64()).collect();
    let bytes = steps.first().and_then(|s| s[batch]["bytes"].as_u64()).unwrap_or(0) as f64;
    let (m, p) = (percentile(&secs, 0.5), percentile(&secs, 0.9));
    let gbps = |t: f64| if t > 0.0 { bytes / t / 1e9 } else { 0.0 };
    json!({"median_ms": m * 1e3, "p90_ms": p * 1e3, "median_gbps": gbps(m), "p90_gbps": gbps(p),
        "samples": secs.len()})
}

pub(super) fn step_times(steps: &[&Value]) -> Value {
    let secs: Vec<f64> = steps.iter().filter_map(|s| Some(s["t_end"].as_f64()? - s["t_start"].as_f64()?)).collect();
    json!({"median_ms": percentile(&secs, 0.5) * 1e3, "p90_ms": percentile(&secs, 0.9) * 1e3})
}

/// What a decode's steps did after `t0` (the kill, or the SIGCONT).
pub(super) fn recovery(steps: &[Value], t0: f64) -> Value {
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

pub(super) fn first_failure(s: &Value) -> Option<(String, String, String)> {
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

pub(super) fn summarise(d: &Driver, end: &Result<Value, String>) -> Value {
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

pub(super) fn ms_gbps(v: &Value) -> String {
    format!(
        "{:.2} ms ({:.2} GB/s) p90 {:.2} ms ({:.2} GB/s)",
        v["median_ms"].as_f64().unwrap_or(0.0),
        v["median_gbps"].as_f64().unwrap_or(0.0),
        v["p90_ms"].as_f64().unwrap_or(0.0),
        v["p90_gbps"].as_f64().unwrap_or(0.0)
    )
}

pub(super) fn print_summary(s: &Value) {
    let o = s;
    println!(
        "kv-flow: {} decodes over {}, {} OK steps each; pool {} of {} blocks of {} (read part {}, {} per write \
         area); READ {} / WRITE {} blocks per step; deadline {} ms; fault {}",
        o["decodes"],
        o["transport"].as_str().unwrap_or(""),
        o["steps"],
        crate::fmt_size(o["pool"].as_u64().unwrap_or(0)),
        o["layout"]["blocks"],
        crate::fmt_size(o["block_size"].as_u64().unwrap_or(0)),
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
