//! [`Deadline`]: the bound of a blocking exchange (a handshake, an answer a
//! peer must read): when it must be over, and what may end it first (the
//! engine stopping). The socket loops of `control::io` and the channels
//! call its [`Deadline::tick`] between their attempts.

use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// Never stops a wait early.
pub fn never_stop() -> Result<()> {
    Ok(())
}

/// When a wait must be over, and what may end it first.
#[derive(Clone, Copy)]
pub struct Deadline<'a> {
    /// When the wait must be over.
    pub at: Instant,
    /// Asked at every tick: an error ends the wait with it (the engine
    /// stopping).
    pub stop: &'a dyn Fn() -> Result<()>,
}

impl<'a> Deadline<'a> {
    /// A wait of at most `timeout` from now.
    pub fn after(timeout: Duration, stop: &'a dyn Fn() -> Result<()>) -> Deadline<'a> {
        Deadline { at: Instant::now() + timeout, stop }
    }

    /// One tick of the wait: `stop`'s error, `expired()` once the deadline
    /// has passed, or Ok to go on.
    pub fn tick(&self, expired: impl Fn() -> Error) -> Result<()> {
        (self.stop)()?;
        if Instant::now() >= self.at {
            return Err(expired());
        }
        Ok(())
    }

    /// The tick as the socket loops take it, failing with `expired()`.
    pub fn ticker(self, expired: impl Fn() -> Error + 'a) -> impl FnMut() -> Result<()> + 'a {
        move || self.tick(&expired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_says_stop_first_then_expiry() {
        let live = Deadline::after(Duration::from_secs(3600), &never_stop);
        assert!(live.tick(|| Error::TimedOut("late".into())).is_ok());
        let past = Deadline { at: Instant::now() - Duration::from_millis(1), stop: &never_stop };
        let e = past.ticker(|| Error::Protocol("no answer".into()))().unwrap_err();
        assert!(matches!(e, Error::Protocol(ref m) if m == "no answer"), "{e:?}");
        let stopping = || Err(Error::Unavailable("stopping".into()));
        let both = Deadline { at: Instant::now() - Duration::from_millis(1), stop: &stopping };
        assert!(matches!(both.tick(|| Error::TimedOut("late".into())), Err(Error::Unavailable(_))));
    }
}
