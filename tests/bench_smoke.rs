//! orbite-bench runs end to end (tiny sizes, short points) and writes the
//! promised JSON keys and an SVG plot. No timing is asserted here.

use std::process::Command;

#[test]
fn bench_runs_and_writes_json_and_plot() {
    let dir = std::env::temp_dir().join(format!("orbite-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("points.json");
    let svg = dir.join("plot.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_orbite-bench"))
        .args(["--duration", "0.2", "--buffer-size", "4MiB", "--block-size", "4KiB,64KiB", "--batch-size", "4"])
        .args(["--transport", "tcp,shm", "--json", json.to_str().unwrap(), "--plot", svg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("tcp") && table.contains("shm") && table.contains("memcpy") && table.contains("tcp_socket"),
        "{table}"
    );
    let text = std::fs::read_to_string(&json).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * 2 * 2, "transports x ops x block sizes");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        for k in [
            "transport",
            "op",
            "block_size",
            "batch_size",
            "threads",
            "bytes",
            "seconds",
            "gbps",
            "ops_per_sec",
            "p50_us",
            "p99_us",
            "baseline",
            "baseline_gbps",
            "ratio_to_baseline",
        ] {
            assert!(v.get(k).is_some(), "missing {k} in {l}");
        }
        assert!(v["bytes"].as_u64().unwrap() > 0, "{l}");
        assert_eq!(v["requests_failed"], 0, "{l}");
        assert_eq!(v["memory"], "shared_host", "{l}");
        // GB/s come from the measured span (first measured submission to
        // last completion), not from the nominal --duration.
        let (bytes, secs, gbps) =
            (v["bytes"].as_f64().unwrap(), v["seconds"].as_f64().unwrap(), v["gbps"].as_f64().unwrap());
        assert!(secs > 0.0 && secs != 0.2, "{l}");
        assert!((gbps - bytes / secs / 1e9).abs() <= 1e-9 * gbps.max(1.0), "{l}");
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("stroke-dasharray") && plot.contains("block size"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs orbite-bench with `args` (split at spaces) and `--json`; asserts
/// it succeeded and returns its table and the points it wrote.
fn bench_points(tag: &str, args: &str) -> (String, Vec<serde_json::Value>) {
    let dir = std::env::temp_dir().join(format!("orbite-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("points.json");
    let out = Command::new(env!("CARGO_BIN_EXE_orbite-bench"))
        .args(args.split_whitespace())
        .args(["--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let points = std::fs::read_to_string(&json).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    (String::from_utf8_lossy(&out.stdout).into_owned(), points)
}

/// `--readers 3`: a READ point of three reader processes at once beside the
/// single-reader one, each reader with its own engine; none of their
/// requests failed (the shared loan lets them all in).
#[test]
fn bench_measures_several_reader_processes_at_once() {
    let (_, points) = bench_points(
        "readers",
        "--duration 0.3 --buffer-size 4MiB --block-size 64KiB --batch-size 4 \
         --transport shm --op read --readers 3 --no-baseline",
    );
    let readers: Vec<u64> = points.iter().map(|p| p["readers"].as_u64().unwrap()).collect();
    assert_eq!(readers, vec![1, 3], "{points:?}");
    for p in &points {
        assert_eq!(p["requests_failed"], 0, "{p}");
        assert!(p["bytes"].as_u64().unwrap() > 0, "{p}");
    }
}

#[test]
fn bench_rejects_bad_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_orbite-bench")).args(["--block-size", "12XB"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad size"));
    let out =
        Command::new(env!("CARGO_BIN_EXE_orbite-bench")).args(["--transport", "carrier-pigeon"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Without the cuda feature NVLink and MNNVL cannot be measured, and the
/// tool says why instead of measuring something else.
#[cfg(not(feature = "cuda"))]
#[test]
fn nvlink_and_mnnvl_need_the_cuda_feature() {
    let out = Command::new(env!("CARGO_BIN_EXE_orbite-bench"))
        .args(["--transport", "nvlink,mnnvl", "--duration", "0.1", "--buffer-size", "1MiB"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("skipping nvlink: NVLink and MNNVL need orbite-bench built with the cuda feature"), "{err}");
    assert!(err.contains("skipping mnnvl"), "{err}");
    assert!(err.contains("no requested transport could be measured"), "{err}");
}

/// `--notify` adds a `write+n` point per WRITE point and one `notify`
/// point per transport; `--peers 3` spreads the batches over three target
/// processes. Every request and notification succeeds.
#[test]
fn bench_measures_notifications_and_many_peers() {
    let (table, points) = bench_points(
        "notify",
        "--duration 0.2 --buffer-size 4MiB --block-size 4KiB --batch-size 4 \
         --transport tcp,shm --op write --notify --peers 3 --no-baseline",
    );
    let ops: Vec<(String, String, u64)> = points
        .iter()
        .map(|p| {
            (p["transport"].as_str().unwrap().into(), p["op"].as_str().unwrap().into(), p["peers"].as_u64().unwrap())
        })
        .collect();
    let want = |t: &str, op: &str, peers: u64| (t.to_string(), op.to_string(), peers);
    assert_eq!(
        ops,
        vec![
            want("tcp", "write", 3),
            want("tcp", "write+n", 3),
            want("shm", "write", 3),
            want("shm", "write+n", 3),
            want("tcp", "notify", 1),
            want("shm", "notify", 1),
        ]
    );
    for p in &points {
        assert_eq!(p["requests_failed"], 0, "{p}");
        assert!(p["ops_per_sec"].as_f64().unwrap() > 0.0, "{p}");
    }
    assert!(table.contains("(3 peers)") && table.contains("without_notify"), "{table}");
}

/// `--pattern kv`: one descriptor-heavy submission over several regions,
/// READ and WRITE, with coalescing on and off: every READ block checked,
/// one copy per run with coalescing (runs stay inside a region on both
/// sides), one per request without.
#[test]
fn bench_measures_the_kv_pattern_with_and_without_coalescing() {
    let (table, points) =
        bench_points("kv", "--pattern kv --transport shm --requests 3000 --regions 5 --block-size 4KiB --repeat 1");
    assert_eq!(points.len(), 4, "{table}");
    for p in &points {
        assert_eq!((p["requests_failed"].as_u64(), p["wrong_bytes"].as_u64()), (Some(0), Some(0)), "{p}");
        assert_eq!(p["requests"], 3000, "{p}");
        let runs = p["runs"].as_u64().unwrap();
        assert!(runs > 3000 / 32 && runs < 3000, "{p}");
        let want = if p["coalesce"] == true { runs } else { 3000 };
        assert_eq!(p["copies_issued"].as_u64(), Some(want), "{p}");
    }
}

/// Guards the rows after a cma point (`--memory foreign`): `cma_raw`, the
/// kernel's calls on one thread, then on more than one core `cma_raw_par`,
/// the same calls over as many threads as the copy pool copies with (one
/// per core, at most 8), each for the point's op and block, having moved
/// bytes.
#[test]
fn bench_follows_a_cma_point_with_the_kernels_calls_on_one_thread_and_the_pools() {
    let (_, points) = bench_points(
        "cma-raw",
        "--memory foreign --transport cma --op write --block-size 4KiB --batch-size 4 --duration 0.2 --buffer-size 1MiB",
    );
    let copiers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8) as u64;
    let rows: Vec<(&str, u64)> =
        points.iter().map(|p| (p["transport"].as_str().unwrap(), p["threads"].as_u64().unwrap())).collect();
    let mut want = vec![("cma", 1), ("cma_raw", 1)];
    if copiers > 1 {
        want.push(("cma_raw_par", copiers));
    }
    assert_eq!(rows, want);
    for p in &points {
        assert_eq!(
            (p["op"].as_str(), p["block_size"].as_u64(), p["memory"].as_str()),
            (Some("write"), Some(4096), Some("foreign"))
        );
        assert!(p["gbps"].as_f64().unwrap() > 0.0, "{p}");
        assert_eq!(p["requests_failed"], 0, "{p}");
    }
}
