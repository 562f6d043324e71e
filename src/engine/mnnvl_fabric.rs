//! MNNVL that works the first time, at engine start: the fabric domain
//! from the GPUs' NVLink clique (`fabric_domain: "auto"`, NVML), what NVML
//! says of the GPUs' fabric registration, and a real allocation and export
//! with the configured handle type, before MNNVL is advertised; the probe
//! allocation's answer to peers' probes; and how a refused probe import is
//! explained ([`import_cause`]). `mnnvl_peer.rs` runs the probe toward each
//! peer. Each negative answer names its layer ([`Cause`]).

use super::config::{EngineConfig, FabricDomain};
use crate::cuda::fabric_cause::Cause;
use crate::transport::ipc::messages::FabricPlace;
use crate::transport::ipc::source::ProbeSource;

/// Describe capability bit: this engine answers `MnnvlProbe` on its MNNVL
/// channels (a peer without it predates the probe: no probe is sent to it).
pub(crate) const PROBE_CAPABILITY: u32 = 1 << 12;

/// What an engine found about MNNVL at its start.
#[derive(Default)]
pub(crate) struct FabricSetup {
    /// This engine's place in the fabric, told to peers in probe answers.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) place: Option<FabricPlace>,
    /// Why MNNVL cannot be offered (the cause first), when this start
    /// found out.
    pub(crate) refusal: Option<String>,
    /// Findings for the stats' notes (logged at WARN once).
    pub(crate) notes: Vec<String>,
    /// The fabric domain's origin in words (logged at INFO).
    pub(crate) domain_from: Option<String>,
    /// The probe allocation's answer to peers' probes.
    pub(crate) probe: Option<ProbeSource>,
}

/// `cause: what happened; what to do`.
pub(crate) fn refusal_text(cause: Cause, what: &str) -> String {
    format!("{}: {what}; {}", cause.name(), cause.remedy())
}

/// The fabric domain of a clique: a digest of the NVLink cluster's UUID
/// and the clique id (never all zero).
// Without CUDA nothing probes: the fabric's helpers stand unused.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn clique_domain(cluster: &[u8; 16], clique: u32) -> [u8; 16] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"orbite fabric domain v1");
    h.update(cluster);
    h.update(clique.to_le_bytes());
    let mut d = [0u8; 16];
    d.copy_from_slice(&h.finalize()[..16]);
    if d == [0; 16] {
        d[15] = 1;
    }
    d
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// A place in words.
// Without CUDA nothing probes: the fabric's helpers stand unused.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn place_text(p: &FabricPlace) -> String {
    let state = match p.state {
        FabricPlace::UNKNOWN => "unknown (no NVML)".to_string(),
        0 => "not supported".into(),
        1 => "not started".into(),
        2 => "in progress".into(),
        3 => "completed".into(),
        o => format!("unknown ({o})"),
    };
    let channel = if p.imex_channel >= 0 { format!("channel{}", p.imex_channel) } else { "none seen".into() };
    if p.state == 3 {
        format!("cluster {} clique {}, fabric state {state}, IMEX {channel}", hex(&p.cluster_uuid), p.clique_id)
    } else {
        format!("fabric state {state}, IMEX {channel}")
    }
}

/// Why the import of a peer's probe failed, from the driver's answer and
/// the two places: the driver's refusal of a fabric import is opaque
/// ("invalid resource handle" for every IMEX-domain reason), so the places
/// tell the layer.
// Without CUDA nothing probes: the fabric's helpers stand unused.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn import_cause(code: Option<i32>, ours: &FabricPlace, theirs: &FabricPlace) -> Cause {
    use crate::cuda::fabric_cause::cu;
    match code {
        Some(cu::NOT_PERMITTED) if ours.imex_channel < 0 => Cause::NoImexChannel,
        Some(cu::NOT_PERMITTED) => Cause::ImexChannelDenied,
        Some(cu::NOT_SUPPORTED) => Cause::FabricNotSupported,
        None => Cause::DriverError,
        Some(_) => {
            let known = |p: &FabricPlace| p.state != FabricPlace::UNKNOWN;
            if [ours, theirs].iter().any(|p| known(p) && p.state != 3) {
                Cause::DaemonNotReady
            } else if known(ours)
                && known(theirs)
                && (ours.cluster_uuid, ours.clique_id) != (theirs.cluster_uuid, theirs.clique_id)
            {
                Cause::DifferentClique
            } else if ours.imex_channel >= 0 && ours.imex_channel == theirs.imex_channel {
                // One clique, one channel: the daemons do not join the nodes.
                Cause::DaemonNotReady
            } else {
                Cause::ChannelNotShared
            }
        }
    }
}

