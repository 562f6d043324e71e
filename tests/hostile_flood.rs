//! A connection flood against the control port, alone in its test binary so
//! that the process-wide thread count measures this engine only.

mod hostile;
use hostile::*;
use std::net::TcpStream;
use std::time::{Duration, Instant};

#[test]
fn a_connection_flood_is_refused_at_the_limit_with_bounded_threads_and_memory() {
    // A long handshake timeout keeps the admitted flood connections in their
    // slots for the whole test, so the counts below are exact.
    let mut g = Good::new(r#"{"max_incoming_connections": 16, "handshake_timeout_ms": 60000}"#);
    g.transfer();
    let threads0 = proc_status("Threads:");
    let rss0 = proc_status("VmRSS:");
    let ep = g.src.endpoint();
    let mut flood: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(&ep).unwrap()).collect();
    // The accept loop handles every one: admitted (15 free slots: the good
    // peer holds one) or refused at the limit.
    let t0 = Instant::now();
    loop {
        let st = g.src.stats();
        // 200 flood connections plus the good peer.
        if st.connections_refused as usize + st.incoming_connections > 200 {
            assert_eq!(st.connections_refused, 200 - 15, "{st:?}");
            assert_eq!(st.incoming_connections, 16);
            break;
        }
        assert!(t0.elapsed() < LONG, "the flood was not handled: {st:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The existing peer keeps working during the flood.
    for _ in 0..10 {
        g.transfer();
    }
    // One serving thread per admitted connection, at most the limit.
    let threads = proc_status("Threads:");
    assert!(threads <= threads0 + 16 + 2, "threads {threads0} -> {threads}");
    // A refused connection is told why.
    let last = flood.last_mut().unwrap();
    assert!(error_text(last).unwrap_or_default().contains("connection limit"));
    drop(flood);
    // Every flood connection ends once its client leaves.
    let t0 = Instant::now();
    while g.src.stats().incoming_connections > 1 {
        assert!(t0.elapsed() < LONG, "flood connections linger: {}", g.src.stats().incoming_connections);
        std::thread::sleep(Duration::from_millis(20));
    }
    g.transfer();
    let rss = proc_status("VmRSS:");
    assert!(rss < rss0 + 64 * 1024, "RSS grew from {rss0} kB to {rss} kB");
}
