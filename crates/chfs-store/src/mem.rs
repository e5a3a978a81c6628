//! DRAM engine: the shared index ([`crate::index`]) over records held in
//! heap buffers.

use bytes::Bytes;
use chfs_proto::Meta;

use crate::index::{Indexed, Medium, Record, Src, Write};
use crate::usage::Usage;
use crate::Result;

/// A chunk as held here: its bytes in a shared buffer, so that a read can
/// hand out a slice (a write to a chunk someone still reads copies it
/// first).
pub struct Held {
    meta: Meta,
    data: Bytes,
}

impl Record for Held {
    fn meta(&self) -> &Meta {
        &self.meta
    }

    fn len(&self) -> u64 {
        self.data.len() as u64
    }
}

/// The DRAM medium: records are heap buffers.
pub struct Mem;

/// The DRAM engine. Data is lost when the server stops.
pub type MemStore = Indexed<Mem>;

impl MemStore {
    /// A store holding at most `capacity` bytes of chunk data (0 = no limit
    /// but memory).
    pub fn new(capacity: u64) -> Self {
        Indexed::over(Mem, Usage::new(capacity))
    }
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new(0)
    }
}

impl Medium for Mem {
    type Rec = Held;
    type Data = Bytes;
    const NAME: &'static str = "mem";

    fn fresh(&self, w: Write<'_>, _old: Option<&Held>) -> Result<Held> {
        let Write {
            off, data, meta, ..
        } = w;
        let data = match data {
            // The buffer itself, when it starts with the data.
            Src::Own(b) if off == 0 => b,
            Src::Copy(d) if off == 0 => Bytes::copy_from_slice(d),
            s => {
                let mut buf = Bytes::new();
                put_src(&mut buf, off as usize, s);
                buf
            }
        };
        Ok(Held { meta, data })
    }

    fn write_into(&self, w: Write<'_>, rec: &mut Held) -> Result<Option<Held>> {
        put_src(&mut rec.data, w.off as usize, w.data);
        rec.meta = w.meta;
        Ok(None)
    }

    fn set_meta(&self, _path: &str, _idx: u64, rec: &mut Held, meta: Meta) -> Result<()> {
        rec.meta = meta;
        Ok(())
    }

    fn truncate(&self, _path: &str, _idx: u64, rec: &mut Held, len: u64) -> Result<Option<Held>> {
        rec.data.truncate(len as usize);
        Ok(None)
    }

    fn read(&self, rec: &Held, off: u64, len: u64) -> Result<Bytes> {
        let start = (off as usize).min(rec.data.len());
        let end = (off as usize + len as usize).min(rec.data.len());
        Ok(rec.data.slice(start..end))
    }

    fn free(&self, _rec: Held) -> Result<()> {
        Ok(())
    }
}

/// Writes `src` at `off` of `data` (see [`put`]), or replaces `data` with
/// the buffer when it covers all of it from offset 0. The chunk's buffer is
/// changed in place unless a reader still holds a slice of it (then it is
/// copied first).
fn put_src(data: &mut Bytes, off: usize, src: Src<'_>) {
    match src {
        Src::Own(b) if off == 0 && b.len() >= data.len() => *data = b,
        Src::Own(b) => put_shared(data, off, &b),
        Src::Copy(d) => put_shared(data, off, d),
    }
}

/// [`put`] into a chunk's shared buffer: in place when nobody else holds
/// it, else into a copy.
fn put_shared(data: &mut Bytes, off: usize, src: &[u8]) {
    let mut v = Vec::from(std::mem::take(data));
    put(&mut v, off, src);
    *data = Bytes::from(v);
}

/// Writes `src` at `off` of `data`, growing it (zero-filled gap) as needed;
/// bytes written over are not zeroed first.
fn put(data: &mut Vec<u8>, off: usize, src: &[u8]) {
    let end = off + src.len();
    if off >= data.len() {
        data.resize(off, 0);
        data.extend_from_slice(src);
    } else {
        let overlap = end.min(data.len());
        data[off..overlap].copy_from_slice(&src[..overlap - off]);
        data.extend_from_slice(&src[overlap - off..]);
    }
}

#[cfg(test)]
mod put_tests {
    use super::put;

    #[test]
    fn put_overwrites_extends_and_zero_fills() {
        let mut d = Vec::new();
        put(&mut d, 3, b"ab");
        assert_eq!(d, b"\0\0\0ab");
        put(&mut d, 1, b"xy");
        assert_eq!(d, b"\0xyab");
        put(&mut d, 4, b"123");
        assert_eq!(d, b"\0xya123");
        put(&mut d, 0, b"Z");
        assert_eq!(d, b"Zxya123");
        put(&mut d, 7, b"!");
        assert_eq!(d, b"Zxya123!");
    }
}
