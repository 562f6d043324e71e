//! The source role: device (or adopted, MNNVL, EGM) memory allocated,
//! filled with a pattern and registered, then stdin's commands obeyed
//! (`verify`, `produce` behind a gate, `open`, `close_source`, `stats`).

use super::*;

pub(super) fn source(args: &[String]) {
    let allocs: usize = num(args, "--allocs", 1);
    let size: u64 = num(args, "--size", 8 << 20);
    let seed: u64 = num(args, "--seed", 1);
    let device: i32 = num(args, "--device", 0);
    let numa: i32 = num(args, "--numa", 0);
    let cfg = arg(args, "--config").unwrap_or_else(|| r#"{"nvlink": true}"#.into());
    let kind = arg(args, "--kind").unwrap_or_else(|| "ipc".into());
    let e = Engine::from_json(&cfg).unwrap_or_else(|e| die(&e.to_string()));
    if kind == "mnnvl"
        && cfg.contains("\"fabric\"")
        && !orbite::cuda::fabric::fabric_export_works(device).unwrap_or(false)
    {
        die("fabric handles are not supported here: a real fabric export fails (no IMEX channel?)");
    }
    // `adopted`: one cudaMalloc-style allocation of the caller's holds every
    // buffer (1 MiB in, one after the other), each adopted as a sub-range.
    let foreign = (kind == "adopted").then(|| {
        let total = (allocs as u64 * size).div_ceil(1 << 20) * (1 << 20) + (2 << 20);
        raw::alloc_device(device, total, false).unwrap_or_else(|e| die(&e.to_string()))
    });
    let mut regions = Vec::new();
    let bufs: Vec<Allocation> = (0..allocs)
        .map(|n| {
            let a = match (kind.as_str(), foreign) {
                ("mnnvl", _) => allocate_mnnvl(device, size),
                ("egm", _) => allocate_egm(numa, size),
                (_, Some(base)) => {
                    cuda_adopt(base + (1 << 20) + n as u64 * size, size, orbite::ADOPT_SHARE_WHOLE_ALLOCATION)
                }
                _ => CudaMemory::allocate_ipc(device, size),
            }
            .unwrap_or_else(|e| die(&e.to_string()));
            host_to_device(a.addr(), &pattern_vec(seed + n as u64, a.len())).unwrap_or_else(|e| die(&e.to_string()));
            regions.push(e.register_memory(a.addr(), size, Access::READ_WRITE).unwrap_or_else(|e| die(&e.to_string())));
            a
        })
        .collect();
    // `produce`: producers held at their gates until `open`.
    let mut producers: Vec<Producer> = Vec::new();
    say(&serde_json::json!({"endpoint": e.endpoint(), "addrs": bufs.iter().map(|b| b.addr()).collect::<Vec<_>>(),
        "len": size, "pid": std::process::id()})
    .to_string());
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (line, from) = match commands::command(&e, line) {
            Ok(c) => c,
            Err(answer) => {
                say(&answer);
                continue;
            }
        };
        let w: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| -> u64 { w.get(i).and_then(|x| x.parse().ok()).unwrap_or(0) };
        let out = match w.first().copied().unwrap_or("") {
            "verify" => match bufs.get(n(1) as usize) {
                None => "bad allocation index".to_string(),
                Some(b) => {
                    let mut host = vec![0u8; n(4) as usize];
                    match device_to_host(&mut host, b.addr() + n(3)) {
                        Ok(()) => match (0..host.len()).find(|&i| host[i] != pattern(n(2), i as u64)) {
                            None => "ok".to_string(),
                            Some(at) => format!("bad {at}"),
                        },
                        Err(e) => format!("err {e}"),
                    }
                }
            },
            "produce" => match (bufs.get(n(1) as usize), regions.get(n(1) as usize)) {
                (Some(b), Some(&region)) => match Producer::start(&e, b, region, n(2), device) {
                    Ok(p) => {
                        producers.push(p);
                        "ok".to_string()
                    }
                    Err(x) => format!("err {x}"),
                },
                _ => "bad allocation index".to_string(),
            },
            "open" => {
                let opened: Result<Vec<()>, String> = producers.iter().map(Producer::open).collect();
                match opened {
                    Ok(v) => format!("opened {}", v.len()),
                    Err(x) => format!("err {x}"),
                }
            }
            "close_source" => match e.close_source(Some(Duration::from_millis(n(1)))) {
                Ok(()) => "ok".into(),
                Err(x) => format!("err {} {}", x.status(), x.message()),
            },
            "stats" => e.stats().to_json(),
            "close" => {
                let r = e.close(Some(Duration::from_secs(30)));
                say(if r.is_ok() { "closed" } else { "close failed" });
                std::process::exit(if r.is_ok() { 0 } else { 1 })
            }
            "exit" => std::process::exit(0),
            _ => format!("unknown {line:?}"),
        };
        say(&format!("{from}{out}"));
    }
}

/// A producer the source's stack would run: a stream of the allocation's
/// GPU held at a gate (a device word that must reach 1:
/// `cuStreamWaitValue32_v2`), then writing pattern `seed` over the whole
/// allocation from pinned host memory; handed to the engine with
/// `record_producer_stream`, so a peer's transfer of the region must start
/// after it. `open` lets it run.
pub(super) struct Producer {
    pub(super) gate: Allocation,
    pub(super) _fresh: Allocation,
}

impl Producer {
    fn start(e: &Engine, buf: &Allocation, region: u64, seed: u64, device: i32) -> Result<Producer, String> {
        let s = |x: orbite::Error| x.to_string();
        let gate = CudaMemory::allocate(device, 4096).map_err(s)?;
        host_to_device(gate.addr(), &[0u8; 4]).map_err(s)?;
        let fresh = allocate_pinned_host(buf.len()).map_err(s)?;
        // SAFETY: pinned host memory of buf.len() bytes, CPU-accessible and
        // ours alone until the stream below reads it.
        let host = unsafe { std::slice::from_raw_parts_mut(fresh.addr() as *mut u8, buf.len() as usize) };
        host.copy_from_slice(&pattern_vec(seed, buf.len()));
        let g = ContextGuard::bind(primary_context(device).map_err(s)?).map_err(s)?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: a context is current; creates one non-blocking stream
        // (flag 1), which the process keeps to its end.
        check(unsafe { sys::cuStreamCreate(&mut stream, 1) }, "cuStreamCreate").map_err(s)?;
        // SAFETY: `gate` is 4 aligned bytes of device memory of this GPU,
        // kept (in the Producer) until the process ends.
        check(unsafe { sys::cuStreamWaitValue32_v2(stream, gate.addr(), 1, 0) }, "cuStreamWaitValue32").map_err(s)?;
        // SAFETY: buf holds buf.len() bytes of device memory; the pinned
        // source outlives the copy (the Producer keeps it).
        check(unsafe { sys::cuMemcpyAsync(buf.addr(), fresh.addr(), buf.len() as usize, stream) }, "cuMemcpyAsync")
            .map_err(s)?;
        g.restore().map_err(s)?;
        e.record_producer_stream(region, stream as u64).map_err(s)?;
        Ok(Producer { gate, _fresh: fresh })
    }

    fn open(&self) -> Result<(), String> {
        host_to_device(self.gate.addr(), &1u32.to_le_bytes()).map_err(|x| x.to_string())
    }
}
