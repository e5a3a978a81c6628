//! CRC-32C (Castagnoli), continuable: `crc32c_append(crc32c(a), b) ==
//! crc32c(a ++ b)`, which lets engines extend a chunk's checksum when bytes
//! are appended without re-reading the chunk. The `crc32c` crate computes
//! it (the CPU's CRC instructions where it has them: SSE4.2, ARMv8, a table
//! otherwise); this module adds the zero runs holes need.

pub use crc32c::{crc32c, crc32c_append};

/// Continues `crc` over `n` zero bytes.
pub fn crc32c_zeros(mut crc: u32, mut n: u64) -> u32 {
    static ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        crc = crc32c_append(crc, &ZEROS[..k]);
        n -= k as u64;
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bit-at-a-time CRC-32C, the definition, to check the crate against.
    fn reference(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    #[test]
    fn known_vector_and_append() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(reference(b"123456789"), 0xE306_9283);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(crc32c(&data), reference(&data));
        for cut in [0, 1, 7, 8, 9, 500, 1000] {
            assert_eq!(
                crc32c_append(crc32c(&data[..cut]), &data[cut..]),
                crc32c(&data)
            );
        }
        assert_eq!(crc32c_zeros(crc32c(b"a"), 5000), {
            let mut v = b"a".to_vec();
            v.resize(5001, 0);
            crc32c(&v)
        });
    }
}
