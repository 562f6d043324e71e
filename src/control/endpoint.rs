//! Endpoint strings: `IP:port`, `[v6]:port` or `localhost:port`.

use crate::error::{Error, Result};
use std::net::{Ipv4Addr, SocketAddr};

/// Parses an endpoint without touching DNS.
pub fn parse(s: &str) -> Result<SocketAddr> {
    let bad = || {
        Error::InvalidArgument(format!(
            "{s:?} is not an endpoint (expected IP:port, [IPv6]:port or localhost:port, as orbite_engine_endpoint \
             prints it; host names other than localhost are not resolved)"
        ))
    };
    if let Ok(a) = s.parse::<SocketAddr>() {
        if a.port() == 0 {
            return Err(bad());
        }
        return Ok(a);
    }
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host == "localhost" && port != 0 {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    Err(bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(parse("127.0.0.1:80").unwrap().port(), 80);
        assert_eq!(parse("localhost:81").unwrap().port(), 81);
        assert_eq!(parse("[::1]:82").unwrap().port(), 82);
        for b in ["", "x", "127.0.0.1", "127.0.0.1:0", "host:1", "1.2.3.4:99999", "localhost:"] {
            assert!(matches!(parse(b), Err(Error::InvalidArgument(_))), "{b}");
        }
    }
}
