//! Helpers shared by the hostile-peer test binaries.
#![allow(dead_code)]
#[allow(unused_imports)]
use orbite::control::frame::{FrameHeader, MsgKind, FRAME_HEADER_LEN};
#[allow(unused_imports)]
use orbite::control::message::{self, Describe};
use orbite::control::Identity;
use orbite::*;
use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

#[allow(dead_code)]
pub const LONG: Duration = Duration::from_secs(60);

#[allow(dead_code)]
pub fn proc_status(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[allow(dead_code)]
pub fn describe_bytes() -> Vec<u8> {
    let d = Describe {
        identity: Identity::fresh().unwrap(),
        capabilities: 1,
        fabric_domain: [0; 16],
        endpoint: "127.0.0.1:1".into(),
        ipc_name: String::new(),
        regions: vec![],
    };
    let body = d.encode();
    let mut v = FrameHeader::encode(MsgKind::Describe, body.len() as u32).to_vec();
    v.extend(body);
    v
}

/// Reads until EOF (or 60 s); returns the Error frame's text if one came.
#[allow(dead_code)]
pub fn error_text(s: &mut TcpStream) -> Option<String> {
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    // Skip a Describe reply if the handshake happened.
    let mut at = 0;
    while all.len() >= at + FRAME_HEADER_LEN {
        let h = FrameHeader::decode(all[at..at + FRAME_HEADER_LEN].try_into().unwrap()).ok()?;
        let body = &all[at + FRAME_HEADER_LEN..(at + FRAME_HEADER_LEN + h.body_len as usize).min(all.len())];
        if h.kind == MsgKind::Error {
            return message::decode_error(body).ok().map(|(_, t)| t);
        }
        at += FRAME_HEADER_LEN + h.body_len as usize;
    }
    None
}

pub struct Good {
    pub src: Engine,
    pub req: Engine,
    pub peer: u64,
    pub remote: Vec<u8>,
    pub local: Vec<u8>,
}

impl Good {
    pub fn new(cfg: &str) -> Good {
        let src = Engine::from_json(cfg).unwrap();
        let req = Engine::from_json("").unwrap();
        let mut remote = vec![7u8; 65536];
        let mut local = vec![0u8; 65536];
        src.register_memory(remote.as_mut_ptr() as u64, 65536, Access::READ).unwrap();
        req.register_memory(local.as_mut_ptr() as u64, 65536, Access::NONE).unwrap();
        let peer = req.connect(&src.endpoint(), None).unwrap();
        Good { src, req, peer, remote, local }
    }

    pub fn transfer(&mut self) {
        self.local.iter_mut().for_each(|b| *b = 0);
        let r = Request {
            op: Op::Read,
            local_addr: self.local.as_ptr() as u64,
            remote_addr: self.remote.as_ptr() as u64,
            len: 65536,
        };
        let b = self.req.submit(self.peer, &[r], SubmitOptions::default()).unwrap();
        b.wait(LONG).unwrap();
        assert!(self.local.iter().all(|b| *b == 7));
    }
}
