//! The multi-process KV pool flow serving teams run, end to end
//! (`orbite-bench --mode kv-flow`): one prefill process owning a 1 GiB pool
//! (`allocate_shared_host`, 4096 blocks of 256 KiB, READ|WRITE) and two
//! decode processes, each per step READing 256 scattered distinct blocks in
//! one batch (64 MiB), WRITEing 32 blocks (8 MiB) into its own area of the
//! pool and READing them back, every byte verified, each batch with a 5 s
//! deadline. What is asserted is the outcome the docs promise
//! (docs/getting-started.md section 8, docs/operations.md): every step OK,
//! no byte wrong, a forced transport carries every request, the prefill
//! retains no export at the end and closes OK; after a decode is killed or
//! the prefill frozen and resumed, the first step started afterwards
//! succeeds and none after it fails.
//!
//! The pool stays 1 GiB: the mapping budget (`max_inflight_bytes`, 1 GiB by
//! default) is charged the whole allocation per export, which is what these
//! runs exercise. Runs go one at a time (each holds a 1 GiB pool and three
//! processes on a 2-core machine); the bench synchronises its processes by
//! their output lines, never by sleeping. Timing is bounded generously
//! (recovery < 10 s); the bench reports the real figures (run with
//! `--nocapture` to see its summary).

use serde_json::Value;
use std::process::Command;
use std::sync::Mutex;

/// One flow at a time: each holds a 1 GiB pool and three processes.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const STEPS: u64 = 8;
const READS: u64 = 256;
const WRITES: u64 = 32;
/// The KV-cache recipe of docs/getting-started.md for this 1 GiB pool: both
/// sides' `max_inflight_bytes` above the pool's size (what
/// `examples_cpp/kv_pool.hpp` `recipe_config` computes for it), and the
/// decode keeps its mapping of the pool (`shm_cache_entries`).
const RECIPE_DECODE: &str = r#"{"max_inflight_bytes": 2147483648, "shm_cache_entries": 4}"#;
const RECIPE_PREFILL: &str = r#"{"max_inflight_bytes": 2147483648}"#;
/// Recovery bound (the bench reports the real figure).
const RECOVERY_S: f64 = 10.0;

/// Runs the flow with `args` beside the common ones; returns its JSON
/// summary and whether the bench itself judged the run OK (exit status 0).
fn flow(tag: &str, args: &[&str]) -> (Value, bool) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = std::env::temp_dir().join(format!("orbite-kv-pool-{tag}-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let t0 = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_orbite-bench"))
        .args(["--mode", "kv-flow", "--steps", &STEPS.to_string()])
        .args(["--read-blocks", &READS.to_string(), "--write-blocks", &WRITES.to_string()])
        .args(["--pool", "1GiB", "--block-size", "256KiB", "--deadline-ms", "5000"])
        // A variant that never recovers stops after this long without an
        // OK step (raised by the bench above a freeze and two deadlines).
        .args(["--give-up-seconds", "12"])
        .args(["--json", path.to_str().expect("utf-8 temp path")])
        .args(args)
        .output()
        .expect("run orbite-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("---- kv-flow {tag} ({:.1} s, {}):\n{stdout}{stderr}", t0.elapsed().as_secs_f64(), out.status);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{tag}: no JSON summary ({e}); exit {}\n{stdout}\n{stderr}", out.status));
    let _ = std::fs::remove_file(&path);
    (serde_json::from_str(&text).expect("the summary is JSON"), out.status.success())
}

fn decodes(v: &Value) -> &Vec<Value> {
    v["decode"].as_array().expect("decode array")
}

