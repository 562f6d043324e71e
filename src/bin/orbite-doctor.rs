//! orbite-doctor: which layer a CUDA transport stands on is broken on this
//! machine, and what to do. One line per layer (`ok`, `FAIL` with the
//! broken layer's name and the remedy, `info`); with `--transport`, the exit
//! status is 1 when that transport cannot work here. See docs/operations.md,
//! "MNNVL does not work".
//!
//! ```text
//! orbite-doctor [--transport nvlink|mnnvl] [--handle-type fabric|posix_fd]
//!               [--device N] [--peer IP:PORT] [--imex-channels DIR]
//!               [--config ENGINE_JSON] [--timeout-ms N] [--json]
//! ```

use orbite::{diagnose, DiagnoseOptions};

const USAGE: &str = "usage: orbite-doctor [--transport nvlink|mnnvl] [--handle-type fabric|posix_fd] [--device N] \
                     [--peer IP:PORT] [--imex-channels DIR] [--config ENGINE_JSON] [--timeout-ms N] [--json]";

/// The options as the library's JSON, and whether to print JSON.
fn options(args: &[String]) -> Result<(String, bool), String> {
    let mut o = serde_json::Map::new();
    let mut json = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{a} needs a value\n{USAGE}"));
        match a.as_str() {
            "--transport" => o.insert("transport".into(), value()?.into()),
            "--handle-type" => o.insert("handle_type".into(), value()?.into()),
            "--device" => {
                let v = value()?;
                o.insert("device".into(), v.parse::<i64>().map_err(|_| format!("--device {v}: not a number"))?.into())
            }
            "--peer" => o.insert("peer".into(), value()?.into()),
            "--imex-channels" => o.insert("imex_channel_dir".into(), value()?.into()),
            "--config" => {
                let v = value()?;
                let c: serde_json::Value =
                    serde_json::from_str(&v).map_err(|e| format!("--config is not JSON: {e}"))?;
                o.insert("engine_config".into(), c)
            }
            "--timeout-ms" => {
                let v = value()?;
                o.insert(
                    "timeout_ms".into(),
                    v.parse::<u64>().map_err(|_| format!("--timeout-ms {v}: not a number"))?.into(),
                )
            }
            "--json" => {
                json = true;
                None
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        };
    }
    Ok((serde_json::Value::Object(o).to_string(), json))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (text, json) = options(&args).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let o = DiagnoseOptions::from_json(&text).unwrap_or_else(|e| {
        eprintln!("orbite-doctor: {}", e.message());
        std::process::exit(2)
    });
    let d = diagnose(&o);
    if json {
        println!("{}", d.to_json());
    } else {
        for l in d.lines() {
            println!("{l}");
        }
    }
    std::process::exit(if d.usable == Some(false) { 1 } else { 0 })
}
