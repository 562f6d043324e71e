//! The config parser: any text is accepted or rejected with INVALID_CONFIG,
//! never a panic; an accepted config round-trips through its JSON.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbite::{EngineConfig, Status};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match EngineConfig::from_json(text) {
        Ok(c) => assert_eq!(EngineConfig::from_json(&c.to_json()).unwrap(), c),
        Err(e) => assert_eq!(e.status(), Status::InvalidConfig),
    }
});
