//! Opening an import: ExportRequest, the offer checked by the protocol's
//! [`Opening`], the charge, Answer, Handle and the mapping. Any failure is
//! before a copy was posted.

use super::*;

impl IpcRequester {
    /// Opens an import: ExportRequest -> Offer (checked by [`Opening`]) ->
    /// charge -> Answer -> Handle -> map. Any failure is before a copy was posted.
    pub(super) fn open(&self, want: Want) -> Result<Import> {
        let Want { link, region, env, ops, local_device, deadline } = want;
        let wait_ms = deadline.saturating_duration_since(Instant::now()).as_millis().min(u32::MAX as u128) as u32;
        let mut opening = Opening::new(link.tag(), region.epoch, env, ops, wait_ms);
        // Held from the request until its offer is answered.
        let place = link.offer_place(deadline)?;
        let f = link.call(MsgKind::ExportRequest, &opening.request().encode(), deadline, "export request")?;
        let offer = match opening.offered(f.kind, &f.body, &link.label)? {
            Offered::Checked(offer) => offer,
            Offered::Declined { decline, error } => {
                let _ = link.call(MsgKind::ExportAnswer, &decline.encode(), deadline, "decline");
                return Err(error);
            }
        };
        let offer = match Faults::take(&self.faults.narrow_offer) {
            true => {
                let physical = (offer.grant_addr + offer.grant_len - offer.base).next_multiple_of(4096);
                ExportOffer { physical: physical.min(offer.physical), ..offer }
            }
            false => offer,
        };
        let charge_key = (link.endpoint.clone(), link.source.engine_epoch, offer.base);
        // Idle cached imports give their charge back for a new one.
        let close = |imp: &Import, nc: bool| self.close_import(imp, nc, deadline);
        // What an import maps counts against the budget (CMA maps nothing).
        let charged = if self.backend.maps() { offer.physical } else { 0 };
        let charge = loop {
            match self.charges.try_acquire(charge_key.clone(), charged) {
                Some(c) => break Some(c),
                None if self.cache.evict_lru_idle(&close) => continue,
                None => break None,
            }
        };
        let charge = match charge {
            Some(c) => c,
            None => {
                link.call(MsgKind::ExportAnswer, &opening.answer(false).encode(), deadline, "decline")?;
                return Err(Error::ResourceExhausted(format!(
                    "this engine's mapping budget (max_inflight_bytes = {}, {} in use) cannot hold an import of \
                     {} physical bytes (the whole remote allocation, charged once however many imports of it this \
                     engine holds); raise max_inflight_bytes on the requester above the sum of the remote \
                     allocations it imports at once",
                    self.charges.budget().limit(),
                    self.charges.budget().used(),
                    offer.physical
                )));
            }
        };
        let f = match link.call(MsgKind::ExportAnswer, &opening.answer(true).encode(), deadline, "export answer") {
            Ok(f) => f,
            Err(e) => {
                // The channel ended with the acceptance sent: the source may
                // have made the handle and sent it, and it went with the
                // channel. The export is released at the next flush.
                self.retained.lock().grants.push(LostGrant { link: link.clone(), r: opening.answer(false) });
                return Err(e);
            }
        };
        drop(place);
        // The source as the kernel named the other end of a Unix channel
        // (the link checked it when the channel opened).
        let source = matches!(link.route, super::super::link::Route::Unix(_)).then_some(link.source.process);
        let handle = ReceivedHandle { bytes: opening.handle(f.kind, &f.body)?, fd: f.fd, source };
        match self.backend.import(handle, offer.physical, offer.ops & OP_WRITE != 0, local_device) {
            Ok(mapping) => {
                self.events.opened.fetch_add(1, Ordering::Relaxed);
                let gen = link.generation();
                let board = match offer.slot {
                    super::super::messages::NO_SLOT => None,
                    i => link.board(gen).filter(|b| b.slot(i).is_some()).map(|b| (b, i)),
                };
                let slot_generation = AtomicU64::new(offer.slot_generation);
                Ok(Import {
                    link: link.clone(),
                    local_device,
                    gen,
                    offer,
                    mapping,
                    board,
                    slot_generation,
                    _charge: charge,
                    direct_users: Default::default(),
                    unmapping: Default::default(),
                })
            }
            Err(e) => {
                // Nothing was mapped: tell the source it may release.
                let _ = link.receipt(MsgKind::CloseReceipt, &opening.answer(false), deadline);
                if self.backend.refuses_for_good(&e) {
                    self.refuse(link, e.message().to_string());
                }
                Err(e)
            }
        }
    }
}
