//! Control message bodies: Describe, data request/response, Error, Notify
//! and NotifyAck. Decoding
//! never panics, and what decodes re-encodes to what decodes the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbite::control::message::{decode_error, DataRequest, DataResponse, Describe};
use orbite::control::notify_frame::{decode_ack, encode_ack, Notify};

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
    if let Ok(n) = Notify::decode(data) {
        assert_eq!(Notify::decode(&n.encode()).unwrap(), n);
    }
    if let Ok((tag, verdict)) = decode_ack(data) {
        let (tag2, verdict2) = decode_ack(&encode_ack(tag, &verdict)).unwrap();
        assert_eq!(
            (tag2, verdict2.map_err(|e| (e.status(), e.message().to_string()))),
            (tag, verdict.map_err(|e| (e.status(), e.message().to_string())))
        );
    }
});
