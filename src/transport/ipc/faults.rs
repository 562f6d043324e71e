//! Fault injection for the IPC protocol: switches that fail the next N
//! native closes, completions or copies, answer the next N completion
//! queries "not yet", drop the next N receipt acknowledgements or export
//! handles (with their channel) and narrow the next offer. The requester
//! checks them where it calls an import's mapping or opens an import, the
//! link where it handles a frame: nothing wraps the backend. Each check is
//! one atomic load until armed; tests arm them through `Engine::faults()`.

use std::sync::atomic::AtomicU32;

/// Counters of faults to inject ("fail the next N").
#[derive(Debug, Default)]
pub struct Faults {
    /// Native close (unmap) fails.
    pub fail_close: AtomicU32,
    /// Completion wait fails.
    pub fail_completion: AtomicU32,
    /// A copy fails.
    pub fail_copy: AtomicU32,
    /// A receipt's acknowledgement is lost on the way back.
    pub lose_ack: AtomicU32,
    /// The channel breaks as an export handle arrives (the handle goes
    /// with it).
    pub lose_handle: AtomicU32,
    /// The channel breaks as a receipt's acknowledgement arrives (the
    /// source took the receipt; the requester cannot know).
    pub break_at_ack: AtomicU32,
    /// The next offer names an allocation that ends with its grant, as a
    /// source whose published region reaches past the allocation it
    /// exports would (the import maps no more).
    pub narrow_offer: AtomicU32,
    /// Completion queries answer "not ready yet" this many more times.
    pub pending_polls: AtomicU32,
}

impl Faults {
    /// Takes one fault from `counter` if armed.
    pub fn take(counter: &AtomicU32) -> bool {
        crate::sync::take_armed(counter)
    }
}
