//! Unpredictable values from the kernel (`getrandom`): authentication
//! nonces, export tokens, engine and region epochs. There is no predictable
//! fallback: a kernel that cannot supply randomness is an error.

use crate::error::{Error, Result};

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: getrandom writes at most `buf.len() - done` bytes into the
        // rest of `buf`, which we own mutably.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io("getrandom", &e));
        }
        done += n as usize;
    }
    Ok(())
}

/// A random nonzero 64-bit value.
pub fn nonzero_u64() -> Result<u64> {
    loop {
        let mut b = [0u8; 8];
        fill(&mut b)?;
        let v = u64::from_le_bytes(b);
        if v != 0 {
            return Ok(v);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_differ_and_are_never_zero() {
        let a = super::nonzero_u64().unwrap();
        let b = super::nonzero_u64().unwrap();
        assert_ne!(a, b);
        let mut big = [0u8; 100];
        super::fill(&mut big).unwrap();
        assert!(big.iter().any(|b| *b != 0));
    }
}
