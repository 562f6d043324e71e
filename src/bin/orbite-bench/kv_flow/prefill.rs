//! kv-flow's prefill role (`--mode kv-prefill`): owns the pool, fills each
//! block with its pattern, serves it and reports on stdout until told to
//! stop.

use super::*;

pub(super) fn run_prefill(o: &KvOpts) {
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
