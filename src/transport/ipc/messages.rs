//! Bodies of the IPC protocol messages (see `MsgKind::IpcHello` onwards).

use crate::control::identity::{Identity, ProcessIdentity};
use crate::control::message::{self, Reader, Writer};
use crate::error::{Error, Result, Status};

/// Operation bits of an export.
pub const OP_READ: u32 = 1;
/// Operation bits of an export.
pub const OP_WRITE: u32 = 2;

/// What an export's operation bits ask of a region's remote access.
pub fn access_of(ops: u32) -> crate::memory::Access {
    let read = if ops & OP_READ != 0 { crate::memory::Access::READ.bits() } else { 0 };
    let write = if ops & OP_WRITE != 0 { crate::memory::Access::WRITE.bits() } else { 0 };
    crate::memory::Access::from_bits(read | write).expect("READ and WRITE bits only")
}

/// The operation bit of a request's direction.
pub fn op_bit(op: crate::transfer::Op) -> u32 {
    match op {
        crate::transfer::Op::Read => OP_READ,
        crate::transfer::Op::Write => OP_WRITE,
    }
}

/// Requester -> source, first message on an IPC channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The requester.
    pub identity: Identity,
    /// The source engine epoch the requester expects (from its Describe).
    pub expected_source_epoch: u64,
    /// Which IPC transport this channel carries (`TransportKind` code).
    pub transport: u32,
    /// The requester's MNNVL fabric domain (zero: none). A channel over TCP
    /// is accepted only for the source's own nonzero domain.
    pub fabric_domain: [u8; 16],
}

/// Source -> requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// The source.
    pub identity: Identity,
}

fn put_identity(w: &mut Writer, i: &Identity) {
    w.bytes(&i.boot_id).u32(i.process.pid).u64(i.process.start_time).u64(i.engine_epoch);
}

fn get_identity(r: &mut Reader<'_>) -> Result<Identity> {
    Ok(Identity {
        boot_id: r.array::<16>()?,
        process: ProcessIdentity { pid: r.u32()?, start_time: r.u64()? },
        engine_epoch: r.u64()?,
    })
}

impl Hello {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        put_identity(&mut w, &self.identity);
        w.u64(self.expected_source_epoch).u32(self.transport).bytes(&self.fabric_domain);
        w.0
    }
    /// Decodes.
    pub fn decode(b: &[u8]) -> Result<Hello> {
        let mut r = Reader::new(b, "IpcHello");
        let h = Hello {
            identity: get_identity(&mut r)?,
            expected_source_epoch: r.u64()?,
            transport: r.u32()?,
            fabric_domain: r.array::<16>()?,
        };
        r.finish()?;
        Ok(h)
    }
}

impl Welcome {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        put_identity(&mut w, &self.identity);
        w.0
    }
    /// Decodes.
    pub fn decode(b: &[u8]) -> Result<Welcome> {
        let mut r = Reader::new(b, "IpcWelcome");
        let h = Welcome { identity: get_identity(&mut r)? };
        r.finish()?;
        Ok(h)
    }
}

/// Where a GPU sits in the NVLink fabric, as one engine tells another in
/// its MNNVL probe answer: what explains an import the driver refused with
/// an opaque status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricPlace {
    /// The NVLink cluster's UUID (NVML; zero when unknown).
    pub cluster_uuid: [u8; 16],
    /// The clique within it.
    pub clique_id: u32,
    /// NVML's fabric registration state (`NVML_GPU_FABRIC_STATE_*`, 3:
    /// completed), or [`FabricPlace::UNKNOWN`] without NVML.
    pub state: u8,
    /// The IMEX channel the process may use (the lowest-numbered one it
    /// may open), -1 when none or unknown.
    pub imex_channel: i32,
}

impl FabricPlace {
    /// `state` when NVML gave none.
    pub const UNKNOWN: u8 = 0xff;
    /// Nothing known.
    pub const NONE: FabricPlace =
        FabricPlace { cluster_uuid: [0; 16], clique_id: 0, state: Self::UNKNOWN, imex_channel: -1 };
}

