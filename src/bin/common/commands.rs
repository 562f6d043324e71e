//! What the helper programs (`orbite-peer`, `orbite-gpu-qual`) share of
//! their stdin protocol: a command is a line, or, with `note MS`, the
//! message of a notification taken within MS milliseconds (a test sends
//! "verify ..." with a WRITE), answered with its sender first.

use orbite::Engine;
use std::time::Duration;

/// The command a stdin `line` stands for and what its answer starts with
/// ("" for a plain line, "SENDER " for a notification's message); `Err`
/// with the answer to give when no notification came.
pub fn command(engine: &Engine, line: String) -> Result<(String, String), String> {
    match line.strip_prefix("note ") {
        None => Ok((line, String::new())),
        Some(ms) => match engine.take_notification(Duration::from_millis(ms.trim().parse().unwrap_or(0))) {
            Ok(n) => Ok((String::from_utf8_lossy(&n.msg).into_owned(), format!("{} ", n.sender))),
            Err(x) => Err(format!("none {}", x.status())),
        },
    }
}