#[cfg(feature = "cuda")]
mod start {
    use super::*;
    use crate::cuda::fabric::{self, HandleType, ProbeAllocation, ProbeHandle};
    use crate::cuda::{driver, fabric_cause, imex, nvml};
    use crate::engine::config::MnnvlHandleType;
    use crate::transport::ipc::backends::mnnvl::{HandleBody, WireHandle};
    use crate::transport::ipc::messages::ProbeAnswer;
    use std::sync::Arc;

    /// The GPU the probes run on: the first visible one.
    pub(crate) const PROBE_DEVICE: i32 = 0;

    /// The visible GPUs' fabric information, by ordinal (mapped to NVML by
    /// UUID), or why NVML cannot say.
    pub(crate) fn visible_fabric() -> Result<Vec<(i32, nvml::FabricInfo)>, String> {
        let n = nvml::nvml()?;
        let devices = driver::driver().map_err(|e| e.message().to_string())?.devices;
        (0..devices)
            .map(|d| {
                let info = match driver::device_uuid(d) {
                    Some(u) => n.fabric_by_uuid(&u),
                    None => n.fabric_by_index(d as u32),
                };
                info.map(|i| (d, i))
            })
            .collect()
    }

    /// This process's place, from the first visible GPU's information.
    pub(crate) fn place_of(infos: &[(i32, nvml::FabricInfo)]) -> FabricPlace {
        let channel = imex::usable_channel(std::path::Path::new(imex::CHANNEL_DIR)).map_or(-1, |c| c as i32);
        match infos.first() {
            Some((_, i)) => FabricPlace {
                cluster_uuid: i.cluster_uuid,
                clique_id: i.clique_id,
                state: i.state.raw(),
                imex_channel: channel,
            },
            None => FabricPlace { imex_channel: channel, ..FabricPlace::NONE },
        }
    }

    /// The cause of a failed probe allocation or export here.
    pub(crate) fn local_cause(code: Option<i32>) -> Cause {
        let Some(code) = code else { return Cause::DriverError };
        let channels = imex::channels(std::path::Path::new(imex::CHANNEL_DIR)).unwrap_or_default();
        fabric_cause::of_local_refusal(code, !channels.is_empty(), channels.iter().any(|c| c.usable))
    }

    impl FabricSetup {
        /// Resolves `fabric_domain: "auto"` in `config` and decides, before
        /// MNNVL is advertised, whether it can work here.
        pub(crate) fn start(config: &mut EngineConfig) -> FabricSetup {
            let mut s = FabricSetup::default();
            let Some(m) = config.mnnvl.as_mut() else { return s };
            let auto = m.fabric_domain == FabricDomain::Auto;
            if auto {
                m.fabric_domain = FabricDomain::ThisBoot;
            }
            if crate::cuda::ready().is_err() || fabric::fabric_ready().is_err() {
                // The transport says why it is not offered.
                return s;
            }
            let fabric_handles = m.handle_type == MnnvlHandleType::Fabric;
            let infos = match visible_fabric() {
                Ok(i) => i,
                Err(why) => {
                    if auto && fabric_handles {
                        s.notes.push(format!(
                            "mnnvl fabric_domain \"auto\": {why}; MNNVL reaches peers of this boot only (set \
                             mnnvl.fabric_domain to the same 32 hexadecimal digits on every host of the NVLink \
                             partition to reach other hosts)"
                        ));
                    }
                    Vec::new()
                }
            };
            let place = place_of(&infos);
            s.place = Some(place);
            if fabric_handles {
                if let Some((d, i)) = infos.iter().find(|(_, i)| i.state == nvml::FabricState::NotSupported) {
                    s.refusal = Some(refusal_text(
                        Cause::FabricNotSupported,
                        &format!("GPU {d} has no NVLink fabric (NVML fabric state: {})", i.state.name()),
                    ));
                    return s;
                }
                if let Some((d, i)) = infos.iter().find(|(_, i)| !i.ready()) {
                    s.refusal = Some(refusal_text(
                        Cause::DaemonNotReady,
                        &format!("GPU {d}'s fabric registration is {} (status: {})", i.state.name(), i.status_text),
                    ));
                    return s;
                }
                if auto && !infos.is_empty() {
                    let (c, q) = (infos[0].1.cluster_uuid, infos[0].1.clique_id);
                    if infos.iter().all(|(_, i)| (i.cluster_uuid, i.clique_id) == (c, q)) {
                        m.fabric_domain = FabricDomain::Fixed(clique_domain(&c, q));
                        s.domain_from = Some(format!(
                            "fabric domain {} from NVML (cluster {}, clique {q})",
                            hex(&clique_domain(&c, q)),
                            hex(&c)
                        ));
                    } else {
                        s.notes.push(
                            "mnnvl fabric_domain \"auto\": the visible GPUs are in different NVLink cliques; MNNVL \
                             reaches peers of this boot only (make one clique visible, or set mnnvl.fabric_domain)"
                                .into(),
                        );
                    }
                }
            }
            let ty = if fabric_handles { HandleType::Fabric } else { HandleType::PosixFd };
            match ProbeAllocation::new(PROBE_DEVICE, ty) {
                Ok(p) => s.probe = Some(answer_with(Arc::new(p), place)),
                Err(f) => {
                    s.refusal = Some(refusal_text(
                        local_cause(f.code),
                        &format!(
                            "a {} probe allocation on GPU {PROBE_DEVICE} failed: {}",
                            m.handle_type.as_str(),
                            f.error.message()
                        ),
                    ))
                }
            }
            s
        }
    }

