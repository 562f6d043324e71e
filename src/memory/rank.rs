//! Which of many sorted addresses lie at or before a given one, in a few
//! steps rather than a binary search: a submission of a KV pool looks up
//! one of a hundred regions or more per run of requests, tens of thousands
//! of times, and each binary search is seven dependent, unpredictable
//! steps. The addresses' span is cut into equal buckets (about two per
//! address); each bucket records how many addresses lie before it, so a
//! lookup is one division by a power of two and a short walk inside one
//! bucket (a binary search where a bucket holds many).

/// The buckets over a caller's sorted addresses (the caller keeps the
/// addresses, usually beside what each one names, and hands a way to read
/// the `i`-th to every call).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ranks {
    /// The first address, and the bucket width as a power of two.
    base: u64,
    shift: u32,
    /// Per bucket: how many addresses lie before the bucket's start.
    /// Empty for a few addresses (a binary search is as quick then).
    buckets: Vec<u32>,
}

/// Below this many addresses no buckets are built.
const BUCKETED_FROM: usize = 16;

/// A bucket holding more addresses than this is searched, not walked.
const WALK: usize = 8;

/// At most this many buckets (256 KiB), whatever the count of addresses.
const MAX_BUCKETS: usize = 1 << 16;

/// How many of the `n` sorted addresses `at` gives lie at or before `addr`
/// among positions `lo..hi` (a binary search).
fn search(lo: usize, hi: usize, addr: u64, at: impl Fn(usize) -> u64) -> usize {
    let (mut lo, mut hi) = (lo, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if at(mid) <= addr {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

impl Ranks {
    /// The buckets over `n` addresses, `at(i)` the `i`-th, sorted
    /// ascending (equal addresses allowed).
    pub fn new(n: usize, at: impl Fn(usize) -> u64) -> Ranks {
        debug_assert!((1..n).all(|i| at(i - 1) <= at(i)));
        if n < BUCKETED_FROM {
            return Ranks::default();
        }
        let base = at(0);
        let span = at(n - 1) - base;
        // The narrowest power-of-two width giving at most `want` buckets.
        let want = (2 * n).next_power_of_two().min(MAX_BUCKETS) as u64;
        let mut shift = 0;
        while (span >> shift) >= want {
            shift += 1;
        }
        let count = ((span >> shift) + 1) as usize;
        let mut buckets = Vec::with_capacity(count);
        let mut before = 0usize;
        for b in 0..count as u64 {
            let start = base + (b << shift);
            while before < n && at(before) < start {
                before += 1;
            }
            buckets.push(before as u32);
        }
        Ranks { base, shift, buckets }
    }

    /// How many of the `n` addresses (the same as at [`Ranks::new`]) lie
    /// at or before `addr`: what a binary search for the first one past
    /// `addr` gives.
    pub fn rank(&self, n: usize, addr: u64, at: impl Fn(usize) -> u64) -> usize {
        if self.buckets.is_empty() {
            return search(0, n, addr, at);
        }
        if addr < self.base {
            return 0;
        }
        let b = ((addr - self.base) >> self.shift) as usize;
        // Past the last bucket: past the last address.
        let Some(&lo) = self.buckets.get(b) else {
            return n;
        };
        let hi = self.buckets.get(b + 1).map_or(n, |&h| h as usize);
        let lo = lo as usize;
        if hi - lo > WALK {
            return search(lo, hi, addr, at);
        }
        let mut i = lo;
        while i < hi && at(i) <= addr {
            i += 1;
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards `Ranks::rank`: for sets of addresses spread evenly, clustered
    /// far apart (buckets holding many, searched), with duplicates, and
    /// too few for buckets, every probe around and between them ranks as a
    /// binary search over the same addresses does.
    #[test]
    fn rank_matches_a_binary_search() {
        let mut sets: Vec<Vec<u64>> = Vec::new();
        // 101 regions of 10 MB, 2 MiB aligned.
        sets.push((0..101u64).map(|i| 0x7f00_0000_0000 + i * 10_485_760).collect());
        // Two clusters 1 TB apart, 40 each 4 KiB apart.
        let mut two: Vec<u64> = (0..40u64).map(|i| 0x1000_0000 + i * 4096).collect();
        two.extend((0..40u64).map(|i| 0x100_0000_0000 + i * 4096));
        sets.push(two);
        // Duplicates and neighbours.
        sets.push(vec![5, 5, 5, 6, 7, 7, 100, 101, 102, 103, 104, 105, 106, 107, 108, 1 << 40, 1 << 40, u64::MAX]);
        // Too few for buckets.
        sets.push(vec![10, 20, 30]);
        sets.push(Vec::new());
        for starts in sets {
            let (n, at) = (starts.len(), |i: usize| starts[i]);
            let r = Ranks::new(n, at);
            assert_eq!(r.buckets.is_empty(), n < BUCKETED_FROM);
            let mut probes = vec![0, 1, u64::MAX, u64::MAX - 1];
            for &s in &starts {
                probes.extend([
                    s.wrapping_sub(1),
                    s,
                    s.wrapping_add(1),
                    s.wrapping_add(4095),
                    s.wrapping_add(5_000_000),
                ]);
            }
            for a in probes {
                assert_eq!(r.rank(n, a, at), starts.partition_point(|&s| s <= a), "address {a:#x} of {starts:x?}");
            }
        }
    }

    /// Guards the bucket width: evenly spread addresses get about two
    /// buckets each, so most lookups walk at most one address.
    #[test]
    fn spread_addresses_get_about_two_buckets_each() {
        let r = Ranks::new(101, |i| 0x7f00_0000_0000 + i as u64 * 10_485_760);
        assert!(r.buckets.len() > 101 && r.buckets.len() <= 256, "{} buckets", r.buckets.len());
        let most = r.buckets.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(most <= 1, "a bucket holds {most} addresses");
    }
}
