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
        let room = room(&w);
        let Write {
            off, data, meta, ..
        } = w;
        let data = match data {
            // The buffer itself, when it starts with the data.
            Src::Own(b) if off == 0 => b,
            Src::Copy(d) if off == 0 => Bytes::copy_from_slice(d),
            s => {
                let mut buf = Bytes::new();
                put_src(&mut buf, off as usize, s, room);
                buf
            }
        };
        Ok(Held { meta, data })
    }

    fn write_into(&self, w: Write<'_>, rec: &mut Held) -> Result<Option<Held>> {
        let room = room(&w);
        put_src(&mut rec.data, w.off as usize, w.data, room);
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

/// The bytes to make room for when a write grows a chunk's buffer past
/// its capacity: the whole chunk for a data chunk (index 1 and up, of a
/// file larger than a chunk, so normally filled: IOR-hard's records fill
/// each in two or three writes, and growing the buffer step by step cost
/// a copy of what it held at each step, a fifth of chfsd's instructions
/// in that phase); none for a file's first chunk, where small files live
/// (the buffer then grows as a `Vec` does).
fn room(w: &Write<'_>) -> usize {
    if w.idx > 0 {
        w.meta.chunk_size as usize
    } else {
        0
    }
}

/// Writes `src` at `off` of `data` (see [`put`]), or replaces `data` with
/// the buffer when it covers all of it from offset 0. The chunk's buffer is
/// changed in place unless a reader still holds a slice of it (then it is
/// copied first).
fn put_src(data: &mut Bytes, off: usize, src: Src<'_>, room: usize) {
    match src {
        Src::Own(b) if off == 0 && b.len() >= data.len() => *data = b,
        Src::Own(b) => put_shared(data, off, &b, room),
        Src::Copy(d) => put_shared(data, off, d, room),
    }
}

/// [`put`] into a chunk's shared buffer: in place when nobody else holds
/// it, else into a copy.
fn put_shared(data: &mut Bytes, off: usize, src: &[u8], room: usize) {
    let mut v = Vec::from(std::mem::take(data));
    put(&mut v, off, src, room);
    *data = Bytes::from(v);
}

/// Writes `src` at `off` of `data`, growing it (zero-filled gap) as needed;
/// bytes written over are not zeroed first. A buffer that must grow gets
/// room for `room` bytes at once (at least the write's end), so that it
/// is moved once, not at each of the writes that fill it.
fn put(data: &mut Vec<u8>, off: usize, src: &[u8], room: usize) {
    let end = off + src.len();
    if end > data.capacity() {
        if room >= end {
            data.reserve_exact(room - data.len());
        } else {
            // (one allocation for the gap and the bytes, not one each)
            data.reserve(end - data.len());
        }
    }
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
        for room in [0, 4, 64] {
            let mut d = Vec::new();
            put(&mut d, 3, b"ab", room);
            assert_eq!(d, b"\0\0\0ab");
            put(&mut d, 1, b"xy", room);
            assert_eq!(d, b"\0xyab");
            put(&mut d, 4, b"123", room);
            assert_eq!(d, b"\0xya123");
            put(&mut d, 0, b"Z", room);
            assert_eq!(d, b"Zxya123");
            put(&mut d, 7, b"!", room);
            assert_eq!(d, b"Zxya123!");
        }
    }

    /// A data chunk filled by pieces (IOR-hard's records) is allocated
    /// once, at its first write, in whatever order the pieces come; a
    /// first chunk grows as a `Vec` does.
    #[test]
    fn a_chunk_filled_by_pieces_is_allocated_once() {
        let cs = 65536;
        for pieces in [[(0, 18528), (18528, 47008)], [(18528, 47008), (0, 18528)]] {
            let mut d = Vec::new();
            let mut at = None;
            for (off, len) in pieces {
                put(&mut d, off, &vec![7u8; len], cs);
                assert_eq!(d.capacity(), cs);
                assert_eq!(*at.get_or_insert(d.as_ptr()), d.as_ptr());
            }
            assert_eq!(d, vec![7u8; cs]);
        }
        let mut d = Vec::new();
        put(&mut d, 0, &[1; 3901], 0);
        assert!(d.capacity() < cs);
    }
}