    /// The answer to peers' probes: `place` and `probe`'s handle.
    fn answer_with(probe: Arc<ProbeAllocation>, place: FabricPlace) -> ProbeSource {
        Arc::new(move || {
            let (body, fd) = match probe.handle()? {
                ProbeHandle::Fabric(h) => (HandleBody::Fabric(h), None),
                ProbeHandle::PosixFd(fd) => (HandleBody::PosixFd { pid: std::process::id() }, Some(fd)),
            };
            let w = WireHandle { physical: probe.physical(), granularity: probe.granularity(), body };
            Ok((ProbeAnswer { place, handle: w.encode() }.encode(), fd))
        })
    }

    /// Imports the probe of a peer's answer on the probe GPU: `Ok`, or the
    /// cause and what happened.
    pub(crate) fn import_probe(
        answer: &ProbeAnswer,
        fd: Option<&std::os::fd::OwnedFd>,
        ours: &FabricPlace,
    ) -> Result<(), (Cause, String)> {
        let w = WireHandle::decode(&answer.handle).map_err(|e| (Cause::DriverError, e.message().to_string()))?;
        let received = match &w.body {
            HandleBody::Fabric(h) => fabric::Received::Fabric(h),
            HandleBody::PosixFd { .. } => fabric::Received::PosixFd(
                fd.ok_or((Cause::DriverError, "a POSIX-fd probe answer came without its descriptor".to_string()))?,
            ),
        };
        fabric::probe_import(received, PROBE_DEVICE)
            .map_err(|f| (import_cause(f.code, ours, &answer.place), format!("{}: {}", f.step, f.error.message())))
    }
}

#[cfg(not(feature = "cuda"))]
impl FabricSetup {
    /// Without CUDA there is no fabric: "auto" means this boot (MNNVL is
    /// not offered at all, for the transport's own reason).
    pub(crate) fn start(config: &mut EngineConfig) -> FabricSetup {
        if let Some(m) = config.mnnvl.as_mut().filter(|m| m.fabric_domain == FabricDomain::Auto) {
            m.fabric_domain = FabricDomain::ThisBoot;
        }
        FabricSetup::default()
    }
}

#[cfg(feature = "cuda")]
pub(crate) use start::{import_probe, visible_fabric};

#[cfg(test)]
mod tests {
    use super::*;

    fn place(clique: u32, state: u8, channel: i32) -> FabricPlace {
        FabricPlace { cluster_uuid: [1; 16], clique_id: clique, state, imex_channel: channel }
    }

    /// Guards `import_cause`: each opaque refusal is named by the places.
    #[test]
    fn an_opaque_import_refusal_is_named_by_the_two_places() {
        let u = FabricPlace::UNKNOWN;
        let opaque = Some(400);
        assert_eq!(import_cause(opaque, &place(1, 3, 0), &place(2, 3, 0)), Cause::DifferentClique);
        assert_eq!(import_cause(opaque, &place(1, 3, 0), &place(1, 2, 1)), Cause::DaemonNotReady);
        assert_eq!(import_cause(opaque, &place(1, 1, -1), &place(1, u, -1)), Cause::DaemonNotReady);
        assert_eq!(import_cause(opaque, &place(1, 3, 0), &place(1, 3, 0)), Cause::DaemonNotReady);
        assert_eq!(import_cause(opaque, &place(1, 3, 0), &place(1, 3, 1)), Cause::ChannelNotShared);
        assert_eq!(import_cause(opaque, &place(1, u, -1), &place(1, u, -1)), Cause::ChannelNotShared);
        assert_eq!(import_cause(Some(800), &place(1, 3, -1), &place(1, 3, 0)), Cause::NoImexChannel);
        assert_eq!(import_cause(Some(800), &place(1, 3, 2), &place(1, 3, 0)), Cause::ImexChannelDenied);
        assert_eq!(import_cause(None, &place(1, 3, 0), &place(2, 3, 0)), Cause::DriverError);
    }

    #[test]
    fn a_clique_domain_depends_on_cluster_and_clique() {
        let a = clique_domain(&[1; 16], 7);
        assert_ne!(a, clique_domain(&[1; 16], 8));
        assert_ne!(a, clique_domain(&[2; 16], 7));
        assert_eq!(a, clique_domain(&[1; 16], 7));
        assert_ne!(a, [0; 16]);
    }
}
