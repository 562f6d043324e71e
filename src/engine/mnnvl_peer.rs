//! Toward each peer that advertises MNNVL, before MNNVL is used: another
//! fabric domain is refused at once (`different_clique`), otherwise a probe
//! import of the peer's probe allocation (an exchange of the IPC protocol)
//! decides. A refusal names its layer in the stats (`mnnvl_peers_refused`,
//! the notes), in the log once, and in the error of a forced MNNVL request;
//! AUTO then takes the next transport.

use super::mnnvl_fabric::{hex, refusal_text, PROBE_CAPABILITY};
use super::Inner;
use crate::control::message::Describe;
use crate::cuda::fabric_cause::Cause;
use crate::kinds::TransportKind;
use crate::transport::ipc::link::IpcLink;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Inner {
    /// On first contact with a peer that advertises MNNVL: a peer of
    /// another fabric domain is refused with its cause (its GPUs are in
    /// another clique); with a usable link, the probe import of the peer's
    /// probe decides whether MNNVL is used toward it. A refusal replaces
    /// the link by its reason, counts, and is noted (logged once).
    pub(super) fn check_mnnvl_peer(
        &self,
        peer: &Describe,
        label: &str,
        links: &mut [(TransportKind, std::result::Result<Arc<IpcLink>, String>)],
        deadline: Instant,
    ) {
        let k = TransportKind::Mnnvl;
        let Some(at) = links.iter().position(|(t, _)| *t == k) else { return };
        let offered = self.ipc_transport(k).is_some() && peer.capabilities & k.capability_bit() != 0;
        let same_process = peer.identity.same_boot(&self.identity) && peer.identity.process == self.identity.process;
        if !offered || same_process {
            return;
        }
        let (ours, theirs) = (self.fabric_domain(), peer.fabric_domain);
        if ours != theirs && ours != [0; 16] && theirs != [0; 16] {
            let what = format!(
                "{label} advertises another fabric domain ({}; this engine's is {}): their GPUs are in different \
                 NVLink cliques or clusters, so a fabric import would be refused",
                hex(&theirs),
                hex(&ours)
            );
            return self.refuse_mnnvl(label, &mut links[at], Cause::DifferentClique, &what);
        }
        let Ok(link) = links[at].1.clone() else { return };
        if peer.capabilities & PROBE_CAPABILITY == 0 {
            self.log.debug(format_args!("{label} predates MNNVL probes: MNNVL is used without a probe import"));
            return;
        }
        if let Err((cause, what)) = self.probe_peer(&link, deadline) {
            link.close();
            let what = format!("the probe import of {label}'s MNNVL memory failed: {what}");
            return self.refuse_mnnvl(label, &mut links[at], cause, &what);
        }
        self.log.debug(format_args!("{label}: MNNVL probe import succeeded"));
    }

    fn refuse_mnnvl(
        &self,
        label: &str,
        link: &mut (TransportKind, std::result::Result<Arc<IpcLink>, String>),
        cause: Cause,
        what: &str,
    ) {
        let text = format!("{label}: mnnvl is not used: {}", refusal_text(cause, what));
        self.stats.events.mnnvl_peers_refused.fetch_add(1, Ordering::Relaxed);
        self.note(text.clone());
        link.1 = Err(text);
    }

    /// Asks the peer for its probe and imports it.
    #[cfg(feature = "cuda")]
    fn probe_peer(&self, link: &Arc<IpcLink>, deadline: Instant) -> std::result::Result<(), (Cause, String)> {
        use super::mnnvl_fabric::place_text;
        use crate::control::frame::MsgKind;
        use crate::transport::ipc::messages::{decode_reject, FabricPlace, ProbeAnswer};
        let f = link
            .call(MsgKind::MnnvlProbe, &[], deadline, "MNNVL probe")
            .map_err(|e| (Cause::DriverError, format!("the probe exchange failed: {e}")))?;
        let answer = match f.kind {
            MsgKind::MnnvlProbeAnswer => {
                ProbeAnswer::decode(&f.body).map_err(|e| (Cause::DriverError, e.to_string()))?
            }
            MsgKind::ExportReject => {
                let e = decode_reject(&f.body).map_err(|e| (Cause::DriverError, e.to_string()))?.1;
                return Err((Cause::DriverError, format!("the peer refused the probe: {e}")));
            }
            other => return Err((Cause::DriverError, format!("the peer answered the probe with {other:?}"))),
        };
        let ours = self.fabric.place.unwrap_or(FabricPlace::NONE);
        super::mnnvl_fabric::import_probe(&answer, f.fd.as_ref(), &ours).map_err(|(cause, what)| {
            (cause, format!("{what} (its GPU: {}; this engine's: {})", place_text(&answer.place), place_text(&ours)))
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn probe_peer(&self, _link: &Arc<IpcLink>, _deadline: Instant) -> std::result::Result<(), (Cause, String)> {
        Err((Cause::NoDriver, crate::cuda::NO_CUDA.into()))
    }
}
