//! The doctor (`orbite-doctor`, `orbite_diagnose_json`): walks the layers
//! a CUDA transport stands on — the driver and its version, the devices,
//! the P2P matrix, the fabric-handle attribute, the IMEX channel files and
//! their permissions, NVML's fabric state and clique, a probe allocation
//! and export, and optionally a probe import against a peer — and says of
//! each whether it is sound or what is broken and what to do (the layer is
//! named as in the engine's stats and errors, [`Cause`]). Useful on a
//! machine without a GPU too: it says so.

use super::config::MnnvlHandleType;
use crate::cuda::fabric_cause::Cause;
use crate::error::{Error, Result};
use crate::kinds::TransportKind;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// What to diagnose.
#[derive(Debug, Clone, PartialEq)]
pub struct DiagnoseOptions {
    /// The transport whose layers decide the verdict (`nvlink` or
    /// `mnnvl`); `None`: every layer, no verdict.
    pub transport: Option<TransportKind>,
    /// The MNNVL handle type to check (default fabric).
    pub handle_type: MnnvlHandleType,
    /// The GPU of the probe allocation (default 0).
    pub device: i32,
    /// Where the IMEX channel files are (default
    /// `/dev/nvidia-caps-imex-channels`).
    pub imex_channel_dir: PathBuf,
    /// A peer engine's endpoint to run a probe import against.
    pub peer: Option<String>,
    /// Config of the engine that probes the peer (e.g. its
    /// `auth_key_file`); its `mnnvl` is set from `handle_type`.
    pub engine_config: serde_json::Map<String, serde_json::Value>,
    /// Bound of the peer probe.
    pub timeout: Duration,
}

impl Default for DiagnoseOptions {
    fn default() -> Self {
        DiagnoseOptions {
            transport: None,
            handle_type: MnnvlHandleType::Fabric,
            device: 0,
            imex_channel_dir: PathBuf::from("/dev/nvidia-caps-imex-channels"),
            peer: None,
            engine_config: serde_json::Map::new(),
            timeout: Duration::from_secs(10),
        }
    }
}

impl DiagnoseOptions {
    /// Parses `{"transport": "mnnvl", "handle_type": "fabric", "device": 0,
    /// "imex_channel_dir": "...", "peer": "IP:PORT", "engine_config": {...},
    /// "timeout_ms": 10000}` (every key optional; `""` gives the defaults).
    /// An unknown key or a wrong value is `InvalidArgument` naming it.
    pub fn from_json(text: &str) -> Result<DiagnoseOptions> {
        let mut o = DiagnoseOptions::default();
        if text.trim().is_empty() {
            return Ok(o);
        }
        let bad = |k: &str, why: &str| Error::InvalidArgument(format!("diagnose option `{k}`: {why}"));
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::InvalidArgument(format!("diagnose options: {e}")))?;
        let obj =
            v.as_object().ok_or_else(|| Error::InvalidArgument("diagnose options must be a JSON object".into()))?;
        for (k, v) in obj {
            let s = || v.as_str().ok_or_else(|| bad(k, "expected a string"));
            match k.as_str() {
                "transport" if v.is_null() => o.transport = None,
                "transport" => {
                    o.transport = Some(match s()? {
                        "nvlink" => TransportKind::Nvlink,
                        "mnnvl" => TransportKind::Mnnvl,
                        _ => {
                            return Err(bad(k, "expected \"nvlink\" or \"mnnvl\" (tcp and shm need nothing to check)"))
                        }
                    })
                }
                "handle_type" => {
                    o.handle_type = match s()? {
                        "fabric" => MnnvlHandleType::Fabric,
                        "posix_fd" => MnnvlHandleType::PosixFd,
                        _ => return Err(bad(k, "expected \"fabric\" or \"posix_fd\"")),
                    }
                }
                "device" => {
                    o.device = v
                        .as_i64()
                        .and_then(|d| i32::try_from(d).ok())
                        .filter(|d| *d >= 0)
                        .ok_or_else(|| bad(k, "expected a device ordinal"))?
                }
                "imex_channel_dir" => o.imex_channel_dir = PathBuf::from(s()?),
                "peer" if v.is_null() => o.peer = None,
                "peer" => o.peer = Some(s()?.to_string()),
                "engine_config" => {
                    o.engine_config = v.as_object().cloned().ok_or_else(|| bad(k, "expected a JSON object"))?
                }
                "timeout_ms" => {
                    let ms = v.as_u64().filter(|ms| (1..=600_000).contains(ms));
                    o.timeout = Duration::from_millis(ms.ok_or_else(|| bad(k, "expected 1 to 600000"))?)
                }
                _ => return Err(bad(k, "unknown option")),
            }
        }
        Ok(o)
    }
}

