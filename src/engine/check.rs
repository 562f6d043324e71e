//! A submission's entry checks, shared with the direct routes: the
//! engine open, the count of requests, each request's length and local
//! region (leased once per region per submission).

use super::Engine;
use crate::error::{Error, Result};
use crate::memory::rank::Ranks;
use crate::memory::RegionLease;
use crate::transfer::{Request, MAX_REQUESTS};
use std::sync::Arc;
use std::time::Instant;

/// A submission's local leases by their regions' start addresses (the
/// registry refuses overlapping regions, so the last region starting at or
/// before an address is the only one that may hold it). Lookups go through
/// an index ([`Ranks`]) of the leases taken when it was last built, then
/// through all of them by binary search; the index is rebuilt once more
/// lookups have needed the second step than there are leases (or 64).
#[derive(Default)]
struct LeasesByAddr {
    /// Every lease so far: (start, lease), by start.
    all: Vec<(u64, u32)>,
    /// The index: the leases when it was built, (start, lease) by start,
    /// and the buckets over their starts.
    indexed: Vec<(u64, u32)>,
    ranks: Ranks,
    /// Lookups the index missed since it was built.
    stale: usize,
}

impl LeasesByAddr {
    /// The lease whose region `holds`, among those that may hold `addr`.
    fn find(&mut self, addr: u64, holds: impl Fn(u32) -> bool) -> Option<u32> {
        let indexed = &self.indexed;
        let at = self.ranks.rank(indexed.len(), addr, |i| indexed[i].0);
        if let Some(l) = at.checked_sub(1).map(|k| indexed[k].1).filter(|&l| holds(l)) {
            return Some(l);
        }
        let at = self.all.partition_point(|&(start, _)| start <= addr);
        let l = at.checked_sub(1).map(|k| self.all[k].1).filter(|&l| holds(l))?;
        self.stale += 1;
        if self.stale > self.all.len().max(64) {
            self.indexed = self.all.clone();
            self.ranks = Ranks::new(self.indexed.len(), |i| self.indexed[i].0);
            self.stale = 0;
        }
        Some(l)
    }

    fn insert(&mut self, start: u64, lease: u32) {
        self.all.insert(self.all.partition_point(|&(s, _)| s < start), (start, lease));
    }
}

/// Refuses a request of length 0 (`at`: its index in a submission).
pub(super) fn nonzero(r: &Request, at: Option<usize>) -> Result<()> {
    match (r.len, at) {
        (0, Some(i)) => Err(Error::InvalidArgument(format!("request {i}: length is 0"))),
        (0, None) => Err(Error::InvalidArgument("the request's length is 0".into())),
        _ => Ok(()),
    }
}

impl Engine {
    /// The entry checks of a submission of `requests`: the engine open,
    /// at least one request and at most [`MAX_REQUESTS`].
    pub(super) fn check_submission(&self, requests: &[Request]) -> Result<()> {
        self.check_open()?;
        if requests.is_empty() {
            return Err(Error::InvalidArgument("a submission needs at least one request".into()));
        }
        if requests.len() > MAX_REQUESTS {
            return Err(Error::InvalidArgument(format!(
                "{} requests; one submission carries at most {MAX_REQUESTS}",
                requests.len()
            )));
        }
        Ok(())
    }

    /// A lease of the registered local region holding `r`'s local range
    /// (`at`: its index in a submission, for the message).
    pub(super) fn lease_local(&self, r: &Request, at: Option<usize>) -> Result<RegionLease> {
        self.inner.regions.lease(r.local_addr, r.len).map_err(|e| {
            let text = match at {
                Some(i) => format!("request {i}: local {}", e.message()),
                None => format!("local {}", e.message()),
            };
            Error::from_status(e.status(), text)
        })
    }