/// Source -> requester: the answer to `MnnvlProbe`: the source's fabric
/// place and its probe allocation's MNNVL handle (its wire form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeAnswer {
    /// The source's place in the fabric.
    pub place: FabricPlace,
    /// The probe allocation's handle (`backends::mnnvl::WireHandle` bytes).
    pub handle: Vec<u8>,
}

impl ProbeAnswer {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        let p = &self.place;
        w.bytes(&p.cluster_uuid).u32(p.clique_id).bytes(&[p.state]).u32(p.imex_channel as u32);
        w.bytes(&self.handle);
        w.0
    }

    /// Decodes (the handle is checked where it is used).
    pub fn decode(b: &[u8]) -> Result<ProbeAnswer> {
        let mut r = Reader::new(b, "MnnvlProbeAnswer");
        let place = FabricPlace {
            cluster_uuid: r.array::<16>()?,
            clique_id: r.u32()?,
            state: r.array::<1>()?[0],
            imex_channel: r.u32()? as i32,
        };
        const HEAD: usize = 16 + 4 + 1 + 4;
        Ok(ProbeAnswer { place, handle: b[HEAD..].to_vec() })
    }
}

/// Requester -> source: export the allocation behind `[addr, addr+len)`
/// (the group's envelope) for `ops`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportRequest {
    /// Requester tag echoed in the answer.
    pub tag: u64,
    /// Epoch of the region the requester knows.
    pub region_epoch: u64,
    /// Envelope start.
    pub addr: u64,
    /// Envelope length.
    pub len: u64,
    /// OP_READ | OP_WRITE.
    pub ops: u32,
    /// How long the source may wait for the allocation's loan (ms).
    pub wait_ms: u32,
}

impl ExportRequest {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.tag).u64(self.region_epoch).u64(self.addr).u64(self.len).u32(self.ops).u32(self.wait_ms);
        w.0
    }
    /// Decodes and checks.
    pub fn decode(b: &[u8]) -> Result<ExportRequest> {
        let mut r = Reader::new(b, "ExportRequest");
        let x = ExportRequest {
            tag: r.u64()?,
            region_epoch: r.u64()?,
            addr: r.u64()?,
            len: r.u64()?,
            ops: r.u32()?,
            wait_ms: r.u32()?,
        };
        r.finish()?;
        if x.len == 0 || x.ops == 0 || x.ops & !3 != 0 || x.addr.checked_add(x.len).is_none() {
            return Err(Error::Protocol(format!("malformed ExportRequest {x:?}")));
        }
        Ok(x)
    }
}

/// Source -> requester: the export is validated and retained; the handle
/// follows only after the requester's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportOffer {
    /// The request's tag.
    pub tag: u64,
    /// Export id (source-local).
    pub export_id: u64,
    /// Fresh token naming this export in every later message.
    pub token: u64,
    /// Allocation base (source address space).
    pub base: u64,
    /// Physical extent of the allocation (what the mapping covers).
    pub physical: u64,
    /// Granted range start.
    pub grant_addr: u64,
    /// Granted range length.
    pub grant_len: u64,
    /// Region epoch the grant was validated against.
    pub region_epoch: u64,
    /// Operations granted.
    pub ops: u32,
    /// The export's slot on the channel's grant board ([`NO_SLOT`]: none,
    /// every later submission takes the round trip).
    pub slot: u32,
    /// The generation the slot names the grant by.
    pub slot_generation: u64,
}

/// An offer without a grant-board slot.
pub const NO_SLOT: u32 = u32::MAX;

/// Offers one channel may leave unanswered: the source refuses an export
/// request beyond them; a requester's link keeps its threads within them.
pub const OFFERS_MAX: usize = 8;

