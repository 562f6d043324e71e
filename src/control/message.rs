//! Message bodies. Control messages are decoded whole; data messages
//! (READ/WRITE) have a fixed part decoded here and a payload streamed
//! straight to or from registered memory by the transport.

use super::identity::{Identity, ProcessIdentity};
use crate::error::{Error, Result, Status};
use crate::memory::{Access, MemoryKind, Region};

/// Bytes of the fixed part of Read/WriteRequest.
pub const DATA_REQUEST_LEN: usize = 32;
/// Bytes of the fixed part of Read/WriteResponse.
pub const DATA_RESPONSE_LEN: usize = 16;
/// Longest failure text carried in a response.
pub const MAX_REASON: usize = 1024;
/// Most regions one Describe may publish (an engine refuses to register
/// more published regions than this).
pub const MAX_REGIONS: usize = crate::memory::region::MAX_PUBLISHED_REGIONS;

/// A published region as the peer describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    /// The peer's region id.
    pub id: u64,
    /// Registration epoch.
    pub epoch: u64,
    /// First byte (peer address space).
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// What we may do.
    pub access: Access,
    /// Kind of memory.
    pub kind: MemoryKind,
}

impl RegionInfo {
    /// The descriptor this engine publishes for one of its registrations.
    pub fn of(r: &Region) -> RegionInfo {
        RegionInfo { id: r.id, epoch: r.epoch, addr: r.addr, len: r.len, access: r.access, kind: r.kind }
    }

    /// Whether `[addr, addr+len)` lies inside.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|e| e <= self.addr + self.len)
    }

    /// The descriptor as JSON (`orbite_peer_regions_json`): `id`, `epoch`,
    /// `addr`, `length`, `access` (array of "read"/"write") and `kind`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id, "epoch": self.epoch, "addr": self.addr, "length": self.len,
            "access": self.access.names(), "kind": self.kind.name(),
        })
    }

    /// Descriptors as a JSON array.
    pub fn list_json(regions: &[RegionInfo]) -> String {
        serde_json::Value::Array(regions.iter().map(RegionInfo::to_json).collect()).to_string()
    }
}

/// The Describe message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Describe {
    /// Who sent it.
    pub identity: Identity,
    /// Transport capability bits (`TransportKind::capability_bit`).
    pub capabilities: u32,
    /// MNNVL fabric domain (all zero: none).
    pub fabric_domain: [u8; 16],
    /// The sender's listening endpoint.
    pub endpoint: String,
    /// Name of the sender's IPC channel (abstract Unix socket), empty if none.
    pub ipc_name: String,
    /// Published regions.
    pub regions: Vec<RegionInfo>,
}

/// Little-endian body writer.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// Appends a u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    /// Appends a u16-length-prefixed string.
    pub fn str16(&mut self, s: &str) -> &mut Self {
        let b = cut_at_char(s, u16::MAX as usize).as_bytes();
        self.u16(b.len() as u16).bytes(b)
    }
}