    /// Checks every request's local side: a registered region holds it.
    /// Requests of one local region share one lease, taken once per
    /// submission, so the pass is a few comparisons per request (a lookup
    /// among the regions leased so far when a request leaves its
    /// neighbour's); the deadline is checked as it goes. (Local memory
    /// that peers import stays usable: between requesters, the order of
    /// overlapping accesses is the application's.) Returns the leases and,
    /// per request, which one holds it.
    pub(super) fn check_local(
        &self,
        requests: &[Request],
        deadline: Instant,
    ) -> Result<(Vec<Arc<RegionLease>>, Vec<u32>)> {
        let mut leases: Vec<Arc<RegionLease>> = Vec::new();
        let mut by_addr = LeasesByAddr::default();
        let mut out = Vec::with_capacity(requests.len());
        let mut last = u32::MAX;
        for (i, r) in requests.iter().enumerate() {
            nonzero(r, Some(i))?;
            if i % 4096 == 4095 && Instant::now() >= deadline {
                return Err(Error::TimedOut(format!("the deadline passed while checking request {i}")));
            }
            let holds = |l: u32| leases[l as usize].region().contains(r.local_addr, r.len);
            if last == u32::MAX || !holds(last) {
                last = match by_addr.find(r.local_addr, holds) {
                    Some(l) => l,
                    None => {
                        let lease = self.lease_local(r, Some(i))?;
                        let start = lease.region().addr;
                        leases.push(Arc::new(lease));
                        let l = (leases.len() - 1) as u32;
                        by_addr.insert(start, l);
                        l
                    }
                };
            }
            out.push(last);
        }
        Ok((leases, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards `LeasesByAddr`: with 200 regions (100 bytes apart, 60 long)
    /// leased in scrambled order, every address finds the region holding
    /// it and none in a gap; once more lookups than regions have missed
    /// the index, it is rebuilt over all of them (found in one step).
    #[test]
    fn leases_by_address_find_their_region_and_reindex() {
        let mut by = LeasesByAddr::default();
        let region_of = |l: u32| (1000 + 100 * l as u64, 60u64);
        for k in 0..200u32 {
            let l = (k * 73) % 200;
            by.insert(region_of(l).0, l);
        }
        let holds = |addr: u64| move |l: u32| region_of(l).0 <= addr && addr < region_of(l).0 + region_of(l).1;
        for round in 0..2 {
            for l in 0..200u32 {
                let (start, len) = region_of(l);
                assert_eq!(by.find(start, holds(start)), Some(l), "round {round}");
                assert_eq!(by.find(start + len - 1, holds(start + len - 1)), Some(l));
                assert_eq!(by.find(start + len, holds(start + len)), None, "a gap");
            }
            if round == 0 {
                assert_eq!(by.indexed.len(), 200, "rebuilt after the misses");
            }
        }
        assert_eq!(by.find(999, holds(999)), None);
    }

    /// Guards `contains(r.local_addr, r.len)` in `check_local`'s `holds`: a
    /// request starting in the region the request before it leased and
    /// running 8 bytes past that region's end is refused, naming request
    /// 1, not passed on the neighbour's lease.
    #[test]
    fn a_request_running_past_its_neighbours_leased_region_is_refused() {
        use crate::transfer::Op;
        let e = Engine::from_json("").unwrap();
        let buf = vec![0u8; 128];
        let base = buf.as_ptr() as u64;
        e.register_memory(base, 64, crate::Access::NONE).unwrap();
        let r = |local_addr: u64, len: u64| Request { op: Op::Read, local_addr, remote_addr: 0x2000, len };
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        let (leases, at) = e.check_local(&[r(base, 8), r(base + 48, 16)], deadline).unwrap();
        assert_eq!((leases.len(), at), (1, vec![0, 0]));
        let Err(err) = e.check_local(&[r(base, 8), r(base + 56, 16)], deadline) else {
            panic!("a request past its neighbour's region was passed")
        };
        assert!(err.message().starts_with("request 1: local"), "{err}");
        drop(buf);
    }

    /// A Rust submission of MAX_REQUESTS requests passes the count check
    /// and one of MAX_REQUESTS + 1 is INVALID_ARGUMENT naming the bound (the
    /// C ABI checks its count itself; only Rust callers reach this one).
    /// The 512 MiB of requests are one 1 MiB memfd of valid requests
    /// mapped 513 times over one reservation: address space, not memory
    /// (the check reads only the length). Guards `requests.len() >
    /// MAX_REQUESTS`.
    #[test]
    fn a_submission_carries_at_most_max_requests() {
        use crate::transfer::Op;
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        const CHUNK: usize = 1 << 20;
        let per_chunk = CHUNK / std::mem::size_of::<Request>();
        let chunks = (MAX_REQUESTS + 1).div_ceil(per_chunk);
        // SAFETY: memfd_create with a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"requests".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor, owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let req = Request { op: Op::Read, local_addr: 0x1000, remote_addr: 0x2000, len: 8 };
        // One request's bytes, field by field (no padding read).
        let mut one = [0u8; std::mem::size_of::<Request>()];
        let mut put = |at: usize, v: &[u8]| one[at..at + v.len()].copy_from_slice(v);
        put(std::mem::offset_of!(Request, op), &(Op::Read as u32).to_ne_bytes());
        put(std::mem::offset_of!(Request, local_addr), &req.local_addr.to_ne_bytes());
        put(std::mem::offset_of!(Request, remote_addr), &req.remote_addr.to_ne_bytes());
        put(std::mem::offset_of!(Request, len), &req.len.to_ne_bytes());
        let bytes = one.repeat(per_chunk);
        assert_eq!(bytes.len(), CHUNK);
        let mut f = std::fs::File::from(fd);
        std::io::Write::write_all(&mut f, &bytes).unwrap();
        let total = chunks * CHUNK;
        // SAFETY: a fresh reservation of `total` bytes of address space.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), total, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(base, libc::MAP_FAILED);
        for c in 0..chunks {
            // SAFETY: MAP_FIXED inside the reservation made above, which
            // nothing else uses; the memfd holds CHUNK bytes.
            let p = unsafe {
                libc::mmap(
                    (base as *mut u8).add(c * CHUNK) as *mut libc::c_void,
                    CHUNK,
                    libc::PROT_READ,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED, "chunk {c}");
        }
        let e = Engine::from_json("").unwrap();
        {
            // SAFETY: every byte of the reservation is mapped to the memfd,
            // whose bytes are valid Requests (32 bytes each, 8-aligned); the
            // mapping outlives the slices (unmapped below).
            let all = unsafe { std::slice::from_raw_parts(base as *const Request, MAX_REQUESTS + 1) };
            assert_eq!(all[MAX_REQUESTS], req);
            assert!(e.check_submission(&all[..MAX_REQUESTS]).is_ok());
            let err = e.check_submission(all).unwrap_err();
            assert_eq!(err.status(), crate::Status::InvalidArgument);
            assert!(
                err.message().contains(&format!("{} requests; one submission carries at most", MAX_REQUESTS + 1)),
                "{err}"
            );
        }
        // SAFETY: the reservation made above, no slice of it left.
        assert_eq!(unsafe { libc::munmap(base, total) }, 0);
    }
}