impl ExportOffer {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.tag)
            .u64(self.export_id)
            .u64(self.token)
            .u64(self.base)
            .u64(self.physical)
            .u64(self.grant_addr)
            .u64(self.grant_len)
            .u64(self.region_epoch)
            .u32(self.ops)
            .u32(self.slot)
            .u64(self.slot_generation);
        w.0
    }
    /// Decodes.
    pub fn decode(b: &[u8]) -> Result<ExportOffer> {
        let mut r = Reader::new(b, "ExportOffer");
        let x = ExportOffer {
            tag: r.u64()?,
            export_id: r.u64()?,
            token: r.u64()?,
            base: r.u64()?,
            physical: r.u64()?,
            grant_addr: r.u64()?,
            grant_len: r.u64()?,
            region_epoch: r.u64()?,
            ops: r.u32()?,
            slot: r.u32()?,
            slot_generation: r.u64()?,
        };
        r.finish()?;
        Ok(x)
    }
}

/// A refusal: tag (or export id) + status + text.
pub fn encode_reject(tag: u64, status: Status, text: &str) -> Vec<u8> {
    let mut w = Writer::default();
    w.u64(tag).u32(status as u32).str16(message::cut_at_char(text, message::MAX_REASON));
    w.0
}

/// Decodes a refusal into its tag and error.
pub fn decode_reject(b: &[u8]) -> Result<(u64, Error)> {
    let mut r = Reader::new(b, "ExportReject");
    let tag = r.u64()?;
    let raw = r.u32()?;
    let text = r.str16()?;
    r.finish()?;
    let st = Status::from_u32(raw)
        .filter(|s| !matches!(s, Status::Ok | Status::Pending))
        .ok_or_else(|| Error::Protocol(format!("ExportReject carries status {raw}")))?;
    Ok((tag, Error::from_status(st, text)))
}

/// Messages naming one export: (export_id, token, value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportRef {
    /// Export id.
    pub export_id: u64,
    /// Its token.
    pub token: u64,
    /// Answer: 1 accept / 0 decline; OpComplete: bytes; Ack: status.
    pub value: u64,
    /// Ack: the receipt kind acknowledged; OpComplete: request count.
    pub extra: u32,
}

impl ExportRef {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.export_id).u64(self.token).u64(self.value).u32(self.extra);
        w.0
    }
    /// Decodes.
    pub fn decode(b: &[u8], what: &'static str) -> Result<ExportRef> {
        let mut r = Reader::new(b, what);
        let x = ExportRef { export_id: r.u64()?, token: r.u64()?, value: r.u64()?, extra: r.u32()? };
        r.finish()?;
        Ok(x)
    }
}

/// Requester -> source: revalidate a cached export for a new subbatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revalidate {
    /// Tag echoed.
    pub tag: u64,
    /// Export id.
    pub export_id: u64,
    /// Token.
    pub token: u64,
    /// Region epoch the requester knows.
    pub region_epoch: u64,
    /// Envelope start.
    pub addr: u64,
    /// Envelope length.
    pub len: u64,
    /// Operations.
    pub ops: u32,
}

