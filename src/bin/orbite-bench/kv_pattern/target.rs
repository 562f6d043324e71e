//! The KV pattern's target (`--role kv-target`): its regions allocated
//! (shared host memory, or device memory for NVLink and MNNVL), each word
//! filled with its offset so that READs are checked, registered and served
//! until stdin closes; and the initiator's side of spawning it.

use super::*;

/// The words of `len` bytes of the target's memory from `at`: each 8-byte
/// word holds its own offset in the whole allocation.
#[cfg(feature = "cuda")]
pub(super) fn offset_words(at: u64, len: u64) -> Vec<u8> {
    (at / 8..(at + len) / 8).flat_map(|w| (w * 8).to_le_bytes()).collect()
}

/// Where a side's blocks live: memory this process touches (shared host
/// memory), or device memory reached through the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mem {
    Host,
    Device,
}

pub(super) fn target(o: &KvOpts) {
    let total = o.region_bytes * o.regions;
    let (cfg, alloc, mem) = match o.target_memory.as_str() {
        "shm" => ("{}".to_string(), allocate_shared_host(total).map_err(|e| e.to_string()), Mem::Host),
        #[cfg(feature = "cuda")]
        kind => match crate::cuda::kv_target(kind, total) {
            Ok((cfg, a)) => (cfg, Ok(a), Mem::Device),
            Err(e) => (String::new(), Err(e), Mem::Device),
        },
        #[cfg(not(feature = "cuda"))]
        other => crate::die(&format!("--target-memory {other:?} needs the cuda feature")),
    };
    let alloc = alloc.unwrap_or_else(|e| crate::die(&e));
    let engine = Engine::from_json(&cfg).unwrap_or_else(|e| crate::die(&e.to_string()));
    match mem {
        Mem::Host => {
            // SAFETY: the allocation is `total` bytes, owned here, 8-byte aligned.
            let words = unsafe { std::slice::from_raw_parts_mut(alloc.addr() as *mut u64, (total / 8) as usize) };
            for (i, w) in words.iter_mut().enumerate() {
                *w = i as u64 * 8;
            }
        }
        Mem::Device => {
            #[cfg(feature = "cuda")]
            crate::cuda::write(alloc.addr(), &offset_words(0, total)).unwrap_or_else(|e| crate::die(&e));
        }
    }
    for r in 0..o.regions {
        engine
            .register_memory(alloc.addr() + r * o.region_bytes, o.region_bytes, Access::READ_WRITE)
            .unwrap_or_else(|e| crate::die(&e.to_string()));
    }
    println!("{}", serde_json::json!({"endpoint": engine.endpoint(), "addr": alloc.addr()}));
    std::io::stdout().flush().ok();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let _ = engine.close(Some(Duration::from_secs(10)));
}

/// The target process; it exits when its stdin closes.
pub(super) struct Target {
    pub(super) child: Child,
    pub(super) endpoint: String,
    pub(super) addr: u64,
}

impl Drop for Target {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

pub(super) fn spawn_target(o: &KvOpts, memory: &str) -> Target {
    let exe = std::env::current_exe().expect("current_exe");
    let region_bytes = blocks_per_region(o) * o.spread * o.block_size;
    let mut child = Command::new(exe)
        .args(["--role", "kv-target", "--regions", &o.regions.to_string(), "--target-memory", memory])
        .args(["--region-bytes", &region_bytes.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| crate::die(&format!("spawn target: {e}")));
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("target line");
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|_| crate::die(&format!("target said {line:?}")));
    Target {
        endpoint: v["endpoint"].as_str().expect("endpoint").to_string(),
        addr: v["addr"].as_u64().expect("addr"),
        child,
    }
}