/// How one layer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// Sound.
    Ok,
    /// Broken: the requested transport cannot work.
    Fail,
    /// A fact that decides nothing for the requested transport.
    Info,
}

/// One layer's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// The layer (`driver`, `devices`, `p2p`, `fabric_attribute`, `imex`,
    /// `nvml`, `probe`, `fabric_domain`, `peer`).
    pub layer: &'static str,
    /// Its standing.
    pub status: CheckStatus,
    /// What is broken ([`Cause::name`]) on a failed line.
    pub cause: Option<&'static str>,
    /// What was found, and on a failed line what to do.
    pub text: String,
}

/// A diagnosis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnosis {
    /// The transport asked about (`null`: none).
    pub transport: Option<&'static str>,
    /// The MNNVL handle type checked.
    pub handle_type: &'static str,
    /// Whether the requested transport can work (`null` without one).
    pub usable: Option<bool>,
    /// The layers, in the order walked.
    pub checks: Vec<Check>,
}

impl Diagnosis {
    /// One line per layer: `ok   driver: ...`, `FAIL imex: cause: ...`.
    pub fn lines(&self) -> Vec<String> {
        self.checks
            .iter()
            .map(|c| {
                let s = match c.status {
                    CheckStatus::Ok => "ok  ",
                    CheckStatus::Fail => "FAIL",
                    CheckStatus::Info => "info",
                };
                format!("{s} {}: {}", c.layer, c.text)
            })
            .collect()
    }

    /// The JSON text of the diagnosis.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }
}

/// Collects the lines of one walk.
struct Walk {
    checks: Vec<Check>,
    /// Whether a failed line decides the verdict (layers the requested
    /// transport needs).
    failed: bool,
}

impl Walk {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn ok(&mut self, layer: &'static str, text: String) {
        self.checks.push(Check { layer, status: CheckStatus::Ok, cause: None, text });
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn info(&mut self, layer: &'static str, text: String) {
        self.checks.push(Check { layer, status: CheckStatus::Info, cause: None, text });
    }

    /// A broken layer: `cause: what; remedy`.
    fn fail(&mut self, layer: &'static str, cause: Cause, what: &str) {
        let text = super::mnnvl_fabric::refusal_text(cause, what);
        self.checks.push(Check { layer, status: CheckStatus::Fail, cause: Some(cause.name()), text });
        self.failed = true;
    }

    /// A broken layer the requested transport does not need: a fact.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn fail_or_info(&mut self, needed: bool, layer: &'static str, cause: Cause, what: &str) {
        if needed {
            self.fail(layer, cause, what)
        } else {
            self.info(layer, format!("{}: {what}", cause.name()))
        }
    }
}

/// Diagnoses this machine (and a peer) for `o.transport`.
pub fn diagnose(o: &DiagnoseOptions) -> Diagnosis {
    let mut w = Walk { checks: Vec::new(), failed: false };
    walk(o, &mut w);
    Diagnosis {
        transport: o.transport.map(|k| k.name()),
        handle_type: o.handle_type.as_str(),
        usable: o.transport.map(|_| !w.failed),
        checks: w.checks,
    }
}

