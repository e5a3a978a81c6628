//! Connection handshake.
//!
//! The connecting side sends [`Hello`]; the accepting side answers with
//! [`HelloReply`]. Both start with [`MAGIC`] and the protocol version. When
//! the server was started with a shared secret, a `Hello` without the same
//! secret is refused with `EACCES` and the connection is closed.

use crate::{ProtoError, PROTOCOL_VERSION};

/// Magic bytes that open every chfs-rs connection, in both directions.
pub const MAGIC: [u8; 8] = *b"CHFS-RS\x01";

/// Longest secret accepted (bytes).
pub const MAX_SECRET: usize = 1024;

/// Longest reply message accepted (bytes).
const MAX_MESSAGE: usize = 4096;

/// First message of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version of the connecting side.
    pub version: u16,
    /// Shared secret, empty when none is configured.
    pub secret: Vec<u8>,
}

impl Hello {
    /// Length of the fixed part (magic, version, secret length).
    pub const FIXED_LEN: usize = 12;

    /// A hello for this build with the given secret.
    pub fn new(secret: &[u8]) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            secret: secret.to_vec(),
        }
    }

    /// Encodes the hello.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::FIXED_LEN + self.secret.len());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.secret.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.secret);
        b
    }

    /// Decodes the fixed part; returns (version, secret length to read next).
    pub fn decode_fixed(b: &[u8; Self::FIXED_LEN]) -> Result<(u16, usize), ProtoError> {
        if b[0..8] != MAGIC {
            return Err(ProtoError::BadMagic);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        let n = u16::from_le_bytes([b[10], b[11]]) as usize;
        if n > MAX_SECRET {
            return Err(ProtoError::Malformed(format!(
                "secret of {n} bytes is too long"
            )));
        }
        Ok((version, n))
    }
}

/// Answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloReply {
    /// Protocol version of the server.
    pub version: u16,
    /// 0 when accepted, otherwise the errno of the refusal.
    pub status: i32,
    /// Why the connection was refused (empty when accepted).
    pub message: String,
}

impl HelloReply {
    /// Length of the fixed part (magic, version, status, message length).
    pub const FIXED_LEN: usize = 16;

    /// Encodes the reply.
    pub fn encode(&self) -> Vec<u8> {
        let msg = &self.message.as_bytes()[..self.message.len().min(MAX_MESSAGE)];
        let mut b = Vec::with_capacity(Self::FIXED_LEN + msg.len());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.status.to_le_bytes());
        b.extend_from_slice(&(msg.len() as u16).to_le_bytes());
        b.extend_from_slice(msg);
        b
    }

    /// Decodes the fixed part; returns (version, status, message length).
    pub fn decode_fixed(b: &[u8; Self::FIXED_LEN]) -> Result<(u16, i32, usize), ProtoError> {
        if b[0..8] != MAGIC {
            return Err(ProtoError::BadMagic);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        let status = i32::from_le_bytes([b[10], b[11], b[12], b[13]]);
        let n = u16::from_le_bytes([b[14], b[15]]) as usize;
        if n > MAX_MESSAGE {
            return Err(ProtoError::Malformed("hello reply message too long".into()));
        }
        Ok((version, status, n))
    }
}

/// Compares two secrets in time independent of where they differ.
pub fn secrets_match(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip() {
        let h = Hello::new(b"s3cret");
        let b = h.encode();
        let (v, n) = Hello::decode_fixed(b[..12].try_into().unwrap()).unwrap();
        assert_eq!(v, PROTOCOL_VERSION);
        assert_eq!(&b[12..12 + n], b"s3cret");
    }

    #[test]
    fn bad_magic() {
        let mut b = Hello::new(b"").encode();
        b[0] = b'X';
        assert!(matches!(
            Hello::decode_fixed(b[..12].try_into().unwrap()),
            Err(ProtoError::BadMagic)
        ));
    }

    #[test]
    fn secret_compare() {
        assert!(secrets_match(b"abc", b"abc"));
        assert!(!secrets_match(b"abc", b"abd"));
        assert!(!secrets_match(b"abc", b"ab"));
    }
}
