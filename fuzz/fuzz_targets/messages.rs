//! Control message bodies: Describe, data request/response, Error. Decoding
//! never panics, and what decodes re-encodes to what decodes the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbite::control::message::{decode_error, DataRequest, DataResponse, Describe};

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = Describe::decode(data) {
        assert_eq!(Describe::decode(&d.encode()).unwrap(), d);
    }
    if data.len() >= 32 {
        if let Ok(q) = DataRequest::decode(data[..32].try_into().unwrap()) {
            assert_eq!(q.encode().as_slice(), &data[..32]);
        }
    }
    if data.len() >= 16 {
        if let Ok(r) = DataResponse::decode(data[..16].try_into().unwrap()) {
            assert_eq!(r.encode().as_slice(), &data[..16]);
        }
    }
    let _ = decode_error(data);
});
