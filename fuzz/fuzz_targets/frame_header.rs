//! The frame header decoder: any 16 bytes decode or fail, never panic, and a
//! decoded header re-encodes to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbite::control::frame::{FrameHeader, FRAME_HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() < FRAME_HEADER_LEN {
        return;
    }
    let h: [u8; FRAME_HEADER_LEN] = data[..FRAME_HEADER_LEN].try_into().unwrap();
    if let Ok(f) = FrameHeader::decode(&h) {
        assert_eq!(FrameHeader::encode(f.kind, f.body_len), h);
    }
});
