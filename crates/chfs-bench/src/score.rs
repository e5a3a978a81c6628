//! IO500 scoring: bandwidth = geometric mean of the four ior phases (GiB/s),
//! metadata = geometric mean of the eight mdtest/find phases (kIOPS),
//! score = sqrt(bandwidth x metadata). And the figures the other
//! measurements share: [`mib_s`], [`median`].

/// Bandwidth in MiB/s of `bytes` moved in `secs` seconds.
pub fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

/// The median of the rounds of a measurement (of an even number, the
/// upper of the two middle ones); `v` must not be empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Geometric mean; 0 if the slice is empty or holds a value that is not
/// positive (IO500 treats a failed phase as invalidating the score).
pub fn geomean(values: &[f64]) -> f64 {
    if values.is_empty()
        || values
            .iter()
            .any(|v| v.is_nan() || *v <= 0.0 || v.is_infinite())
    {
        return 0.0;
    }
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}

/// The three IO500 figures.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Score {
    /// Geometric mean of the ior phases, GiB/s.
    pub bandwidth_gib_s: f64,
    /// Geometric mean of the metadata phases, kIOPS.
    pub metadata_kiops: f64,
    /// sqrt(bandwidth x metadata).
    pub score: f64,
}

/// Computes the score from the bandwidth phases (GiB/s) and the metadata
/// phases (kIOPS).
pub fn score(bw_gib_s: &[f64], md_kiops: &[f64]) -> Score {
    let b = geomean(bw_gib_s);
    let m = geomean(md_kiops);
    Score {
        bandwidth_gib_s: b,
        metadata_kiops: m,
        score: (b * m).sqrt(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn median_and_mib_s() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(close(mib_s(3 << 20, 2.0), 1.5));
        assert!(mib_s(1 << 20, 0.0).is_finite());
    }

    #[test]
    fn geomean_by_hand() {
        assert!(close(geomean(&[2.0, 8.0]), 4.0));
        assert!(close(geomean(&[1.0, 10.0, 100.0]), 10.0));
        assert!(close(geomean(&[5.0]), 5.0));
        assert_eq!(geomean(&[]), 0.0);
        assert_eq!(geomean(&[1.0, 0.0]), 0.0);
        assert_eq!(geomean(&[1.0, f64::NAN]), 0.0);
    }

    #[test]
    fn io500_score_by_hand() {
        // bandwidth: (1*2*4*8)^(1/4) = 64^(1/4) = 2.828427...
        // metadata: (2^8 * 3^0 ...) -> all 16 = 16; score = sqrt(2.828427*16)
        let s = score(&[1.0, 2.0, 4.0, 8.0], &[16.0; 8]);
        assert!(close(s.bandwidth_gib_s, 2f64.powf(1.5)));
        assert!(close(s.metadata_kiops, 16.0));
        assert!(close(s.score, (2f64.powf(1.5) * 16.0).sqrt()));
        // Oakforest-PACS style numbers: bw (10,20,40,80) -> 28.2843,
        // md (1,2,4,8,16,32,64,128) -> 2^3.5 = 11.3137; score = sqrt(320) = 17.8885
        let s = score(
            &[10.0, 20.0, 40.0, 80.0],
            &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0],
        );
        assert!(close(s.bandwidth_gib_s, 28.284271247461902));
        assert!(close(s.metadata_kiops, 11.313708498984761));
        assert!(close(s.score, 320f64.sqrt()));
    }

    #[test]
    fn failed_phase_zeroes_score() {
        let s = score(&[1.0, 2.0, 0.0, 8.0], &[16.0; 8]);
        assert_eq!(s.bandwidth_gib_s, 0.0);
        assert_eq!(s.score, 0.0);
    }
}