#[cfg(not(feature = "cuda"))]
fn walk(_o: &DiagnoseOptions, w: &mut Walk) {
    w.fail("driver", Cause::NoDriver, crate::cuda::NO_CUDA);
}

#[cfg(feature = "cuda")]
fn walk(o: &DiagnoseOptions, w: &mut Walk) {
    use crate::cuda::{driver, fabric, imex, nvml};
    let d = match driver::driver() {
        Ok(d) => *d,
        Err(e) => {
            let cause =
                if e.status() == crate::error::Status::Unavailable { Cause::NoDriver } else { Cause::DriverError };
            return w.fail("driver", cause, e.message());
        }
    };
    let nvml_version = nvml::nvml().ok().and_then(|n| n.driver_version());
    w.ok(
        "driver",
        format!(
            "CUDA driver API {} ({}.{}){}, {} visible GPU{}",
            d.version,
            d.version / 1000,
            d.version % 1000 / 10,
            nvml_version.map(|v| format!(", kernel driver {v}")).unwrap_or_default(),
            d.devices,
            if d.devices == 1 { "" } else { "s" }
        ),
    );
    let names: Vec<String> = (0..d.devices)
        .map(|g| {
            let name = driver::device_name(g).unwrap_or_else(|| "unnamed".into());
            match driver::device_uuid(g) {
                Some(u) => format!("GPU {g} {name} ({})", nvml::uuid_string(&u)),
                None => format!("GPU {g} {name}"),
            }
        })
        .collect();
    w.ok("devices", names.join("; "));
    if o.device >= d.devices {
        return w.fail(
            "devices",
            Cause::DriverError,
            &format!("GPU {} does not exist ({} visible): pick another with --device", o.device, d.devices),
        );
    }
    if d.devices > 1 {
        let mut missing = Vec::new();
        for a in 0..d.devices {
            for b in 0..d.devices {
                if a != b && !driver::can_access_peer(a, b).unwrap_or(false) {
                    missing.push(format!("{a}->{b}"));
                }
            }
        }
        if missing.is_empty() {
            w.ok("p2p", format!("every pair of the {} GPUs has a peer path", d.devices));
        } else {
            w.info(
                "p2p",
                format!(
                    "no peer path {}: copies between those GPUs' memory in one process are refused before posting",
                    missing.join(", ")
                ),
            );
        }
    } else {
        w.info("p2p", "one visible GPU: no pair to check".into());
    }
    if o.transport == Some(TransportKind::Nvlink) {
        return;
    }
    let mnnvl = o.transport == Some(TransportKind::Mnnvl) || o.transport.is_none();
    let fabric_handles = o.handle_type == MnnvlHandleType::Fabric;
    let needs_fabric = mnnvl && fabric_handles;
    // The attribute.
    let attribute = fabric::fabric_attribute(o.device);
    match &attribute {
        Ok(true) => w.ok("fabric_attribute", format!("GPU {} says it supports fabric handles", o.device)),
        Ok(false) => w.fail_or_info(
            needs_fabric,
            "fabric_attribute",
            Cause::FabricNotSupported,
            &format!(
                "GPU {} does not support fabric handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0): it \
                 has no multi-node NVLink fabric",
                o.device
            ),
        ),
        Err(e) => {
            return w.fail("fabric_attribute", Cause::FabricNotSupported, e.message());
        }
    }
    // The probe allocation and its export: the truth the IMEX line is read
    // against (the driver found a channel if it worked).
    let ty = if fabric_handles { fabric::HandleType::Fabric } else { fabric::HandleType::PosixFd };
    let probe = fabric::ProbeAllocation::new(o.device, ty);
    // NVML's fabric information, read here for its line below: a GPU
    // without a fabric (the attribute or NVML says so) makes the IMEX
    // channels moot.
    let nvml_read = super::mnnvl_fabric::visible_fabric();
    let no_fabric = matches!(attribute, Ok(false))
        || nvml_read
            .as_ref()
            .is_ok_and(|infos| infos.iter().any(|(g, i)| *g == o.device && i.state == nvml::FabricState::NotSupported));
    // IMEX channels.
    let dir = &o.imex_channel_dir;
    let uid = nix_uid();
    let channels = imex::channels(dir);
    let registered = match imex::registered_major() {
        Some(m) => format!("the driver registered nvidia-caps-imex-channels with major {m}"),
        None => "/proc/devices lists no nvidia-caps-imex-channels (the NVIDIA driver registers it)".into(),
    };
    let missing =
        |what: String| -> (Cause, String) { (Cause::NoImexChannel, format!("no IMEX channel: {what}; {registered}")) };
    let imex_broken = match &channels {
        Err(why) => Some(missing(why.clone())),
        Ok(c) if c.is_empty() => Some(missing(format!("{} holds no channelN file", dir.display()))),
        Ok(c) => {
            let listed: Vec<String> = c.iter().map(|c| c.describe()).collect();
            match c.iter().find(|c| c.usable) {
                Some(u) => {
                    w.ok(
                        "imex",
                        format!(
                            "{}: {}; this process (uid {uid}) uses channel{}",
                            dir.display(),
                            listed.join(", "),
                            u.number
                        ),
                    );
                    None
                }
                None => Some((
                    Cause::ImexChannelDenied,
                    format!("{}: {}: this process (uid {uid}) may open none of them", dir.display(), listed.join(", ")),
                )),
            }
        }
    };
    if let Some((cause, what)) = imex_broken {
        if !fabric_handles {
            w.info("imex", format!("{}: {what} (POSIX-fd handles need no channel)", cause.name()));
        } else if no_fabric {
            w.info("imex", format!("{}: {what} (moot: this GPU has no fabric)", cause.name()));
        } else if probe.is_ok() {
            // The driver found a channel where this walk did not look.
            w.info("imex", format!("{}: {what} (yet the probe allocation worked)", cause.name()));
        } else {
            w.fail_or_info(needs_fabric, "imex", cause, &what);
        }
    }
    // NVML.
    let infos = match nvml_read {
        Ok(i) => i,
        Err(why) => {
            w.info("nvml", format!("{why}: fabric_domain \"auto\" cannot read the clique and falls back to this boot"));
            Vec::new()
        }
    };
    for (g, i) in &infos {
        let text = format!(
            "GPU {g}: fabric state {}, status {}, cluster {}, clique {}",
            i.state.name(),
            i.status_text,
            i.cluster_uuid.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            i.clique_id
        );
        if i.state == nvml::FabricState::NotSupported {
            w.fail_or_info(
                needs_fabric,
                "nvml",
                Cause::FabricNotSupported,
                &format!(
                    "GPU {g} has no NVLink fabric (NVML fabric state: not supported): fabric handles cannot leave \
                     it; POSIX-fd MNNVL still works between processes of this host"
                ),
            );
        } else if !i.ready() {
            w.fail_or_info(needs_fabric, "nvml", Cause::DaemonNotReady, &text);
        } else {
            w.ok("nvml", text);
        }
    }
    // The probe's line.
    match probe {
        Ok(p) => w.ok(
            "probe",
            format!(
                "a {}-byte allocation on GPU {} with {} handles was created and exported",
                p.physical(),
                o.device,
                o.handle_type.as_str()
            ),
        ),
        Err(f) => {
            let channels = channels.unwrap_or_default();
            let cause = match f.code {
                Some(code) => crate::cuda::fabric_cause::of_local_refusal(
                    code,
                    !channels.is_empty(),
                    channels.iter().any(|c| c.usable),
                ),
                None => Cause::DriverError,
            };
            w.fail_or_info(
                mnnvl,
                "probe",
                cause,
                &format!("the probe allocation failed at {}: {}", f.step, f.error.message()),
            );
        }
    }
    if fabric_handles {
        let ready: Vec<_> = infos.iter().filter(|(_, i)| i.ready()).collect();
        match ready.first() {
            Some((_, i))
                if ready.len() == infos.len()
                    && ready.iter().all(|(_, j)| (j.cluster_uuid, j.clique_id) == (i.cluster_uuid, i.clique_id)) =>
            {
                let d = super::mnnvl_fabric::clique_domain(&i.cluster_uuid, i.clique_id);
                w.info(
                    "fabric_domain",
                    format!(
                        "\"auto\" gives {} (clique {}): peers of this clique are reached on any host",
                        d.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                        i.clique_id
                    ),
                )
            }
            _ => w.info("fabric_domain", "\"auto\" gives none: MNNVL reaches peers of this boot only".into()),
        }
    }
    if let Some(peer) = &o.peer {
        peer_probe(o, peer, mnnvl, w);
    }
}

