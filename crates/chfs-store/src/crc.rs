//! CRC-32C (Castagnoli), continuable: `crc32c_append(crc32c(a), b) ==
//! crc32c(a ++ b)`, which lets engines extend a chunk's checksum when bytes
//! are appended without re-reading the chunk. Uses the SSE4.2 instruction
//! when the CPU has it, a table otherwise.

const POLY: u32 = 0x82F6_3B78;

const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// Continues `crc` (a CRC-32C of earlier bytes) over `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU supports SSE4.2 (checked just above).
            return !unsafe { hw(!crc, data) };
        }
    }
    !sw(!crc, data)
}

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

fn sw(mut c: u32, data: &[u8]) -> u32 {
    for &b in data {
        c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn hw(c: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = c as u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        c = _mm_crc32_u64(c, u64::from_le_bytes(a));
    }
    let mut c = c as u32;
    for &b in words.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector_and_append() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(!sw(!0, b"123456789"), 0xE306_9283);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
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
