//! `EngineConfig`: every knob of an engine, parsed from and written to JSON.
//!
//! Parsing is strict: an unknown key, a value of the wrong type or a value
//! outside its range is rejected with [`Error::InvalidConfig`] naming the key.
//! The keys are documented in `docs/config.md`.

use crate::control::notify_frame::{check_name, MAX_NOTIFICATION_BYTES};
use crate::control::seal::WireSecurity;
use crate::discovery::{check_url, DiscoveryConfig};
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use crate::log::{Level, LEVEL_NAMES};
pub use crate::transport::ipc::backends::cma::PtracerPolicy;
pub use crate::transport::ipc::backends::mnnvl::MnnvlHandleType;
use serde_json::{Map, Value};
use std::net::SocketAddr;

/// 1 KiB.
pub const KIB: u64 = 1024;
/// 1 MiB.
pub const MIB: u64 = 1024 * KIB;
/// 1 GiB.
pub const GIB: u64 = 1024 * MIB;

/// Multi-node NVLink (MNNVL) and EGM settings. `None` in
/// [`EngineConfig::mnnvl`] disables MNNVL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MnnvlConfig {
    /// Handle type of exports (default [`MnnvlHandleType::Fabric`]).
    pub handle_type: MnnvlHandleType,
    /// The fabric domain advertised to peers (default
    /// [`FabricDomain::Auto`]: from the GPUs' NVLink clique, through NVML).
    pub fabric_domain: FabricDomain,
    /// Register ordinary local host backing with CUDA (default true).
    pub host_register: bool,
    /// Enable HOST_NUMA (EGM) allocation and remote host grants (default false).
    pub egm: bool,
}

impl Default for MnnvlConfig {
    fn default() -> Self {
        MnnvlConfig {
            handle_type: MnnvlHandleType::Fabric,
            fabric_domain: FabricDomain::Auto,
            host_register: true,
            egm: false,
        }
    }
}

/// Which peers MNNVL with fabric handles reaches: those advertising the
/// same fabric domain (over a TCP channel, any host of the NVLink
/// partition), or only those of this boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricDomain {
    /// Derived at engine start from the local GPUs' NVLink cluster and
    /// clique (NVML's fabric information), as NCCL derives its MNNVL
    /// domain; this boot only where NVML gives none (no NVML, no fabric, a
    /// registration not completed, GPUs of different cliques), said in the
    /// stats' notes. The engine's [`crate::Engine::config`] holds the
    /// resolved value.
    Auto,
    /// Peers of this boot only (config `null`).
    ThisBoot,
    /// A nonzero domain shared by the peers of one NVLink partition.
    Fixed([u8; 16]),
}

impl FabricDomain {
    /// The domain, when one is set.
    pub fn fixed(self) -> Option<[u8; 16]> {
        match self {
            FabricDomain::Fixed(d) => Some(d),
            _ => None,
        }
    }
}

/// min(cores, 4): enough I/O threads to keep both ends of a host's links
/// busy, few enough that an engine stays small.
fn default_io_threads() -> u32 {
    std::thread::available_parallelism().map(|n| n.get().min(4) as u32).unwrap_or(2)
}

/// One top-level key: its name, its type as docs/config.md writes it, its
/// range (integers), how it is read from JSON into the config, and how the
/// config's value is written back. One line per key in [`KEYS`] serves
/// parsing, validation of the ranges (of JSON and of configs built in Rust
/// alike), the JSON echo and the docs test (`tests/config_docs.rs`).
pub struct Key {
    /// The JSON key.
    pub name: &'static str,
    /// Its type, as the docs' table writes it.
    pub ty: &'static str,
    /// Smallest and largest value accepted, for integer keys.
    pub range: Option<(u64, u64)>,
    parse: fn(&mut EngineConfig, &str, &Value) -> Result<()>,
    echo: fn(&EngineConfig) -> Value,
}

impl Key {
    /// The key's value in `c`, as JSON.
    pub fn value(&self, c: &EngineConfig) -> Value {
        (self.echo)(c)
    }
}

/// An integer key for field `$f`, `$min..=$max` (the field's type holds
/// the maximum: `$max` fits it).
macro_rules! integer {
    ($f:ident, $min:expr, $max:expr) => {
        Key {
            name: stringify!($f),
            ty: "integer",
            range: Some(($min, $max)),
            parse: |c, k, v| {
                c.$f = get_u64(k, v, $min, $max)? as _;
                Ok(())
            },
            echo: |c| (c.$f as u64).into(),
        }
    };
}