/// Little-endian body reader; running out of bytes is a protocol error.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Reads `buf`, naming `what` in errors.
    pub fn new(buf: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { buf, pos: 0, what }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() - self.pos < n {
            return Err(Error::Protocol(format!(
                "{} body truncated: needed {} more bytes at offset {}",
                self.what, n, self.pos
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    /// Reads a u16.
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    /// Reads a u32.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    /// Reads a u64.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// Reads `N` raw bytes.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    /// Reads a u16-length-prefixed UTF-8 string.
    pub fn str16(&mut self) -> Result<String> {
        let n = self.u16()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::Protocol(format!("{}: string is not UTF-8", self.what)))
    }
    /// The unread rest.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<()> {
        if self.pos != self.buf.len() {
            return Err(Error::Protocol(format!(
                "{} body has {} trailing bytes",
                self.what,
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

impl Describe {
    /// A Describe that offers nothing: no transport beyond what the
    /// capability bits say (none), no endpoint, no region.
    pub fn bare(identity: Identity) -> Describe {
        Describe {
            identity,
            capabilities: 0,
            fabric_domain: [0; 16],
            endpoint: String::new(),
            ipc_name: String::new(),
            regions: Vec::new(),
        }
    }

    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes(&self.identity.boot_id)
            .u32(self.identity.process.pid)
            .u64(self.identity.process.start_time)
            .u64(self.identity.engine_epoch)
            .u32(self.capabilities)
            .bytes(&self.fabric_domain)
            .str16(&self.endpoint)
            .str16(&self.ipc_name)
            .u32(self.regions.len() as u32);
        for r in &self.regions {
            w.u64(r.id).u64(r.epoch).u64(r.addr).u64(r.len).u32(r.access.bits()).u32(r.kind.code());
        }
        w.0
    }

    /// Decodes and validates the body.
    pub fn decode(body: &[u8]) -> Result<Describe> {
        let mut r = Reader::new(body, "Describe");
        let boot_id = r.array::<16>()?;
        let pid = r.u32()?;
        let start_time = r.u64()?;
        let engine_epoch = r.u64()?;
        let capabilities = r.u32()?;
        let fabric_domain = r.array::<16>()?;
        let endpoint = r.str16()?;
        let ipc_name = r.str16()?;
        let n = r.u32()? as usize;
        if n > MAX_REGIONS {
            return Err(Error::Protocol(format!("Describe publishes {n} regions (limit {MAX_REGIONS})")));
        }
        let mut regions = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.u64()?;
            let epoch = r.u64()?;
            let addr = r.u64()?;
            let len = r.u64()?;
            let access = Access::from_bits(r.u32()?)
                .ok_or_else(|| Error::Protocol("Describe region has unknown access bits".into()))?;
            let kind = MemoryKind::from_code(r.u32()?)
                .ok_or_else(|| Error::Protocol("Describe region has unknown memory kind".into()))?;
            if id == 0 || len == 0 || addr.checked_add(len).is_none() {
                return Err(Error::Protocol(format!("Describe region id {id} at 0x{addr:x}+{len} is malformed")));
            }
            regions.push(RegionInfo { id, epoch, addr, len, access, kind });
        }
        r.finish()?;
        if engine_epoch == 0 {
            return Err(Error::Protocol("Describe carries engine epoch 0".into()));
        }
        check_endpoint(&endpoint)?;
        check_ipc_name(&ipc_name)?;
        Ok(Describe {
            identity: Identity { boot_id, process: ProcessIdentity { pid, start_time }, engine_epoch },
            capabilities,
            fabric_domain,
            endpoint,
            ipc_name,
            regions,
        })
    }
}

/// The longest endpoint a Describe may carry ("[v6 address%scope]:port"
/// fits): a notification's sender named by its endpoint stays within the
/// 128 bytes the C API promises.
pub const MAX_ENDPOINT: usize = 64;
/// The longest IPC socket name (an abstract Unix socket name has at most
/// 107 bytes).
pub const MAX_IPC_NAME: usize = 107;

/// At most the first 48 characters of a text a peer sent, for a message.
fn shown(text: &str) -> String {
    let head: String = text.chars().take(48).collect();
    if head.len() < text.len() {
        format!("{head:?}... ({} bytes)", text.len())
    } else {
        format!("{head:?}")
    }
}

/// A Describe's endpoint is empty (none) or IP:port of at most
/// [`MAX_ENDPOINT`] bytes: it names an unnamed notification sender, so it
/// may hold nothing else (no NUL, no other name).
fn check_endpoint(endpoint: &str) -> Result<()> {
    if endpoint.is_empty() || (endpoint.len() <= MAX_ENDPOINT && endpoint.parse::<std::net::SocketAddr>().is_ok()) {
        return Ok(());
    }
    Err(Error::Protocol(format!(
        "Describe endpoint {} is not IP:port of at most {MAX_ENDPOINT} bytes",
        shown(endpoint)
    )))
}

/// A Describe's IPC socket name is empty (none) or printable ASCII of at
/// most [`MAX_IPC_NAME`] bytes.
fn check_ipc_name(name: &str) -> Result<()> {
    if name.len() <= MAX_IPC_NAME && name.bytes().all(|b| b.is_ascii_graphic()) {
        return Ok(());
    }
    Err(Error::Protocol(format!(
        "Describe IPC name {} is not printable ASCII of at most {MAX_IPC_NAME} bytes",
        shown(name)
    )))
}

/// Fixed part of a READ or WRITE request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRequest {
    /// Requester-chosen tag, echoed in the response.
    pub tag: u64,
    /// Epoch of the region the requester believes holds `addr`.
    pub region_epoch: u64,
    /// Absolute address in the source's address space.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

impl DataRequest {
    /// Encodes the fixed part.
    pub fn encode(&self) -> [u8; DATA_REQUEST_LEN] {
        let mut b = [0u8; DATA_REQUEST_LEN];
        b[0..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..16].copy_from_slice(&self.region_epoch.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    /// Decodes the fixed part.
    pub fn decode(b: &[u8; DATA_REQUEST_LEN]) -> Result<DataRequest> {
        let mut r = Reader::new(b, "data request");
        let d = DataRequest { tag: r.u64()?, region_epoch: r.u64()?, addr: r.u64()?, len: r.u64()? };
        if d.len == 0 || d.len > super::frame::MAX_PAYLOAD {
            return Err(Error::Protocol(format!("data request length {} is invalid", d.len)));
        }
        Ok(d)
    }
}

/// Fixed part of a READ or WRITE response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataResponse {
    /// The request's tag.
    pub tag: u64,
    /// Outcome.
    pub status: Status,
}

impl DataResponse {
    /// Encodes the fixed part.
    pub fn encode(&self) -> [u8; DATA_RESPONSE_LEN] {
        let mut b = [0u8; DATA_RESPONSE_LEN];
        b[0..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..12].copy_from_slice(&(self.status as u32).to_le_bytes());
        b
    }
    /// Decodes the fixed part.
    pub fn decode(b: &[u8; DATA_RESPONSE_LEN]) -> Result<DataResponse> {
        let tag = u64::from_le_bytes(b[0..8].try_into().expect("8"));
        let raw = u32::from_le_bytes(b[8..12].try_into().expect("4"));
        let status = Status::from_u32(raw)
            .filter(|s| *s != Status::Pending)
            .ok_or_else(|| Error::Protocol(format!("response carries unknown status {raw}")))?;
        if b[12..16] != [0, 0, 0, 0] {
            return Err(Error::Protocol("response reserved field is not 0".into()));
        }
        Ok(DataResponse { tag, status })
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary: how a reason or a name is cut to its wire bound
/// (slicing a `str` inside a character panics, and a peer chooses the
/// characters of the text it makes us quote back).
pub fn cut_at_char(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Encodes an Error message body.
pub fn encode_error(status: Status, text: &str) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(status as u32).str16(cut_at_char(text, MAX_REASON));
    w.0
}

/// Decodes an Error message body.
pub fn decode_error(body: &[u8]) -> Result<(Status, String)> {
    let mut r = Reader::new(body, "Error");
    let raw = r.u32()?;
    let text = r.str16()?;
    r.finish()?;
    Ok((Status::from_u32(raw).unwrap_or(Status::ProtocolError), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A text of `pad` ASCII bytes, then `n` three-byte characters: one of
    /// pads 0, 1, 2 puts any bound inside a character.
    fn euros(pad: usize, n: usize) -> String {
        format!("{}{}", "a".repeat(pad), "\u{20ac}".repeat(n))
    }

    #[test]
    fn reasons_and_strings_are_cut_at_a_character_boundary() {
        for pad in 0..3 {
            let t = euros(pad, 400);
            let (st, got) = decode_error(&encode_error(Status::ProtocolError, &t)).unwrap();
            assert_eq!(st, Status::ProtocolError);
            assert!(t.starts_with(&got), "pad {pad}");
            assert!(got.len() <= MAX_REASON && got.len() > MAX_REASON - 3, "pad {pad}: {} bytes", got.len());
            let long = euros(pad, 22_000);
            let mut w = Writer::default();
            w.str16(&long);
            let got = Reader::new(&w.0, "str16").str16().unwrap();
            assert!(long.starts_with(&got), "pad {pad}");
            assert!(got.len() > u16::MAX as usize - 3, "pad {pad}: {} bytes", got.len());
        }
        assert_eq!(cut_at_char("ab", 5), "ab");
        assert_eq!(cut_at_char("a\u{20ac}", 3), "a");
        assert_eq!(cut_at_char("\u{20ac}", 0), "");
    }

    fn sample() -> Describe {
        Describe {
            identity: Identity::fresh().unwrap(),
            capabilities: 3,
            fabric_domain: [0; 16],
            endpoint: "127.0.0.1:5".into(),
            ipc_name: "orbite-1".into(),
            regions: vec![RegionInfo {
                id: 1,
                epoch: 1,
                addr: 0x1000,
                len: 10,
                access: Access::READ_WRITE,
                kind: MemoryKind::SharedHost,
            }],
        }
    }

    #[test]
    fn describe_round_trip_and_truncation() {
        let d = sample();
        let b = d.encode();
        assert_eq!(Describe::decode(&b).unwrap(), d);
        for cut in 0..b.len() {
            assert!(matches!(Describe::decode(&b[..cut]), Err(Error::Protocol(_))), "cut {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(matches!(Describe::decode(&long), Err(Error::Protocol(m)) if m.contains("trailing")));
    }

    /// Only IP:port within 64 bytes (or nothing) names a peer; a long,
    /// NUL-carrying or non-address endpoint, and an IPC name that is not
    /// short printable ASCII, are refused before anything uses them.
    #[test]
    fn a_describe_names_itself_only_by_a_checked_endpoint() {
        for ok in ["", "127.0.0.1:5", "[::1]:65535", "[fe80::1234:5678:9abc:def0%4294967295]:65535"] {
            let d = Describe { endpoint: ok.into(), ..sample() };
            assert_eq!(Describe::decode(&d.encode()).unwrap().endpoint, ok);
        }
        let long = format!("127.0.0.1:5{}", "0".repeat(65_000));
        for bad in ["127.0.0.1:5\0ceo", "node-a", "127.0.0.1", long.as_str()] {
            let d = Describe { endpoint: bad.into(), ..sample() };
            let e = Describe::decode(&d.encode()).unwrap_err();
            assert!(matches!(&e, Error::Protocol(m) if m.contains("endpoint") && m.len() < 200), "{bad:?}: {e}");
        }
        for bad in ["with space".to_string(), "x".repeat(108), "nul\0".into()] {
            let d = Describe { ipc_name: bad.clone(), ..sample() };
            assert!(
                matches!(Describe::decode(&d.encode()), Err(Error::Protocol(m)) if m.contains("IPC name")),
                "{bad:?}"
            );
        }
    }

    /// A region's end must fit the address space: one that wraps
    /// (0xffff_ffff_ffff_f000 + 0x2000) is refused as malformed, since
    /// `RegionInfo::contains` adds `addr + len`. Guards `decode`'s
    /// `addr.checked_add(len).is_none()`; the region ending at the very
    /// top (2^64 - 1) still loads.
    #[test]
    fn a_describe_region_that_wraps_the_address_space_is_malformed() {
        let region = |addr: u64, len: u64| Describe {
            regions: vec![RegionInfo { addr, len, ..sample().regions[0] }],
            ..sample()
        };
        let e = Describe::decode(&region(0xffff_ffff_ffff_f000, 0x2000).encode()).unwrap_err();
        assert!(
            matches!(&e, Error::Protocol(m) if m.contains("malformed") && m.contains("0xfffffffffffff000+8192")),
            "{e}"
        );
        let top = region(0xffff_ffff_ffff_f000, 0xfff);
        assert_eq!(Describe::decode(&top.encode()).unwrap(), top);
    }

    /// Guards `id == 0 ||` in `Describe::decode`: a lying peer's region
    /// of id 0 (an id the library never gives) is malformed; id 1 loads.
    #[test]
    fn a_describe_region_of_id_zero_is_malformed() {
        let region = |id: u64| Describe { regions: vec![RegionInfo { id, ..sample().regions[0] }], ..sample() };
        let e = Describe::decode(&region(0).encode()).unwrap_err();
        assert!(matches!(&e, Error::Protocol(m) if m.contains("region id 0 at 0x1000+10 is malformed")), "{e}");
        let one = region(1);
        assert_eq!(Describe::decode(&one.encode()).unwrap(), one);
    }

    #[test]
    fn data_messages_round_trip() {
        let q = DataRequest { tag: 9, region_epoch: 2, addr: 3, len: 4 };
        assert_eq!(DataRequest::decode(&q.encode()).unwrap(), q);
        let z = DataRequest { len: 0, ..q };
        assert!(DataRequest::decode(&z.encode()).is_err());
        let p = DataResponse { tag: 7, status: Status::OutOfRange };
        assert_eq!(DataResponse::decode(&p.encode()).unwrap(), p);
        let mut bad = p.encode();
        bad[8] = 200;
        assert!(DataResponse::decode(&bad).is_err());
        let e = encode_error(Status::ProtocolError, "bad");
        assert_eq!(decode_error(&e).unwrap(), (Status::ProtocolError, "bad".to_string()));
    }

    /// An endpoint of exactly MAX_ENDPOINT bytes (a valid IP:port, its
    /// port zero-padded) and an IPC name of exactly MAX_IPC_NAME bytes
    /// load whole (one byte more of either is refused: above and in
    /// `tests/hostile_sources.rs`). Guards `endpoint.len() <=
    /// MAX_ENDPOINT` and `name.len() <= MAX_IPC_NAME` (sweep B).
    #[test]
    fn a_describe_endpoint_and_ipc_name_of_exactly_their_bound_load() {
        let endpoint = format!("127.0.0.1:{:0>width$}", 5, width = MAX_ENDPOINT - 10);
        assert_eq!(endpoint.len(), MAX_ENDPOINT);
        let d = Describe { endpoint, ipc_name: "n".repeat(MAX_IPC_NAME), ..sample() };
        assert_eq!(Describe::decode(&d.encode()).unwrap(), d);
    }

    /// A data request of exactly MAX_PAYLOAD bytes decodes; one byte more
    /// is refused naming its length. Guards `DataRequest::decode`'s
    /// `d.len > super::frame::MAX_PAYLOAD` (sweep B).
    #[test]
    fn a_data_request_of_exactly_max_payload_decodes_and_one_byte_more_is_refused() {
        let most = super::super::frame::MAX_PAYLOAD;
        let q = DataRequest { tag: 1, region_epoch: 2, addr: 0x1000, len: most };
        assert_eq!(DataRequest::decode(&q.encode()).unwrap(), q);
        let e = DataRequest::decode(&DataRequest { len: most + 1, ..q }.encode()).unwrap_err();
        assert!(
            matches!(&e, Error::Protocol(m) if *m == format!("data request length {} is invalid", most + 1)),
            "{e}"
        );
    }

    /// A peer's region [0x1000, 0x100a) holds its first and last byte
    /// and the whole of itself, never a byte before or after it, and no
    /// range whose end wraps. Guards `RegionInfo::contains`'s `addr >=
    /// self.addr` and `e <= self.addr + self.len` (sweep B).
    #[test]
    fn a_peer_region_holds_exactly_its_own_bytes() {
        let r = sample().regions[0];
        let cases = [
            ("the whole region", 0x1000, 10, true),
            ("its first byte", 0x1000, 1, true),
            ("its last byte", 0x1009, 1, true),
            ("one byte more than the region", 0x1000, 11, false),
            ("the byte before it", 0xfff, 1, false),
            ("the byte before it and the region", 0xfff, 11, false),
            ("the byte after it", 0x100a, 1, false),
            ("a range that wraps", 0x1005, u64::MAX, false),
        ];
        for (case, addr, len, held) in cases {
            assert_eq!(r.contains(addr, len), held, "{case}: 0x{addr:x}+{len}");
        }
    }
}
