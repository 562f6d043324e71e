//! What discovery publishes and reads: the config, an engine's record, the
//! counters, and the checks and errors they share.

use crate::control::auth::AuthKey;
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
    /// The inode of its PID namespace (`/proc/self/ns/pid`): its pid means
    /// something only to processes of that namespace. 0: not known.
    #[serde(default)]
    pub pid_ns: u64,
    /// With an auth key: HMAC-SHA256 by the key over the other fields, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sig: Option<String>,
}

/// The label of a record's signature. (v2: the signature covers the key
/// the record is stored under.)
const SIG_LABEL: &[u8] = b"orbite-discovery-v2 record";

impl Record {
    /// The bytes a signature covers: the etcd key `at` the record is
    /// stored under, then the record without its signature. A record
    /// copied under another name (or prefix) fails its signature.
    fn signed_bytes(&self, at: &str) -> Vec<u8> {
        let mut b = (at.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(at.as_bytes());
        b.extend(serde_json::to_vec(&Record { sig: None, ..self.clone() }).expect("a record serialises"));
        b
    }
}

impl DiscoveryConfig {
    /// `r` as stored under its name's key: signed with `key`, when there
    /// is one, over that key and the record.
    pub fn store(&self, r: &Record, key: Option<&AuthKey>) -> String {
        let at = self.key(&r.name);
        let sig = key.map(|k| k.sign(SIG_LABEL, &r.signed_bytes(&at)).iter().map(|b| format!("{b:02x}")).collect());
        serde_json::to_string(&Record { sig, ..r.clone() }).expect("a record serialises")
    }

    /// Reads the value stored under engine `name`'s key: the record, or
    /// why it is not a valid one there (not a record; a record of another
    /// name; with `key`, unsigned, signed by another key, or signed for
    /// another key of etcd).
    pub fn read(&self, name: &str, value: &[u8], key: Option<&AuthKey>) -> std::result::Result<Record, String> {
        let r: Record = serde_json::from_slice(value).map_err(|e| format!("not an engine record ({e})"))?;
        if r.name != name {
            return Err(format!("a record of engine {:?} stored under the name {name:?}", r.name));
        }
        let Some(key) = key else { return Ok(r) };
        let sig = r.sig.as_deref().ok_or("a record without the signature this engine's auth key requires")?;
        let tag = hex(sig).ok_or("a record whose signature is not hex")?;
        if !key.check(SIG_LABEL, &r.signed_bytes(&self.key(name)), &tag) {
            return Err("a record not signed with this engine's auth key for this key of etcd".into());
        }
        Ok(r)
    }
}

/// The bytes of a hex string (`None`: not hex).
fn hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
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
    /// Values under the engines prefix that were not valid records (not a
    /// record, or not signed with this engine's key): ignored, never
    /// followed, never taken for a peer's departure.
    pub invalid_records: u64,
    /// Times this engine found its own key gone or overwritten while its
    /// lease lived, and put its record back.
    pub reclaims: u64,
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

    /// A record as an engine publishes it.
    fn sample() -> Record {
        Record {
            name: "a".into(),
            endpoint: "1.2.3.4:5".into(),
            epoch: 7,
            capabilities: 3,
            boot_id: "ab".into(),
            pid: 9,
            pid_ns: 4026531836,
            sig: None,
        }
    }

    fn cfg(prefix: &str) -> DiscoveryConfig {
        DiscoveryConfig { etcd: vec![], prefix: prefix.into(), ttl_s: 10 }
    }

