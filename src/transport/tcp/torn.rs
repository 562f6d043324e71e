//! A WRITE cut mid-payload (a torn WRITE): the connection ended after its
//! request was accepted and part of its payload had landed, so its range
//! holds the new bytes up to the cut and the old ones after. Each is
//! counted (`transports.tcp.served_torn`) and logged at WARN, naming the
//! peer, the region and both ranges. At most one such WARN line a second
//! per engine: the others come at DEBUG and the next WARN line counts
//! them, so that a peer cutting WRITEs in a loop cannot flood the log.

use crate::control::message::DataRequest;
use crate::counters::Counters;
use crate::kinds::TransportKind;
use crate::log::{Level, Logger};
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Shortest time between two WARN lines of torn WRITEs.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// One torn WRITE, as the source saw it.
pub struct Torn<'a> {
    /// The socket's peer address.
    pub peer: &'a str,
    /// The endpoint the requester announced.
    pub endpoint: &'a str,
    /// The region written.
    pub region: u64,
    /// The request.
    pub req: &'a DataRequest,
    /// Bytes of its payload that landed (from `req.addr` on).
    pub landed: u64,
    /// Why the connection ended.
    pub why: &'a str,
}

/// An engine's reports of torn WRITEs: when the last WARN line was
/// written, and how many came at DEBUG since.
#[derive(Default)]
pub struct TornReports {
    state: Mutex<(Option<Instant>, u64)>,
}

impl TornReports {
    /// The level of a line at `now`, and for a WARN line how many came at
    /// DEBUG since the last.
    fn level(&self, now: Instant) -> (Level, u64) {
        let mut st = self.state.lock();
        match st.0 {
            Some(last) if now.saturating_duration_since(last) < WARN_EVERY => {
                st.1 += 1;
                (Level::Debug, 0)
            }
            _ => {
                st.0 = Some(now);
                (Level::Warn, std::mem::take(&mut st.1))
            }
        }
    }

    /// Counts `t` in `stats` and logs it (see the module).
    pub fn report(&self, log: &Logger, stats: &Counters, t: &Torn<'_>) {
        let total = stats.record_torn(TransportKind::Tcp);
        let (level, unlogged) = self.level(Instant::now());
        let (start, cut, end) = (t.req.addr, t.req.addr + t.landed, t.req.addr + t.req.len);
        let more = match unlogged {
            0 => String::new(),
            n => format!("; {n} more since the last such line, logged at debug"),
        };
        log.event(
            level,
            format_args!(
                "torn WRITE: the connection from {} (endpoint {}) ended ({}) after {} of the {} bytes of its \
                 WRITE (tag {}) to region {} had landed: [{start:#x}, {cut:#x}) holds the new bytes, \
                 [{cut:#x}, {end:#x}) the old; the WRITE failed, write the whole range again before reading it \
                 (torn WRITEs on this engine so far: {total}{more})",
                t.peer, t.endpoint, t.why, t.landed, t.req.len, t.req.tag, t.region
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer cutting WRITEs in a loop gets one WARN line a second; the
    /// lines between come at DEBUG and the next WARN line counts them.
    /// Guards `level`'s `WARN_EVERY` arm (without it every line is WARN).
    #[test]
    fn one_warn_line_a_second_the_others_at_debug_and_counted() {
        let r = TornReports::default();
        let t0 = Instant::now();
        let at = |ms: u64| r.level(t0 + Duration::from_millis(ms));
        assert_eq!(at(0), (Level::Warn, 0));
        assert_eq!(at(1), (Level::Debug, 0));
        assert_eq!(at(999), (Level::Debug, 0));
        assert_eq!(at(1000), (Level::Warn, 2));
        assert_eq!(at(1500), (Level::Debug, 0));
        assert_eq!(at(5000), (Level::Warn, 1));
        assert_eq!(at(6001), (Level::Warn, 0));
    }
}
