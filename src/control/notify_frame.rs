//! Notification frames on the control connection: `Notify` (requester side
//! to source side: a tag, the sender's name, the message) and `NotifyAck`
//! (the answer: the tag and a status, with a reason when refused).

use super::message::{cut_at_char, Reader, Writer, MAX_REASON};
use crate::error::{Error, Result, Status};

/// Longest engine name (config key `name`).
pub const MAX_NAME: usize = 64;
/// Largest `notification_max_bytes` an engine may configure: a Notify
/// frame stays a control frame.
pub const MAX_NOTIFICATION_BYTES: u64 = 256 * 1024;
/// Bytes of a Notify body besides the message: tag, name length, name.
pub const NOTIFY_OVERHEAD: usize = 8 + 2 + MAX_NAME;

/// Checks an engine name: 1 to 64 bytes of `[A-Za-z0-9._-]`.
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("a name is 1 to {MAX_NAME} bytes; {:?} has {}", name, name.len()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!("a name holds only A-Z a-z 0-9 . _ -; {name:?} holds {c:?}"));
    }
    Ok(())
}

/// One notification as it travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notify {
    /// Matches the answer to the notification.
    pub tag: u64,
    /// The sender's name; empty when it has none (the receiver then names
    /// it by its endpoint).
    pub name: String,
    /// The message.
    pub msg: Vec<u8>,
}

impl Notify {
    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(NOTIFY_OVERHEAD + self.msg.len()));
        w.u64(self.tag).str16(&self.name).bytes(&self.msg);
        w.0
    }

    /// Decodes a body whose length the caller already bounded; a name that
    /// breaks the rules is a protocol error.
    pub fn decode(body: &[u8]) -> Result<Notify> {
        let mut r = Reader::new(body, "Notify");
        let tag = r.u64()?;
        let name = r.str16()?;
        if !name.is_empty() {
            check_name(&name).map_err(|e| Error::Protocol(format!("Notify sender name: {e}")))?;
        }
        Ok(Notify { tag, name, msg: r.rest().to_vec() })
    }
}

/// Encodes a NotifyAck body: `Ok`, or the refusal with its reason.
pub fn encode_ack(tag: u64, outcome: &Result<()>) -> Vec<u8> {
    let mut w = Writer::default();
    match outcome {
        Ok(()) => w.u64(tag).u32(Status::Ok as u32).str16(""),
        Err(e) => {
            let text = e.message();
            w.u64(tag).u32(e.status() as u32).str16(cut_at_char(text, MAX_REASON))
        }
    };
    w.0
}

/// Decodes a NotifyAck body: the tag and the receiver's verdict.
pub fn decode_ack(body: &[u8]) -> Result<(u64, Result<()>)> {
    let mut r = Reader::new(body, "NotifyAck");
    let tag = r.u64()?;
    let raw = r.u32()?;
    let text = r.str16()?;
    r.finish()?;
    if text.len() > MAX_REASON {
        return Err(Error::Protocol(format!("NotifyAck reason of {} bytes is too long", text.len())));
    }
    let status = Status::from_u32(raw).ok_or_else(|| Error::Protocol(format!("NotifyAck status {raw} is unknown")))?;
    Ok((tag, if status == Status::Ok { Ok(()) } else { Err(Error::from_status(status, text)) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rules() {
        assert!(check_name("prefill-0.gpu_3").is_ok());
        assert!(check_name(&"a".repeat(64)).is_ok());
        assert!(check_name("").unwrap_err().contains("1 to 64"));
        assert!(check_name(&"a".repeat(65)).unwrap_err().contains("has 65"));
        assert!(check_name("a b").unwrap_err().contains("' '"));
        assert!(check_name("é").is_err());
    }

    #[test]
    fn frames_round_trip_and_reject_garbage() {
        let n = Notify { tag: 7, name: "decode-1".into(), msg: b"blocks 17-42".to_vec() };
        assert_eq!(Notify::decode(&n.encode()).unwrap(), n);
        let anon = Notify { tag: 8, name: String::new(), msg: Vec::new() };
        assert_eq!(Notify::decode(&anon.encode()).unwrap(), anon);
        let bad = Notify { tag: 9, name: "no spaces".into(), msg: vec![1] };
        assert_eq!(Notify::decode(&bad.encode()).unwrap_err().status(), Status::ProtocolError);
        assert_eq!(Notify::decode(&[1, 2, 3]).unwrap_err().status(), Status::ProtocolError);

        let (tag, ok) = decode_ack(&encode_ack(3, &Ok(()))).unwrap();
        assert_eq!((tag, ok.is_ok()), (3, true));
        let full = Error::ResourceExhausted("queue full".into());
        let (tag, e) = decode_ack(&encode_ack(4, &Err(full))).unwrap();
        assert_eq!(tag, 4);
        let e = e.unwrap_err();
        assert_eq!((e.status(), e.message()), (Status::ResourceExhausted, "queue full"));
        let mut unknown = encode_ack(5, &Ok(()));
        unknown[8..12].copy_from_slice(&9999u32.to_le_bytes());
        assert_eq!(decode_ack(&unknown).unwrap_err().status(), Status::ProtocolError);
        let mut trailing = encode_ack(5, &Ok(()));
        trailing.push(0);
        assert_eq!(decode_ack(&trailing).unwrap_err().status(), Status::ProtocolError);
        let long = Error::ResourceExhausted("é".repeat(MAX_REASON));
        let (_, e) = decode_ack(&encode_ack(6, &Err(long))).unwrap();
        assert!(e.unwrap_err().message().len() <= MAX_REASON);
    }
}