    #[test]
    fn urls_keys_and_records() {
        assert!(check_url("http://127.0.0.1:2379").is_ok());
        assert!(check_url("http://etcd-0.cluster:2379").is_ok());
        for bad in ["127.0.0.1:2379", "https://h:1", "http://h", "http://h:0", "http://:1", "http://h:1/x"] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        let c = cfg("/orbite/");
        assert_eq!(c.key("a"), "/orbite/engines/a");
        assert_eq!(c.engines_prefix(), "/orbite/engines/");
        let r = sample();
        assert_eq!(c.read("a", c.store(&r, None).as_bytes(), None), Ok(r.clone()));
        assert!(c.read("a", b"{", None).unwrap_err().contains("not an engine record"));
        // A record of an engine from before pid_ns reads with 0.
        let old = br#"{"name":"a","endpoint":"1.2.3.4:5","epoch":7,"capabilities":3,"boot_id":"ab","pid":9}"#;
        assert_eq!(c.read("a", old, None).unwrap().pid_ns, 0);
    }

    #[test]
    fn with_a_key_only_records_it_signed_are_read() {
        let c = cfg("/orbite");
        let key = AuthKey::from_bytes(&[7u8; 32]).unwrap();
        let other = AuthKey::from_bytes(&[8u8; 32]).unwrap();
        let r = sample();
        let signed = c.store(&r, Some(&key));
        let read = c.read("a", signed.as_bytes(), Some(&key)).unwrap();
        assert_eq!(Record { sig: None, ..read }, r);
        // Without a key the signature is not needed, and not in the way.
        assert_eq!(Record { sig: None, ..c.read("a", signed.as_bytes(), None).unwrap() }, r);
        let unsigned = c.store(&r, None);
        assert!(c.read("a", unsigned.as_bytes(), Some(&key)).unwrap_err().contains("without the signature"));
        let by_other = c.store(&r, Some(&other));
        assert!(c.read("a", by_other.as_bytes(), Some(&key)).unwrap_err().contains("not signed with"));
        // Any field changed after signing breaks the signature.
        let moved = signed.replace("1.2.3.4:5", "6.6.6.6:6");
        assert!(c.read("a", moved.as_bytes(), Some(&key)).unwrap_err().contains("not signed with"));
        // A signature cut to its first half is refused: the whole tag is compared.
        let at = signed.find("\"sig\":\"").unwrap() + 7;
        let cut = format!("{}{}", &signed[..at + 32], &signed[at + 64..]);
        assert!(c.read("a", cut.as_bytes(), Some(&key)).unwrap_err().contains("not signed with"));
        let garbled = signed.replace("\"sig\":\"", "\"sig\":\"zz");
        assert!(c.read("a", garbled.as_bytes(), Some(&key)).unwrap_err().contains("not hex"));
    }

    /// A record is bound to the name and the key of etcd it is stored
    /// under: read under another name it is refused (with or without a
    /// key), and its signature does not hold under another prefix.
    /// Guards the name check of `DiscoveryConfig::read` and the key of
    /// etcd in `signed_bytes`.
    #[test]
    fn a_record_read_under_another_name_or_prefix_is_refused() {
        let c = cfg("/orbite");
        let key = AuthKey::from_bytes(&[7u8; 32]).unwrap();
        let signed = c.store(&sample(), Some(&key));
        for k in [None, Some(&key)] {
            let e = c.read("b", signed.as_bytes(), k).unwrap_err();
            assert!(e.contains("a record of engine \"a\" stored under the name \"b\""), "{e}");
        }
        let e = cfg("/elsewhere").read("a", signed.as_bytes(), Some(&key)).unwrap_err();
        assert!(e.contains("not signed with"), "{e}");
    }

    /// Guards `b.extend_from_slice(at.as_bytes())` in `signed_bytes`: a
    /// signed record copied under a prefix of the same length ("/orbitx")
    /// fails its signature (the key's length alone would still match).
    #[test]
    fn a_record_copied_under_a_prefix_of_the_same_length_is_refused() {
        let key = AuthKey::from_bytes(&[7u8; 32]).unwrap();
        let signed = cfg("/orbite").store(&sample(), Some(&key));
        let e = cfg("/orbitx").read("a", signed.as_bytes(), Some(&key)).unwrap_err();
        assert!(e.contains("not signed with"), "{e}");
        assert!(cfg("/orbite").read("a", signed.as_bytes(), Some(&key)).is_ok());
    }
}