#[cfg(feature = "cuda")]
fn nix_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The probe import against a peer: an engine of this process connects to
/// it, which runs the probe (`mnnvl_fabric`).
#[cfg(feature = "cuda")]
fn peer_probe(o: &DiagnoseOptions, peer: &str, needed: bool, w: &mut Walk) {
    let mut config = o.engine_config.clone();
    // Its findings are the peer line; its log stays quiet unless asked.
    config.entry("log_level").or_insert_with(|| "off".into());
    let mnnvl = config.entry("mnnvl").or_insert_with(|| serde_json::json!({}));
    if let Some(m) = mnnvl.as_object_mut() {
        m.insert("handle_type".into(), o.handle_type.as_str().into());
    }
    let engine = match super::Engine::from_json(&serde_json::Value::Object(config).to_string()) {
        Ok(e) => e,
        Err(e) => return w.fail_or_info(needed, "peer", Cause::DriverError, &format!("no engine to probe with: {e}")),
    };
    if let Some(why) = engine.inner.ipc_unavailable.iter().find(|(k, _)| *k == TransportKind::Mnnvl).map(|(_, w)| w) {
        let cause = cause_in(why).unwrap_or(Cause::DriverError);
        return w.fail_or_info(needed, "peer", cause, &format!("this process cannot offer MNNVL: {why}"));
    }
    let id = match engine.connect(peer, Some(o.timeout)) {
        Ok(id) => id,
        Err(e) => return w.fail_or_info(needed, "peer", Cause::DriverError, &format!("cannot connect to {peer}: {e}")),
    };
    let p = match engine.peer(id) {
        Ok(p) => p,
        Err(e) => return w.fail_or_info(needed, "peer", Cause::DriverError, e.message()),
    };
    match p.link(TransportKind::Mnnvl) {
        Ok(_) if p.conn.describe().capabilities & super::mnnvl_fabric::PROBE_CAPABILITY == 0 => w.info(
            "peer",
            format!("{peer} predates MNNVL probes: nothing was imported; MNNVL would be tried at the first transfer"),
        ),
        Ok(_) => w.ok("peer", format!("{peer}: the probe import of its MNNVL memory succeeded: MNNVL will be used")),
        Err(why) if needed => {
            let cause = cause_in(&why).unwrap_or(Cause::DriverError);
            w.checks.push(Check { layer: "peer", status: CheckStatus::Fail, cause: Some(cause.name()), text: why });
            w.failed = true;
        }
        Err(why) => w.info("peer", why),
    }
}

/// The cause named in one of the engine's refusals (`cause: what; remedy`).
#[cfg(feature = "cuda")]
fn cause_in(text: &str) -> Option<Cause> {
    Cause::ALL.into_iter().find(|c| text.contains(&format!("{}: ", c.name())))
}
