//! Little-endian field encoding shared by every message.
//!
//! Encoding appends to a `Vec<u8>`; decoding reads from a [`Bytes`] so that
//! large data fields are sliced out without copying.

use bytes::Bytes;

use crate::ProtoError;

/// Appends fields to a buffer.
pub trait Put {
    /// Appends a `u8`.
    fn put_u8(&mut self, v: u8);
    /// Appends a little-endian `u16`.
    fn put_u16(&mut self, v: u16);
    /// Appends a little-endian `u32`.
    fn put_u32(&mut self, v: u32);
    /// Appends a little-endian `u64`.
    fn put_u64(&mut self, v: u64);
    /// Appends a little-endian `i64`.
    fn put_i64(&mut self, v: i64);
    /// Appends a length-prefixed (u32) byte string.
    fn put_bytes(&mut self, v: &[u8]);
    /// Appends a length-prefixed UTF-8 string.
    fn put_str(&mut self, v: &str) {
        self.put_bytes(v.as_bytes())
    }
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v)
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn put_i64(&mut self, v: i64) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn put_bytes(&mut self, v: &[u8]) {
        self.put_u32(v.len() as u32);
        self.extend_from_slice(v)
    }
}

/// Reads fields from a received payload.
pub struct Reader {
    buf: Bytes,
}

impl Reader {
    /// Wraps a payload.
    pub fn new(buf: Bytes) -> Self {
        Self { buf }
    }

    fn take(&mut self, n: usize) -> Result<Bytes, ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError::Truncated {
                needed: n - self.buf.len(),
            });
        }
        Ok(self.buf.split_to(n))
    }

    /// The next `n` bytes, copied by `f` out of the buffer (no new
    /// reference to it: a `Bytes` slice costs two atomic operations on the
    /// buffer's count, as much as decoding a whole field).
    pub(crate) fn copied<T>(
        &mut self,
        n: usize,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, ProtoError> {
        let Some(b) = self.buf.get(..n) else {
            return Err(ProtoError::Truncated {
                needed: n - self.buf.len(),
            });
        };
        let v = f(b);
        bytes::Buf::advance(&mut self.buf, n);
        Ok(v)
    }

    /// Reads `N` raw bytes into an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        self.copied(N, |b| {
            let mut a = [0u8; N];
            a.copy_from_slice(b);
            a
        })
    }

    /// Reads a `u8`.
    pub fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.array::<1>()?[0])
    }
    /// Reads a `bool` (0 or 1).
    pub fn bool(&mut self) -> Result<bool, ProtoError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(ProtoError::Malformed(format!("bad bool {v}"))),
        }
    }
    /// Reads a `u16`.
    pub fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    /// Reads a `u32`.
    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// Reads an `i32`.
    pub fn i32(&mut self) -> Result<i32, ProtoError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    /// Reads a `u64`.
    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// Reads an `i64`.
    pub fn i64(&mut self) -> Result<i64, ProtoError> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    /// Reads a length-prefixed byte string without copying.
    pub fn bytes(&mut self) -> Result<Bytes, ProtoError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// Reads exactly `n` raw bytes.
    pub fn raw(&mut self, n: usize) -> Result<Bytes, ProtoError> {
        self.take(n)
    }
    /// Reads a length-prefixed UTF-8 string.
    pub fn string(&mut self) -> Result<String, ProtoError> {
        let n = self.u32()? as usize;
        self.copied(n, |b| std::str::from_utf8(b).map(str::to_owned))?
            .map_err(|_| ProtoError::Malformed("string is not UTF-8".into()))
    }
    /// Fails unless every byte was consumed.
    pub fn finish(self) -> Result<(), ProtoError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ProtoError::Malformed(format!(
                "{} trailing bytes",
                self.buf.len()
            )))
        }
    }
}

impl Reader {
    /// Number of bytes not read yet. Decoders bound what they reserve for
    /// a counted list by it: a count is only a claim, the bytes are there.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Takes every remaining byte (a payload tail) without copying.
    pub fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }
}