impl Revalidate {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.tag)
            .u64(self.export_id)
            .u64(self.token)
            .u64(self.region_epoch)
            .u64(self.addr)
            .u64(self.len)
            .u32(self.ops);
        w.0
    }
    /// Decodes.
    pub fn decode(b: &[u8]) -> Result<Revalidate> {
        let mut r = Reader::new(b, "Revalidate");
        let x = Revalidate {
            tag: r.u64()?,
            export_id: r.u64()?,
            token: r.u64()?,
            region_epoch: r.u64()?,
            addr: r.u64()?,
            len: r.u64()?,
            ops: r.u32()?,
        };
        r.finish()?;
        if x.len == 0 || x.ops == 0 || x.ops & !3 != 0 || x.addr.checked_add(x.len).is_none() {
            return Err(Error::Protocol(format!("malformed Revalidate {x:?}")));
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reject_reason_is_cut_at_a_character_boundary() {
        for pad in 0..3 {
            let t = format!("{}{}", "a".repeat(pad), "\u{20ac}".repeat(400));
            let (tag, e) = decode_reject(&encode_reject(7, Status::ProtocolError, &t)).unwrap();
            assert_eq!((tag, e.status()), (7, Status::ProtocolError));
            let got = e.message();
            assert!(t.starts_with(got), "pad {pad}: {got}");
            assert!(got.len() <= message::MAX_REASON && got.len() > message::MAX_REASON - 3, "pad {pad}");
        }
    }

    #[test]
    fn messages_round_trip_and_reject_garbage() {
        let h = Hello {
            identity: Identity::fresh().unwrap(),
            expected_source_epoch: 5,
            transport: 1,
            fabric_domain: [7; 16],
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let q = ExportRequest { tag: 1, region_epoch: 2, addr: 3, len: 4, ops: 3, wait_ms: 9 };
        assert_eq!(ExportRequest::decode(&q.encode()).unwrap(), q);
        assert!(ExportRequest::decode(&ExportRequest { ops: 4, ..q }.encode()).is_err());
        assert!(ExportRequest::decode(&ExportRequest { len: 0, ..q }.encode()).is_err());
        let o = ExportOffer {
            tag: 1,
            export_id: 2,
            token: 3,
            base: 4,
            physical: 5,
            grant_addr: 6,
            grant_len: 7,
            region_epoch: 8,
            ops: 1,
            slot: 9,
            slot_generation: 10,
        };
        assert_eq!(ExportOffer::decode(&o.encode()).unwrap(), o);
        let e = ExportRef { export_id: 1, token: 2, value: 3, extra: 4 };
        assert_eq!(ExportRef::decode(&e.encode(), "x").unwrap(), e);
        let v = Revalidate { tag: 1, export_id: 2, token: 3, region_epoch: 4, addr: 5, len: 6, ops: 2 };
        assert_eq!(Revalidate::decode(&v.encode()).unwrap(), v);
        let (t, err) = decode_reject(&encode_reject(9, Status::ResourceExhausted, "full")).unwrap();
        assert_eq!((t, err.status(), err.message()), (9, Status::ResourceExhausted, "full"));
        assert!(decode_reject(&encode_reject(9, Status::Ok, "x")).is_err());
        for cut in [0, 3, 10] {
            assert!(ExportOffer::decode(&o.encode()[..cut]).is_err());
        }
    }

    /// A range asked for or revalidated may end exactly at the top of the
    /// address space; one byte further wraps and is malformed (a wrapped
    /// `addr + len` would pass the range checks after it). Guards both
    /// decoders' `x.addr.checked_add(x.len).is_none()` (sweep B).
    #[test]
    fn a_range_ending_at_the_top_of_the_address_space_decodes_and_one_past_is_malformed() {
        let top = u64::MAX - 4096;
        for (addr, ok) in [(top, true), (top + 1, false)] {
            let q = ExportRequest { tag: 1, region_epoch: 2, addr, len: 4096, ops: 3, wait_ms: 9 };
            match ExportRequest::decode(&q.encode()) {
                Ok(got) => assert!(ok && got == q, "0x{addr:x}"),
                Err(e) => assert!(!ok && e.message() == format!("malformed ExportRequest {q:?}"), "0x{addr:x}: {e}"),
            }
            let v = Revalidate { tag: 1, export_id: 2, token: 3, region_epoch: 4, addr, len: 4096, ops: 2 };
            match Revalidate::decode(&v.encode()) {
                Ok(got) => assert!(ok && got == v, "0x{addr:x}"),
                Err(e) => assert!(!ok && e.message() == format!("malformed Revalidate {v:?}"), "0x{addr:x}: {e}"),
            }
        }
    }

    #[test]
    fn a_probe_answer_round_trips_and_a_short_one_is_refused() {
        let place = FabricPlace { cluster_uuid: [3; 16], clique_id: 7, state: 3, imex_channel: -1 };
        let a = ProbeAnswer { place, handle: vec![1, 2, 3] };
        assert_eq!(ProbeAnswer::decode(&a.encode()).unwrap(), a);
        assert_eq!(ProbeAnswer::decode(&a.encode()[..25]).unwrap().handle, Vec::<u8>::new());
        assert!(ProbeAnswer::decode(&a.encode()[..24]).unwrap_err().message().contains("MnnvlProbeAnswer"));
    }
}
