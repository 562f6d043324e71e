//! `orbite-peer`: a stand-alone source process. It registers a buffer filled
//! with a deterministic pattern, prints one JSON line describing itself, then
//! obeys commands on stdin, one per line. The multi-process tests drive it;
//! it is also handy to poke at an engine by hand.
//!
//! ```text
//! orbite-peer [--size BYTES] [--access rw|r|w|none] [--seed N] [--config JSON] [--extra BYTES]
//! -> {"endpoint":"127.0.0.1:PORT","addr":A,"len":N,"pid":P,"extra_addr":X,"extra_len":M}
//! commands:
//!   verify SEED OFF LEN   the range [OFF, OFF+LEN) holds pattern SEED -> "ok" | "bad AT"
//!   fill SEED             refill the buffer with pattern SEED -> "ok"
//!   reregister            unregister and register again (new epoch) -> "ok"
//!   stats                 -> the engine's stats JSON
//!   close                 close the engine (10 s) -> "closed" and exit 0
//!   exit                  exit at once (no close)
//! ```

use orbite::{Access, Engine, EngineConfig};
use std::io::{BufRead, Write};

/// The byte at offset `i` of pattern `seed`.
fn pattern(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(131)
        .wrapping_add(seed.wrapping_mul(7))
        .wrapping_add(i >> 12)) as u8
}

fn fill(buf: &mut [u8], seed: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(seed, i as u64);
    }
}

fn parse_access(s: &str) -> Access {
    match s {
        "rw" => Access::READ_WRITE,
        "r" => Access::READ,
        "w" => Access::WRITE,
        "none" => Access::NONE,
        other => {
            eprintln!("unknown access {other:?} (rw, r, w or none)");
            std::process::exit(2)
        }
    }
}

fn main() {
    let mut size: usize = 16 << 20;
    let mut extra: usize = 0;
    let mut access = Access::READ_WRITE;
    let mut seed: u64 = 1;
    let mut config = String::new();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next().cloned().unwrap_or_else(|| {
                eprintln!("{a} needs a value");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--size" => size = val().parse().expect("--size BYTES"),
            "--extra" => extra = val().parse().expect("--extra BYTES"),
            "--access" => access = parse_access(&val()),
            "--seed" => seed = val().parse().expect("--seed N"),
            "--config" => config = val(),
            "-h" | "--help" => {
                println!("usage: orbite-peer [--size BYTES] [--access rw|r|w|none] [--seed N] [--config JSON] [--extra BYTES]");
                return;
            }
            other => {
                eprintln!("unknown argument {other:?}");
                std::process::exit(2)
            }
        }
    }
    let engine = match EngineConfig::from_json(&config).and_then(Engine::new) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("orbite-peer: {e}");
            std::process::exit(1)
        }
    };
    let mut buf = vec![0u8; size.max(1)];
    fill(&mut buf, seed);
    let addr = buf.as_mut_ptr() as u64;
    let mut region = engine
        .register_memory(addr, size as u64, access)
        .expect("register buffer");
    // An optional second region with the opposite access, for permission tests.
    let mut extra_buf = vec![0u8; extra.max(1)];
    if extra > 0 {
        let other = if access.can_read() {
            Access::WRITE
        } else {
            Access::READ
        };
        engine
            .register_memory(extra_buf.as_mut_ptr() as u64, extra as u64, other)
            .expect("register extra buffer");
    }
    println!(
        "{}",
        serde_json::json!({
            "endpoint": engine.endpoint(), "addr": addr, "len": size, "pid": std::process::id(),
            "extra_addr": extra_buf.as_ptr() as u64, "extra_len": extra,
        })
    );
    std::io::stdout().flush().ok();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["verify", s, off, len] => {
                let (s, off, len): (u64, usize, usize) = (
                    s.parse().unwrap_or(0),
                    off.parse().unwrap_or(0),
                    len.parse().unwrap_or(0),
                );
                match (off..off + len)
                    .find(|&i| i >= buf.len() || buf[i] != pattern(s, (i - off) as u64))
                {
                    None => "ok".to_string(),
                    Some(at) => format!("bad {at}"),
                }
            }
            ["fill", s] => {
                fill(&mut buf, s.parse().unwrap_or(0));
                "ok".into()
            }
            ["reregister"] => {
                engine.unregister_memory(region, None).expect("unregister");
                region = engine
                    .register_memory(addr, size as u64, access)
                    .expect("register again");
                "ok".into()
            }
            ["stats"] => engine.stats().to_json(),
            ["close"] => {
                let r = engine.close(Some(std::time::Duration::from_secs(10)));
                println!(
                    "{}",
                    if r.is_ok() {
                        "closed".to_string()
                    } else {
                        format!("close failed: {r:?}")
                    }
                );
                std::io::stdout().flush().ok();
                std::process::exit(if r.is_ok() { 0 } else { 1 });
            }
            ["exit"] => std::process::exit(0),
            _ => format!("unknown command {line:?}"),
        };
        println!("{reply}");
        std::io::stdout().flush().ok();
    }
    drop(extra_buf);
}
