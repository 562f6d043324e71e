//! IPC protocol bodies: hello, export request/offer/reject, refs, revalidate.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbite::transport::ipc::messages::{decode_reject, ExportOffer, ExportRef, ExportRequest, Hello, Revalidate};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
    }
    if let Ok(q) = ExportRequest::decode(data) {
        assert_eq!(q.encode(), data);
    }
    if let Ok(o) = ExportOffer::decode(data) {
        assert_eq!(o.encode(), data);
    }
    if let Ok(r) = ExportRef::decode(data, "fuzz") {
        assert_eq!(r.encode(), data);
    }
    if let Ok(v) = Revalidate::decode(data) {
        assert_eq!(v.encode(), data);
    }
    let _ = decode_reject(data);
});