/// The first failures of decode `d`, for the message.
fn failures(d: &Value) -> String {
    let f: Vec<String> = d["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .take(3)
        .map(|f| format!("step {} {} {}: {}", f["step"], f["batch"], f["status"], f["message"]))
        .collect();
    format!("{} (by kind: {})", f.join("; "), d["failure_kinds"])
}

/// What a surviving decode must show at the end: every byte right, its
/// steps done, its close OK with no import retained.
fn decode_end(d: &Value, p: &mut Vec<String>) {
    let i = &d["index"];
    if d["mismatched_bytes"] != 0 {
        p.push(format!("decode {i}: {} bytes read wrong", d["mismatched_bytes"]));
    }
    // The driver stops a decode once it has its steps (with a fault, two
    // more that started after the fault was over): at least STEPS.
    if d["steps_ok"].as_u64().unwrap_or(0) < STEPS || !d["gave_up"].is_null() {
        p.push(format!("decode {i}: {} OK steps, fewer than {STEPS} (gave up: {})", d["steps_ok"], d["gave_up"]));
    }
    if d["close"]["status"] != "OK" {
        p.push(format!("decode {i} close: {} {}", d["close"]["status"], d["close"]["message"]));
    }
    if d["close"]["ipc_shm"]["imports_retained"] != 0 {
        p.push(format!("decode {i}: {} imports retained after its close", d["close"]["ipc_shm"]["imports_retained"]));
    }
}

/// What the prefill must show at the end: no export retained once the
/// decodes closed (or died), the read part of the pool untouched, an OK close.
fn prefill_end(v: &Value, p: &mut Vec<String>) {
    let pre = &v["prefill"];
    if pre["ipc_shm"]["exports_retained"] != 0 {
        p.push(format!(
            "prefill: exports_retained {} (ipc.shm {})",
            pre["ipc_shm"]["exports_retained"], pre["ipc_shm"]
        ));
    }
    if pre["close"]["status"] != "OK" {
        p.push(format!("prefill close: {} {}", pre["close"]["status"], pre["close"]["message"]));
    }
    if pre["verify"]["wrong_blocks"] != 0 {
        p.push(format!("prefill: {} blocks of the pool's read part changed", pre["verify"]["wrong_blocks"]));
    }
}

fn assert_none(tag: &str, v: &Value, bench_ok: bool, mut p: Vec<String>) {
    if p.is_empty() && !bench_ok {
        p.push(format!("the bench judged the run failed: {}", v["problems"]));
    }
    assert!(p.is_empty(), "kv-flow {tag}:\n  - {}", p.join("\n  - "));
}

/// No fault: every step of both decodes OK, every byte right, a forced
/// transport carried every request, clean ends.
fn steady(tag: &str, transport: &str, configs: Option<(&str, &str)>) {
    let mut args = vec!["--decodes", "2", "--transport", transport];
    if let Some((prefill, decode)) = configs {
        args.extend(["--prefill-config", prefill, "--decode-config", decode]);
    }
    let (v, bench_ok) = flow(tag, &args);
    let mut p = Vec::new();
    assert_eq!(decodes(&v).len(), 2);
    for d in decodes(&v) {
        let i = &d["index"];
        if d["steps_failed"] != 0 {
            p.push(format!("decode {i}: {} failed steps: {}", d["steps_failed"], failures(d)));
        }
        if transport != "auto" {
            // Every request that was routed ran over the forced transport;
            // with every step OK, that is every request of the run.
            let by = &d["requests_by_transport"];
            let want = d["steps_ok"].as_u64().unwrap_or(0) * (READS + 2 * WRITES);
            let all = d["steps_failed"] != 0 || by[transport] == want;
            if by.as_object().map(|m| m.len()) != Some(1) || by[transport].is_null() || !all {
                p.push(format!("decode {i}: requests by transport {by}, not {{\"{transport}\": {want}}}"));
            }
        }
        decode_end(d, &mut p);
    }
    prefill_end(&v, &mut p);
    assert_none(tag, &v, bench_ok, p);
}

#[test]
fn two_decodes_over_shm_with_default_configs() {
    steady("shm-defaults", "shm", None);
}

#[test]
fn two_decodes_over_tcp_with_default_configs() {
    steady("tcp-defaults", "tcp", None);
}

#[test]
fn two_decodes_over_auto_with_default_configs() {
    steady("auto-defaults", "auto", None);
}

#[test]
fn two_decodes_over_shm_with_the_recipe() {
    steady("shm-recipe", "shm", Some((RECIPE_PREFILL, RECIPE_DECODE)));
}

#[test]
fn two_decodes_over_tcp_with_the_recipe() {
    steady("tcp-recipe", "tcp", Some((RECIPE_PREFILL, RECIPE_DECODE)));
}

#[test]
fn two_decodes_over_auto_with_the_recipe() {
    steady("auto-recipe", "auto", Some((RECIPE_PREFILL, RECIPE_DECODE)));
}

/// After the fault (`t0`: the kill, or the SIGCONT), decode `d`'s first
/// step started afterwards succeeded, within the bound, and none after it
/// failed.
fn recovered(d: &Value, p: &mut Vec<String>) {
    let i = &d["index"];
    let r = &d["recovery"];
    if r["steps_after"].as_u64().unwrap_or(0) == 0 {
        p.push(format!("decode {i}: no step started after the fault ({r})"));
        return;
    }
    if r["first_step_after_ok"] != true {
        p.push(format!(
            "decode {i}: the first step started after the fault (step {}) failed; {} failed before an OK one: {}",
            r["first_step_after"],
            r["failed_before_recovery"],
            failures(d)
        ));
    }
    match r["failed_after_recovery"].as_u64() {
        Some(0) => {}
        Some(n) => {
            p.push(format!("decode {i}: {n} steps failed after its first OK step past the fault: {}", failures(d)))
        }
        None => p.push(format!("decode {i}: no OK step after the fault: {}", failures(d))),
    }
    if let Some(s) = r["recovery_seconds"].as_f64() {
        if s >= RECOVERY_S {
            p.push(format!("decode {i}: recovered {s:.2} s after the fault (bound {RECOVERY_S} s)"));
        }
    }
}

#[test]
fn a_killed_decode_leaves_the_survivor_and_the_prefill_whole() {
    let (v, bench_ok) = flow("kill-decode", &["--decodes", "2", "--transport", "shm", "--fault", "kill-decode"]);
    let mut p = Vec::new();
    if v["fault_event"]["at_step"] != STEPS / 2 || v["fault_event"]["t_kill"].is_null() {
        p.push(format!("the kill did not happen at decode 0's step {}: {}", STEPS / 2, v["fault_event"]));
    }
    for d in decodes(&v) {
        if d["index"] == 0 {
            if d["killed"] != true {
                p.push("decode 0 was not killed".into());
            }
            // Its bytes, while it lived, were right all the same.
            if d["mismatched_bytes"] != 0 {
                p.push(format!("decode 0: {} bytes read wrong before its death", d["mismatched_bytes"]));
            }
            continue;
        }
        recovered(d, &mut p);
        decode_end(d, &mut p);
    }
    // The dead importer's export is reclaimed: nothing retained, close OK.
    prefill_end(&v, &mut p);
    assert_none("kill-decode", &v, bench_ok, p);
}

/// The prefill frozen for 5 s mid-flow: the decodes' steps that started
/// after SIGCONT succeed (over TCP the connection stays up: the answers to
/// requests failed at their deadline are dropped), nothing stays retained.
fn freeze(tag: &str, transport: &str, decode_config: Option<&str>) {
    let mut args =
        vec!["--decodes", "2", "--transport", transport, "--fault", "freeze-prefill", "--freeze-seconds", "5"];
    if let Some(c) = decode_config {
        args.extend(["--decode-config", c]);
    }
    let (v, bench_ok) = flow(tag, &args);
    let mut p = Vec::new();
    let (stop, cont) = (&v["fault_event"]["t_stop"], &v["fault_event"]["t_cont"]);
    match (stop.as_f64(), cont.as_f64()) {
        (Some(a), Some(b)) if b - a >= 5.0 => {}
        _ => p.push(format!("the prefill was not frozen for 5 s: {}", v["fault_event"])),
    }
    for d in decodes(&v) {
        recovered(d, &mut p);
        decode_end(d, &mut p);
    }
    prefill_end(&v, &mut p);
    assert_none(tag, &v, bench_ok, p);
}

#[test]
fn a_frozen_prefill_is_used_again_once_it_runs() {
    freeze("freeze-prefill", "shm", None);
}

/// Without the relocation cache every step needs the frozen source's
/// grants: a group in flight at SIGSTOP completes once it runs.
#[test]
fn a_frozen_prefill_is_used_again_without_a_cache() {
    freeze("freeze-prefill-uncached", "shm", Some(r#"{"shm_cache_entries": 0}"#));
}

#[test]
fn a_frozen_prefill_is_used_again_over_tcp() {
    freeze("freeze-prefill-tcp", "tcp", None);
}

#[test]
fn a_frozen_prefill_is_used_again_over_auto() {
    freeze("freeze-prefill-auto", "auto", None);
}
