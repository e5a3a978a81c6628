//! DRAM engine: the shared index ([`crate::index`]) over records held in
//! heap buffers.

use std::mem::MaybeUninit;

use bytes::Bytes;
use chfs_proto::Meta;

use crate::index::{Fill, Indexed, Medium, Record, Src, Write};
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
                put_src(&mut buf, off as usize, s, room)?;
                buf
            }
        };
        Ok(Held { meta, data })
    }

    fn write_into(&self, w: Write<'_>, rec: &mut Held) -> Result<Option<Held>> {
        let room = room(&w);
        put_src(&mut rec.data, w.off as usize, w.data, room)?;
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

    /// Bytes fetched from elsewhere go straight into the chunk's buffer,
    /// but for a whole chunk: that is fetched into its own buffer, which
    /// becomes the chunk (no copy either way), before the key is locked.
    fn fills_in_place(&self, off: u64, len: usize, chunk_size: u32) -> bool {
        !(off == 0 && len as u64 >= chunk_size as u64)
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
fn put_src(data: &mut Bytes, off: usize, src: Src<'_>, room: usize) -> Result<()> {
    match src {
        Src::Own(b) if off == 0 && b.len() >= data.len() => {
            *data = b;
            Ok(())
        }
        Src::Own(b) => put_shared(data, off, Piece::Slice(&b), room),
        Src::Copy(d) => put_shared(data, off, Piece::Slice(d), room),
        Src::Fill(f) => put_shared(data, off, Piece::Fill(f), room),
    }
}

/// [`put`] into a chunk's shared buffer: in place when nobody else holds
/// it, else into a copy.
fn put_shared(data: &mut Bytes, off: usize, src: Piece<'_>, room: usize) -> Result<()> {
    let mut v = Vec::from(std::mem::take(data));
    let r = put(&mut v, off, src, room);
    *data = Bytes::from(v);
    r
}

/// The bytes [`put`] writes: copied from a slice, or fetched into place.
enum Piece<'a> {
    Slice(&'a [u8]),
    Fill(Fill<'a>),
}

/// Writes `src` at `off` of `data`, growing it (zero-filled gap) as needed;
/// bytes written over are not zeroed first. A buffer that must grow gets
/// room for `room` bytes at once (at least the write's end), so that it
/// is moved once, not at each of the writes that fill it. A fetch that
/// fails leaves `data` as long as it was (some of the bytes it covered
/// within that length may have changed).
fn put(data: &mut Vec<u8>, off: usize, src: Piece<'_>, room: usize) -> Result<()> {
    let len = match &src {
        Piece::Slice(d) => d.len(),
        Piece::Fill(f) => f.len(),
    };
    let end = off + len;
    if end > data.capacity() {
        if room >= end {
            data.reserve_exact(room - data.len());
        } else {
            // (one allocation for the gap and the bytes, not one each)
            data.reserve(end - data.len());
        }
    }
    let fill = match src {
        Piece::Slice(src) => {
            if off >= data.len() {
                data.resize(off, 0);
                data.extend_from_slice(src);
            } else {
                let overlap = end.min(data.len());
                data[off..overlap].copy_from_slice(&src[..overlap - off]);
                data.extend_from_slice(&src[overlap - off..]);
            }
            return Ok(());
        }
        Piece::Fill(f) => f,
    };
    let old_len = data.len();
    if off > old_len {
        data.resize(off, 0);
    }
    // SAFETY: the capacity covers `off + len` (reserved above); the bytes
    // there, initialized (below the length) or not, are only written
    // through this view while `data` is not otherwise used.
    let dst = unsafe {
        std::slice::from_raw_parts_mut(data.as_mut_ptr().add(off).cast::<MaybeUninit<u8>>(), len)
    };
    if let Err(e) = fill.fetch_into(dst) {
        data.truncate(old_len);
        return Err(e);
    }
    // SAFETY: the bytes up to the old length, the zeroed gap and the
    // fetched bytes (all of them, by the fetch's `Ok`) are initialized.
    unsafe { data.set_len(end.max(old_len)) };
    Ok(())
}

#[cfg(test)]
mod put_tests {
    use super::{put, Piece};
    use crate::index::Fill;
    use crate::StoreError;

    #[test]
    fn put_overwrites_extends_and_zero_fills() {
        for room in [0, 4, 64] {
            let mut d = Vec::new();
            put(&mut d, 3, Piece::Slice(b"ab"), room).unwrap();
            assert_eq!(d, b"\0\0\0ab");
            put(&mut d, 1, Piece::Slice(b"xy"), room).unwrap();
            assert_eq!(d, b"\0xyab");
            put(&mut d, 4, Piece::Slice(b"123"), room).unwrap();
            assert_eq!(d, b"\0xya123");
            put(&mut d, 0, Piece::Slice(b"Z"), room).unwrap();
            assert_eq!(d, b"Zxya123");
            put(&mut d, 7, Piece::Slice(b"!"), room).unwrap();
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
                put(&mut d, off, Piece::Slice(&vec![7u8; len]), cs).unwrap();
                assert_eq!(d.capacity(), cs);
                assert_eq!(*at.get_or_insert(d.as_ptr()), d.as_ptr());
            }
            assert_eq!(d, vec![7u8; cs]);
        }
        let mut d = Vec::new();
        put(&mut d, 0, Piece::Slice(&[1; 3901]), 0).unwrap();
        assert!(d.capacity() < cs);
    }

    /// Writes `src` at `off` of `d` through a fetch that copies it.
    fn put_fetched(d: &mut Vec<u8>, off: usize, src: &[u8], room: usize) -> crate::Result<()> {
        let copy = |dst: &mut [std::mem::MaybeUninit<u8>]| {
            for (o, b) in dst.iter_mut().zip(src) {
                o.write(*b);
            }
            Ok(())
        };
        put(d, off, Piece::Fill(Fill::new(src.len(), &copy)), room)
    }

    /// Bytes fetched into place end up as copied ones do, whatever the
    /// overlap with what the buffer holds (over it, across its end, past
    /// it with a gap), with room or without.
    #[test]
    fn fetched_bytes_land_as_copied_ones() {
        let old: Vec<u8> = (1..=10).collect();
        for room in [0, 16, 64] {
            for off in 0..14 {
                for len in [0, 1, 3, 10, 12] {
                    let src: Vec<u8> = (0..len).map(|i| 100 + i as u8).collect();
                    let mut want = old.clone();
                    put(&mut want, off, Piece::Slice(&src), room).unwrap();
                    let mut got = old.clone();
                    put_fetched(&mut got, off, &src, room).unwrap();
                    assert_eq!(got, want, "off {off} len {len} room {room}");
                }
            }
        }
    }

    /// A fetch that fails leaves the buffer as long as it was: nothing of
    /// a gap or of bytes past its end shows.
    #[test]
    fn a_failed_fetch_leaves_the_length() {
        for off in [0, 4, 8, 12] {
            let mut d = vec![5u8; 8];
            let fail = |dst: &mut [std::mem::MaybeUninit<u8>]| {
                dst[0].write(9);
                Err(StoreError::refused(libc::EFAULT, "bad address"))
            };
            let e = put(&mut d, off, Piece::Fill(Fill::new(6, &fail)), 64).unwrap_err();
            assert_eq!(e.errno(), libc::EFAULT);
            assert_eq!(d.len(), 8, "off {off}");
        }
    }
}
