//! What discovery publishes and reads: the config, an engine's record, the
//! counters, and the checks and errors they share.

use crate::error::Error;
use serde::{Deserialize, Serialize};

/// The `discovery` config object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// etcd client URLs (`http://HOST:PORT`).
    pub etcd: Vec<String>,
    /// Key prefix; the engines live under `PREFIX/engines/`.
    pub prefix: String,
    /// Lease time-to-live in seconds: how long a dead engine's name stays.
    pub ttl_s: u32,
}

impl DiscoveryConfig {
    /// The key of engine `name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}/engines/{name}", self.prefix.trim_end_matches('/'))
    }

    /// The prefix of every engine's key.
    pub fn engines_prefix(&self) -> String {
        format!("{}/engines/", self.prefix.trim_end_matches('/'))
    }
}

/// What an engine publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Its name.
    pub name: String,
    /// Its control endpoint (`IP:port`).
    pub endpoint: String,
    /// Its engine epoch (a restarted engine has a new one).
    pub epoch: u64,
    /// Transport capability bits.
    pub capabilities: u32,
    /// Boot id of its host, hex.
    pub boot_id: String,
    /// Its process id.
    pub pid: u32,
}

impl Record {
    /// Parses a stored record; `None` when it is not one.
    pub fn parse(value: &[u8]) -> Option<Record> {
        serde_json::from_slice(value).ok()
    }
}

/// Counters of the discovery client.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct DiscoveryStats {
    /// Discovery is configured.
    pub enabled: bool,
    /// The client reaches etcd now.
    pub connected: bool,
    /// Keep-alives or watches that failed (etcd unreachable), since start.
    pub failures: u64,
    /// Times the client connected again after a failure.
    pub reconnects: u64,
    /// Times the lease had expired and the name was claimed again.
    pub reregistrations: u64,
    /// Connected peers whose name is watched now.
    pub watched: u64,
    /// Peers marked gone because their key vanished or changed epoch.
    pub peers_gone: u64,
}

/// Called once when a watched peer's key vanishes or names another epoch,
/// with the reason.
pub type OnGone = Box<dyn FnOnce(String) + Send>;

/// An etcd URL as the config accepts it: `http://HOST:PORT`.
pub fn check_url(url: &str) -> std::result::Result<(), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url:?} is not an http:// URL"))?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| format!("{url:?} has no port"))?;
    if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) || rest.contains('/') {
        return Err(format!("{url:?} is not http://HOST:PORT"));
    }
    Ok(())
}

/// An error for the etcd addresses in `cfg`.
pub fn unreachable(cfg: &DiscoveryConfig, why: &str) -> Error {
    Error::Unavailable(format!("etcd at {} is unreachable: {why}", cfg.etcd.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keys_and_records() {
        assert!(check_url("http://127.0.0.1:2379").is_ok());
        assert!(check_url("http://etcd-0.cluster:2379").is_ok());
        for bad in ["127.0.0.1:2379", "https://h:1", "http://h", "http://h:0", "http://:1", "http://h:1/x"] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        let c = DiscoveryConfig { etcd: vec![], prefix: "/orbite/".into(), ttl_s: 10 };
        assert_eq!(c.key("a"), "/orbite/engines/a");
        assert_eq!(c.engines_prefix(), "/orbite/engines/");
        let r = Record {
            name: "a".into(),
            endpoint: "1.2.3.4:5".into(),
            epoch: 7,
            capabilities: 3,
            boot_id: "ab".into(),
            pid: 9,
        };
        assert_eq!(Record::parse(serde_json::to_string(&r).unwrap().as_bytes()), Some(r));
        assert_eq!(Record::parse(b"{"), None);
    }
}