/// A key for field `$f` of type `$ty` (the docs' word), read by `$parse`
/// (from the key's name and its JSON value) and written back by `$echo`.
macro_rules! key {
    ($f:ident, $ty:expr, $parse:expr, $echo:expr) => {
        Key {
            name: stringify!($f),
            ty: $ty,
            range: None,
            parse: |c, k, v| {
                c.$f = ($parse)(k, v)?;
                Ok(())
            },
            echo: |c| ($echo)(&c.$f),
        }
    };
}

/// Declares every top-level key once: its doc, field, type, default and
/// how JSON reads and writes it (`integer(min, max)` or `key("docs type",
/// parse, echo)`), in the order docs/config.md gives them. From the one
/// list come the [`EngineConfig`] struct, its `Default`, and [`KEYS`],
/// which serves parsing, validation of the ranges (of JSON and of configs
/// built in Rust alike), the JSON echo and the docs test
/// (`tests/config_docs.rs`). Adding a key is one entry here (and its docs
/// row, which the test demands).
macro_rules! config_keys {
    ($($(#[doc = $doc:expr])* $f:ident: $t:ty = $default:expr => $kind:ident($($arg:tt)*);)*) => {
        /// Configuration of one [`crate::Engine`].
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct EngineConfig {
            $($(#[doc = $doc])* pub $f: $t,)*
        }

        impl Default for EngineConfig {
            fn default() -> Self {
                EngineConfig { $($f: $default,)* }
            }
        }

        /// Every top-level key, in the order docs/config.md gives them.
        pub const KEYS: &[Key] = &[$($kind!($f, $($arg)*),)*];
    };
}

config_keys! {
    /// Address the control socket listens on (`127.0.0.1:0`: loopback, port
    /// from the OS).
    listen: String = "127.0.0.1:0".to_string()
        => key("string", |k, v| get_str(k, v).map(str::to_string), |l: &String| l.as_str().into());
    /// Enable the legacy NVLink (CUDA IPC) transport.
    nvlink: bool = false => key("bool", get_bool, |b: &bool| (*b).into());
    /// Enable MNNVL; mutually exclusive with `nvlink: true`.
    mnnvl: Option<MnnvlConfig> = None
        => key("object or null", parse_mnnvl, |m: &Option<MnnvlConfig>| {
            m.as_ref().map_or(Value::Null, MnnvlConfig::to_value)
        });
    /// Bytes that may be in flight (requester side), and the bound of the
    /// mapping budget for IPC exports and imports.
    max_inflight_bytes: u64 = GIB => integer(MIB, 1 << 40);
    /// Largest single transfer unit; larger requests are split.
    max_transfer_bytes: u64 = 64 * MIB => integer(4 * KIB, 1 << 40);
    /// NVLink relocation cache entries (0 = close imports at group end).
    nvlink_cache_entries: u32 = 0 => integer(0, 4096);
    /// SHM relocation cache entries (0 = close imports at group end;
    /// default 256: a cached import costs the source nothing but its
    /// charge, and later submissions through it take no round trip; one
    /// entry per remote region, and KV pools register about a hundred).
    shm_cache_entries: u32 = 256 => integer(0, 4096);
    /// Offer CMA (cross-memory attach of registered host memory the library
    /// did not allocate, between processes of one host and user).
    cma: bool = true => key("bool", get_bool, |b: &bool| (*b).into());
    /// Under Yama `ptrace_scope` 1: whom a source names as its ptracer so
    /// that its CMA requesters may copy (`peer`: the first requester while
    /// it lives; `any`: every process of its user; `none`: nobody).
    cma_ptracer: PtracerPolicy = PtracerPolicy::Peer
        => key("string", parse_ptracer, |p: &PtracerPolicy| p.name().into());
    /// Consecutive requests of one direction contiguous on both sides (in
    /// one local and one remote region, never across a dependency) move as
    /// one copy on SHM, NVLink and MNNVL; each keeps its own outcome
    /// (default true; false for measurement).
    coalesce: bool = true => key("bool", get_bool, |b: &bool| (*b).into());
    /// CUDA stream pool slots across all contexts.
    nvlink_stream_count: u32 = 8 => integer(1, 4096);
    /// Single NVLink copies strictly below this many KiB use the synchronous
    /// fast path (0 disables it).
    nvlink_async_memcpy_threshold_kb: u64 = 2048 => integer(0, MIB);
    /// Transport candidates for `Transport::Auto`, best first.
    transport_policy: Vec<TransportKind> = TransportKind::DEFAULT_POLICY.to_vec()
        => key("array of strings", parse_policy, |p: &Vec<TransportKind>| {
            p.iter().map(|t| t.name()).collect::<Vec<_>>().into()
        });
    /// Deadline for submissions, connects and closes given 0.
    default_timeout_ms: u32 = 30_000 => integer(1, 86_400_000);
    /// Deadline for a new incoming connection to complete its handshake.
    handshake_timeout_ms: u32 = 5_000 => integer(1, 600_000);
    /// Most incoming control connections served at once.
    max_incoming_connections: u32 = 256 => integer(1, 65_536);
    /// Incoming TCP connections still in their handshake (authentication
    /// and first frame) at once; they take no connection slot, and the
    /// oldest is closed when a new one would pass this bound.
    max_pending_handshakes: u32 = 128 => integer(1, 65_536);
    /// Of them, from one source address.
    max_pending_handshakes_per_address: u32 = 16 => integer(1, 65_536);
    /// I/O threads serving this engine's control connections (outgoing and
    /// incoming), whatever their number (started as connections come;
    /// default min(cores, 4)).
    io_threads: u32 = default_io_threads() => integer(1, 64);
    /// In microseconds: an I/O thread whose events came within this long of
    /// its last turn polls for the next one for up to this long before it
    /// sleeps; an idle thread, or one whose events are further apart,
    /// sleeps at once (0: never polls).
    io_poll_us: u32 = 200 => integer(0, 10_000);
    /// Most incoming IPC channels served at once (counted apart from the
    /// control connections).
    max_ipc_channels: u32 = 256 => integer(1, 65_536);
    /// A file holding the shared secret (at least 32 bytes, readable by its
    /// owner only) that every control connection and IPC channel must prove
    /// knowledge of, both ways, before anything else. `None`: no
    /// authentication (docs/security.md says what that allows).
    auth_key_file: Option<String> = None
        => key("string or null", optional_str, |f: &Option<String>| f.as_deref().into());
    /// What the key's sealing of TCP control connections protects:
    /// integrity (default) or, `Encrypt`, confidentiality too.
    wire_security: WireSecurity = Default::default()
        => key("string", parse_wire_security, |w: &WireSecurity| w.name().into());
    /// Users besides this process's own whose processes may open an IPC
    /// channel to this engine.
    ipc_allowed_uids: Vec<u32> = Vec::new() => key("array of integers", parse_uids, |u: &Vec<u32>| u.as_slice().into());
    /// An export offer the requester does not answer within this many
    /// milliseconds expires and releases its loan and charge.
    offer_timeout_ms: u32 = 5_000 => integer(1, 600_000);
    /// Exports one requester (a kernel-verified process, or an unverified
    /// channel) may hold of this engine at once, per IPC transport, in any
    /// state (offered, in use, retained after its channel was lost); the
    /// next request is refused `RESOURCE_EXHAUSTED`.
    ipc_max_exports_per_requester: u32 = 512 => integer(1, 1 << 20);
    /// The part of `max_inflight_bytes`, in percent, that the allocations
    /// one requester alone keeps exported may charge, once it holds one
    /// such allocation (a first one is always allowed, whatever its size):
    /// one requester cannot take the whole mapping budget from the others.
    ipc_requester_budget_percent: u32 = 50 => integer(1, 100);
    /// This engine's name, which its peers see (notifications name their
    /// sender by it): 1 to 64 bytes of `[A-Za-z0-9._-]`. `None`: peers see
    /// its endpoint.
    name: Option<String> = None => key("string or null", optional_str, |n: &Option<String>| n.as_deref().into());
    /// Largest notification message, in bytes, this engine sends or accepts.
    notification_max_bytes: u32 = 4096 => integer(1, MAX_NOTIFICATION_BYTES);
    /// Most notifications waiting here to be taken; a sender finds the
    /// queue full (`RESOURCE_EXHAUSTED`) beyond it.
    notification_queue: u32 = 1024 => integer(1, 65_536);
    /// Discovery on etcd (needs `name`): the engine publishes itself under
    /// its name while it lives, and finds peers by theirs.
    discovery: Option<DiscoveryConfig> = None
        => key("object or null", parse_discovery_or_null, |d: &Option<DiscoveryConfig>| {
            let echo = |d: &DiscoveryConfig| serde_json::json!({"etcd": d.etcd, "prefix": d.prefix, "ttl_s": d.ttl_s});
            d.as_ref().map_or(Value::Null, echo)
        });
    /// A payload (READ answer or WRITE body) must move at least this many
    /// KiB per second on average after the stall allowance, or the
    /// connection ends; 0 keeps only the stall bound.
    min_payload_rate_kib: u32 = 1024 => integer(0, 1 << 24);
    /// The least important lines this engine logs (default `Warn`); the
    /// environment variable `ORBITE_LOG`, when set, wins over it.
    log_level: Level = Level::Warn => key("string", parse_level, |l: &Level| l.name().into());
}

fn bad(key: &str, what: impl std::fmt::Display) -> Error {
    Error::InvalidConfig(format!("key `{key}`: {what}"))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The `discovery` object: `etcd` (URLs, required), `prefix` ("/orbite"),
/// `ttl_s` (10).
fn parse_discovery(obj: &Map<String, Value>) -> Result<DiscoveryConfig> {
    let mut d = DiscoveryConfig { etcd: Vec::new(), prefix: "/orbite".into(), ttl_s: 10 };
    for (k, v) in obj {
        let key = format!("discovery.{k}");
        match k.as_str() {
            "etcd" => {
                let list = v
                    .as_array()
                    .ok_or_else(|| bad(&key, format!("expected an array of URLs, got {}", type_name(v))))?;
                d.etcd = list.iter().map(|u| get_str(&key, u).map(str::to_string)).collect::<Result<_>>()?;
            }
            "prefix" => d.prefix = get_str(&key, v)?.to_string(),
            "ttl_s" => d.ttl_s = get_u32(&key, v, 1, 3600)?,
            _ => return Err(bad(&key, "unknown key")),
        }
    }
    check_discovery(&d)?;
    Ok(d)
}

fn check_discovery(d: &DiscoveryConfig) -> Result<()> {
    if d.etcd.is_empty() {
        return Err(bad("discovery.etcd", "names no etcd URL (expected [\"http://HOST:PORT\", ...])"));
    }
    for u in &d.etcd {
        check_url(u).map_err(|e| bad("discovery.etcd", e))?;
    }
    if !d.prefix.starts_with('/') || d.prefix.len() > 256 {
        return Err(bad("discovery.prefix", format!("{:?} must start with / and hold at most 256 bytes", d.prefix)));
    }
    if d.ttl_s == 0 || d.ttl_s > 3600 {
        return Err(bad("discovery.ttl_s", format!("{} is outside the range 1..=3600", d.ttl_s)));
    }
    Ok(())
}

fn get_bool(key: &str, v: &Value) -> Result<bool> {
    v.as_bool().ok_or_else(|| bad(key, format!("expected a boolean, got {}", type_name(v))))
}

fn get_u64(key: &str, v: &Value, min: u64, max: u64) -> Result<u64> {
    let n = v.as_u64().ok_or_else(|| {
        bad(
            key,
            format!(
                "expected an unsigned integer, got {}",
                if v.is_number() { "a negative or fractional number" } else { type_name(v) }
            ),
        )
    })?;
    // Below `min` is refused again, in the same words, by `validate` (which
    // `from_json` runs) for each integer key, and by `check_discovery` for
    // discovery.ttl_s, the only other caller with a minimum above 0: this
    // first refusal is defence in depth (round 18 S2); validate's check is
    // held by `a_config_built_in_rust_is_held_to_each_lower_bound`. Above
    // `max` must be refused here, before the caller narrows the value.
    if n < min || n > max {
        return Err(bad(key, format!("{n} is outside the range {min}..={max}")));
    }
    Ok(n)
}

fn get_u32(key: &str, v: &Value, min: u32, max: u32) -> Result<u32> {
    Ok(get_u64(key, v, min as u64, max as u64)? as u32)
}

fn get_str<'a>(key: &str, v: &'a Value) -> Result<&'a str> {
    v.as_str().ok_or_else(|| bad(key, format!("expected a string, got {}", type_name(v))))
}

/// A string, or null for none.
fn optional_str(key: &str, v: &Value) -> Result<Option<String>> {
    match v {
        Value::Null => Ok(None),
        _ => get_str(key, v).map(|s| Some(s.to_string())),
    }
}

/// An object read by `read`, or null for none.
fn object_or_null<T>(key: &str, v: &Value, read: fn(&Map<String, Value>) -> Result<T>) -> Result<Option<T>> {
    match v {
        Value::Null => Ok(None),
        Value::Object(o) => read(o).map(Some),
        _ => Err(bad(key, format!("expected an object or null, got {}", type_name(v)))),
    }
}

fn parse_mnnvl(key: &str, v: &Value) -> Result<Option<MnnvlConfig>> {
    object_or_null(key, v, MnnvlConfig::from_object)
}

fn parse_discovery_or_null(key: &str, v: &Value) -> Result<Option<DiscoveryConfig>> {
    object_or_null(key, v, parse_discovery)
}

fn parse_wire_security(key: &str, v: &Value) -> Result<WireSecurity> {
    let name = get_str(key, v)?;
    WireSecurity::from_name(name)
        .ok_or_else(|| bad(key, format!("unknown value {name:?} (expected \"integrity\" or \"encrypt\")")))
}

fn parse_ptracer(key: &str, v: &Value) -> Result<PtracerPolicy> {
    let name = get_str(key, v)?;
    PtracerPolicy::from_name(name)
        .ok_or_else(|| bad(key, format!("unknown value {name:?} (expected \"peer\", \"any\" or \"none\")")))
}

fn parse_level(key: &str, v: &Value) -> Result<Level> {
    let name = get_str(key, v)?;
    Level::from_name(name).ok_or_else(|| bad(key, format!("unknown level {name:?} (expected {LEVEL_NAMES})")))
}

/// Parses a 16-byte fabric domain written as 32 hexadecimal digits.
pub fn parse_fabric_domain(s: &str) -> std::result::Result<[u8; 16], String> {
    let s = s.trim();
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("expected 32 hexadecimal digits (16 bytes), got {:?}", s));
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    if out == [0u8; 16] {
        return Err("the all-zero domain is reserved; use null for this boot only".into());
    }
    Ok(out)
}

fn hex16(d: &[u8; 16]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

impl MnnvlConfig {
    fn from_object(obj: &Map<String, Value>) -> Result<MnnvlConfig> {
        let mut c = MnnvlConfig::default();
        for (k, v) in obj {
            let key = format!("mnnvl.{k}");
            match k.as_str() {
                "handle_type" => {
                    c.handle_type = match get_str(&key, v)? {
                        "fabric" => MnnvlHandleType::Fabric,
                        "posix_fd" => MnnvlHandleType::PosixFd,
                        other => {
                            return Err(bad(
                                &key,
                                format!("unknown handle type {other:?} (expected \"fabric\" or \"posix_fd\")"),
                            ))
                        }
                    }
                }
                "fabric_domain" => {
                    c.fabric_domain = match v {
                        Value::Null => FabricDomain::ThisBoot,
                        Value::String(a) if a == "auto" => FabricDomain::Auto,
                        _ => FabricDomain::Fixed(parse_fabric_domain(get_str(&key, v)?).map_err(|e| bad(&key, e))?),
                    }
                }
                "host_register" => c.host_register = get_bool(&key, v)?,
                "egm" => c.egm = get_bool(&key, v)?,
                // Accepted and range-checked for parity with the seed's
                // configuration; it configures nothing: MNNVL copies always
                // take the asynchronous stream path (docs/config.md).
                "async_memcpy_threshold" => {
                    get_u32(&key, v, 0, 65_536)?;
                }
                _ => return Err(bad(&key, "unknown key")),
            }
        }
        Ok(c)
    }

    fn to_value(&self) -> Value {
        serde_json::json!({
            "handle_type": self.handle_type.as_str(),
            "fabric_domain": match self.fabric_domain {
                FabricDomain::Auto => Value::from("auto"),
                FabricDomain::ThisBoot => Value::Null,
                FabricDomain::Fixed(d) => Value::from(hex16(&d)),
            },
            "host_register": self.host_register,
            "egm": self.egm,
        })
    }
}

impl EngineConfig {
    /// Parses a JSON object; `""` (or only whitespace) gives the defaults.
    pub fn from_json(text: &str) -> Result<EngineConfig> {
        if text.trim().is_empty() {
            return Ok(EngineConfig::default());
        }
        let v: Value = serde_json::from_str(text).map_err(|e| Error::InvalidConfig(format!("not valid JSON: {e}")))?;
        if let Some(key) = super::json_keys::first_duplicate(text) {
            return Err(Error::InvalidConfig(format!("key `{key}` appears twice; give each key once")));
        }
        let obj = v
            .as_object()
            .ok_or_else(|| Error::InvalidConfig(format!("expected a JSON object, got {}", type_name(&v))))?;
        let mut c = EngineConfig::default();
        for (k, v) in obj {
            let key = KEYS.iter().find(|key| key.name == k).ok_or_else(|| bad(k, "unknown key"))?;
            (key.parse)(&mut c, k, v)?;
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks the relations between keys (each key's own range is checked
    /// while parsing; this also guards configs built in Rust).
    pub fn validate(&self) -> Result<()> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|_| bad("listen", format!("{:?} is not an IP:port socket address", self.listen)))?;
        if self.nvlink && self.mnnvl.is_some() {
            return Err(bad("mnnvl", "MNNVL and legacy `nvlink: true` are mutually exclusive; enable one"));
        }
        for key in KEYS {
            let Some((min, max)) = key.range else { continue };
            let v = key.value(self).as_u64().unwrap_or(u64::MAX);
            if v < min || v > max {
                return Err(bad(key.name, format!("{v} is outside the range {min}..={max}")));
            }
        }
        if self.max_transfer_bytes > self.max_inflight_bytes {
            return Err(bad(
                "max_transfer_bytes",
                format!("{} exceeds max_inflight_bytes ({})", self.max_transfer_bytes, self.max_inflight_bytes),
            ));
        }
        let held = self.notification_queue as u64 * self.notification_max_bytes as u64;
        if held > GIB {
            return Err(bad(
                "notification_queue",
                format!(
                    "{} notifications of up to notification_max_bytes ({}) may hold {held} bytes, more than 1 GiB",
                    self.notification_queue, self.notification_max_bytes
                ),
            ));
        }
        if let Some(n) = &self.name {
            check_name(n).map_err(|e| bad("name", e))?;
        }
        if let Some(d) = &self.discovery {
            if self.name.is_none() {
                return Err(bad("discovery", "needs `name`: peers find this engine by it"));
            }
            check_discovery(d)?;
        }
        if self.transport_policy.is_empty() {
            return Err(bad("transport_policy", "must name at least one transport"));
        }
        if self.auth_key_file.as_deref() == Some("") {
            return Err(bad("auth_key_file", "is empty (name a key file, or null for no authentication)"));
        }
        if self.wire_security == WireSecurity::Encrypt && self.auth_key_file.is_none() {
            return Err(bad("wire_security", "\"encrypt\" needs auth_key_file: the session keys come from the key"));
        }
        Ok(())
    }

    /// The config as a JSON value (every key, defaults included).
    pub fn to_value(&self) -> Value {
        Value::Object(KEYS.iter().map(|key| (key.name.to_string(), key.value(self))).collect())
    }

    /// The config as JSON text; [`EngineConfig::from_json`] reads it back.
    pub fn to_json(&self) -> String {
        self.to_value().to_string()
    }
}

fn parse_uids(key: &str, v: &Value) -> Result<Vec<u32>> {
    let arr = v.as_array().ok_or_else(|| bad(key, format!("expected an array of user ids, got {}", type_name(v))))?;
    arr.iter().map(|u| get_u32(key, u, 0, u32::MAX - 1)).collect()
}

fn parse_policy(key: &str, v: &Value) -> Result<Vec<TransportKind>> {
    let arr =
        v.as_array().ok_or_else(|| bad(key, format!("expected an array of transport names, got {}", type_name(v))))?;
    let mut out = Vec::new();
    for item in arr {
        let name = get_str(key, item)?;
        let t = TransportKind::from_name(name)
            .ok_or_else(|| bad(key, format!("unknown transport {name:?} (expected mnnvl, nvlink, shm, cma or tcp)")))?;
        if out.contains(&t) {
            return Err(bad(key, format!("transport {name:?} is listed twice")));
        }
        out.push(t);
    }
    if out.is_empty() {
        return Err(bad(key, "must name at least one transport"));
    }
    Ok(out)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
