//! Results: per-phase figures, the JSON record of a run, the final table
//! and an SVG chart (system vs reference, per phase).

use serde::{Deserialize, Serialize};

use crate::pattern::{Kind, Phase};
use crate::score::Score;
use crate::worker::{Params, TargetSpec};

const GIB: f64 = (1u64 << 30) as f64;

/// One phase on one target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PhaseResult {
    /// IO500 name.
    pub name: String,
    /// Bandwidth or metadata.
    pub kind: Kind,
    /// Operations: transfers (ior), files (mdtest), entries examined (find).
    pub items: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Wall time from the start barrier to the last rank's end.
    pub secs: f64,
    /// GiB/s (bw) or kIOPS (md).
    pub rate: f64,
    /// Unit of `rate`.
    pub unit: String,
    /// Items per rank.
    pub per_rank: Vec<u64>,
    /// The stonewall stopped at least one rank.
    pub stonewalled: bool,
    /// The phase handled exactly what its source phase wrote, with the
    /// expected bytes (find: found exactly the expected files).
    pub valid: bool,
    /// What all ranks completed in each second of the phase (empty for
    /// find, which the leader runs).
    #[serde(default)]
    pub series: Vec<SeriesPoint>,
    /// Why the phase's figure may not be IO500-like (see
    /// [`PhaseResult::with_warnings`]).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// CPU time the pool's servers used during the phase, all of them
    /// together, in microseconds per item (transfer, record, file, entry
    /// examined); None for a directory, or when a server did not say.
    #[serde(default)]
    pub server_cpu_us: Option<f64>,
}

/// One second of a phase, all ranks together.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct SeriesPoint {
    /// Items completed in this second.
    pub items: u64,
    /// Bytes moved in this second.
    pub bytes: u64,
    /// The rate in this second, in the phase's unit (GiB/s or kIOPS); the
    /// last second counts only as much of it as the phase lasted.
    pub rate: f64,
}

impl PhaseResult {
    /// Computes the rate of a phase.
    pub fn new(
        phase: Phase,
        items: u64,
        bytes: u64,
        secs: f64,
        per_rank: Vec<u64>,
        stonewalled: bool,
        valid: bool,
    ) -> Self {
        let kind = phase.kind();
        let secs = secs.max(1e-9);
        let (rate, unit) = match kind {
            Kind::Bw => (bytes as f64 / secs / GIB, "GiB/s"),
            Kind::Md => (items as f64 / secs / 1000.0, "kIOPS"),
        };
        PhaseResult {
            name: phase.name().to_string(),
            kind,
            items,
            bytes,
            secs,
            rate,
            unit: unit.to_string(),
            per_rank,
            stonewalled,
            valid,
            series: Vec::new(),
            warnings: Vec::new(),
            server_cpu_us: None,
        }
    }

    /// Adds the servers' CPU time over the phase (ns; None: not known).
    pub fn with_server_cpu(mut self, ns: Option<u64>) -> Self {
        self.server_cpu_us = ns.map(|ns| ns as f64 / 1e3 / self.items.max(1) as f64);
        self
    }

    /// Adds the warnings of a phase that did not measure the way IO500
    /// runs: a write/create phase that ran out of items before the
    /// stonewall stopped it (its figure is dominated by start-up), and an
    /// ior phase that moved less than 1 GiB per rank (caches and start-up
    /// weigh in).
    pub fn with_warnings(mut self, phase: Phase, p: &Params) -> Self {
        if phase.is_write() && !self.stonewalled && p.stonewall_secs > 0.0 {
            let option = match phase {
                Phase::IorEasyWrite => "--easy-segments",
                Phase::IorHardWrite => "--hard-records",
                Phase::MdtestEasyWrite => "--easy-files",
                _ => "--hard-files",
            };
            self.warnings.push(format!(
                "ran out of items after {:.2} s, before the {} s stonewall: start-up-dominated (raise {option})",
                self.secs, p.stonewall_secs
            ));
        }
        let per_rank = self.bytes as f64 / p.nprocs.max(1) as f64 / GIB;
        if self.kind == Kind::Bw && per_rank < 1.0 {
            self.warnings.push(format!(
                "moved {per_rank:.3} GiB per rank, less than 1 GiB: caches and start-up weigh in"
            ));
        }
        self
    }

    /// Adds the per-second series: `per_sec[i]` = items and bytes all
    /// ranks completed in second `i`.
    pub fn with_series(mut self, per_sec: &[[u64; 2]]) -> Self {
        let n = per_sec.len();
        self.series = per_sec
            .iter()
            .enumerate()
            .map(|(i, &[items, bytes])| {
                // the last second: as much of it as the phase lasted
                let width = if i + 1 == n {
                    (self.secs - i as f64).clamp(0.05, 1.0)
                } else {
                    1.0
                };
                let rate = match self.kind {
                    Kind::Bw => bytes as f64 / width / GIB,
                    Kind::Md => items as f64 / width / 1000.0,
                };
                SeriesPoint { items, bytes, rate }
            })
            .collect();
        self
    }
}

/// Find's answer against the files known to match.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct FindCheck {
    /// Entries examined.
    pub examined: u64,
    /// Files found.
    pub found: u64,
    /// Files that match by construction.
    pub expected: u64,
}

/// Shared-file open storm: every rank opens the ior-hard file at once.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct OpenStorm {
    /// Ranks that opened it.
    pub ranks: usize,
    /// Slowest open, seconds.
    pub max_secs: f64,
    /// Fastest open, seconds.
    pub min_secs: f64,
}

/// All phases on one target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TargetResult {
    /// "system" or "reference".
    pub label: String,
    /// What was measured.
    pub target: TargetSpec,
    /// The twelve phases in IO500 order.
    pub phases: Vec<PhaseResult>,
    /// IO500 score.
    pub score: Score,
    /// Find check.
    pub find: FindCheck,
    /// Open storm.
    pub open_storm: OpenStorm,
    /// What `--prefault` wrote and deleted before the phases.
    #[serde(default)]
    pub prefault: Option<Prefault>,
}

/// `--prefault` on one target: each rank touched its buffers and wrote
/// and deleted a file of `bytes_per_rank`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Prefault {
    /// Bytes each rank wrote and deleted.
    pub bytes_per_rank: u64,
    /// Wall time of it, seconds.
    pub secs: f64,
}

/// A phase's rate on the system divided by the reference's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Ratio {
    /// Phase (or "bandwidth", "metadata", "score").
    pub name: String,
    /// system / reference.
    pub ratio: f64,
}

/// Everything about one invocation (the JSON result file).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    /// "chfs-bench".
    pub tool: String,
    /// Version of chfs-bench.
    pub version: String,
    /// Host name of the leader.
    pub host: String,
    /// Start, seconds since the epoch.
    pub started_unix: u64,
    /// The command line of the run.
    pub command: Vec<String>,
    /// Parameters.
    pub params: Params,
    /// The measured system.
    pub system: TargetResult,
    /// The reference, if any.
    pub reference: Option<TargetResult>,
    /// Per-phase ratios system / reference, then the three score ratios.
    pub ratios: Vec<Ratio>,
    /// The round-trip floors measured in the same run (None: not
    /// measured).
    #[serde(default)]
    pub floors: Option<crate::floor::Floors>,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// The ratios of two targets.
pub fn ratios(sys: &TargetResult, reference: &TargetResult) -> Vec<Ratio> {
    let mut v: Vec<Ratio> = sys
        .phases
        .iter()
        .zip(&reference.phases)
        .map(|(a, b)| Ratio {
            name: a.name.clone(),
            ratio: ratio(a.rate, b.rate),
        })
        .collect();
    let (a, b) = (sys.score, reference.score);
    v.push(Ratio {
        name: "bandwidth".into(),
        ratio: ratio(a.bandwidth_gib_s, b.bandwidth_gib_s),
    });
    v.push(Ratio {
        name: "metadata".into(),
        ratio: ratio(a.metadata_kiops, b.metadata_kiops),
    });
    v.push(Ratio {
        name: "score".into(),
        ratio: ratio(a.score, b.score),
    });
    v
}

/// This machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn cell(p: &PhaseResult) -> String {
    let mark = if p.valid { "" } else { " INVALID" };
    format!("{:>10.3} {:<5}{mark}", p.rate, p.unit)
}

/// The final table (plain text).
pub fn table(run: &RunResult) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let r = run.reference.as_ref();
    let _ = writeln!(s, "system:    {}", run.system.target.describe());
    if let Some(r) = r {
        let _ = writeln!(s, "reference: {}", r.target.describe());
    }
    let _ = writeln!(
        s,
        "ranks {}{}  stonewall {} s  ior-easy transfer {} B",
        run.params.nprocs,
        if run.params.bind {
            " (one CPU each)"
        } else {
            ""
        },
        run.params.stonewall_secs,
        run.params.easy_xfer
    );
    let _ = write!(
        s,
        "{:<20} {:>16} {:>10} {:>8}",
        "phase", "system", "items", "secs"
    );
    if r.is_some() {
        let _ = write!(s, " {:>16} {:>8}", "reference", "ratio");
    }
    s.push('\n');
    for (i, p) in run.system.phases.iter().enumerate() {
        let _ = write!(
            s,
            "{:<20} {:>16} {:>10} {:>8.3}",
            p.name,
            cell(p),
            p.items,
            p.secs
        );
        if let Some(q) = r.and_then(|r| r.phases.get(i)) {
            let _ = write!(s, " {:>16} {:>8.2}", cell(q), ratio(p.rate, q.rate));
        }
        s.push('\n');
    }
    for t in std::iter::once(&run.system).chain(r) {
        if let Some(p) = &t.prefault {
            let _ = writeln!(
                s,
                "prefault: {}: touched each rank's buffers and wrote and deleted {:.2} GiB per rank ({:.2} s) before the phases",
                t.label,
                p.bytes_per_rank as f64 / GIB,
                p.secs
            );
        }
    }
    for t in std::iter::once(&run.system).chain(r) {
        for p in &t.phases {
            for w in &p.warnings {
                let _ = writeln!(s, "warning: {} {}: {w}", t.label, p.name);
            }
        }
    }
    let line = |s: &mut String, name: &str, f: fn(&Score) -> f64, unit: &str| {
        let a = f(&run.system.score);
        let _ = write!(s, "[SCORE] {:<12} {:>10.4} {:<5}", name, a, unit);
        if let Some(r) = r {
            let b = f(&r.score);
            let _ = write!(s, "  reference {:>10.4}  ratio {:>6.2}", b, ratio(a, b));
        }
        s.push('\n');
    };
    line(&mut s, "bandwidth", |x| x.bandwidth_gib_s, "GiB/s");
    line(&mut s, "metadata", |x| x.metadata_kiops, "kIOPS");
    line(&mut s, "score", |x| x.score, "");
    let f = &run.system.find;
    let _ = writeln!(
        s,
        "find: examined {}, found {} (expected {})",
        f.examined, f.found, f.expected
    );
    let storm = |t: &TargetResult| {
        format!(
            "{} ranks, open max {:.1} us, min {:.1} us",
            t.open_storm.ranks,
            t.open_storm.max_secs * 1e6,
            t.open_storm.min_secs * 1e6
        )
    };
    let _ = write!(s, "open storm: system {}", storm(&run.system));
    if let Some(r) = r {
        let _ = write!(s, "; reference {}", storm(r));
    }
    s.push('\n');
    if let Some(f) = &run.floors {
        s.push_str(&f.table());
        let _ = writeln!(
            s,
            "us per operation per rank: system {}",
            per_op(&run.system, run.params.nprocs)
        );
        if let Some(r) = r {
            let _ = writeln!(
                s,
                "                           reference {}",
                per_op(r, run.params.nprocs)
            );
        }
        if let Some(line) = against_streams(&run.system, f) {
            s.push_str(&line);
        }
    }
    for t in std::iter::once(&run.system).chain(r) {
        if let Some(line) = server_cpu(t) {
            s.push_str(&line);
        }
    }
    s
}

/// The servers' CPU time per item of each phase of a pool (None: a
/// directory, or not known).
fn server_cpu(t: &TargetResult) -> Option<String> {
    let each: Vec<String> = t
        .phases
        .iter()
        .filter_map(|p| Some(format!("{} {:.1}", p.name, p.server_cpu_us?)))
        .collect();
    (!each.is_empty()).then(|| {
        format!(
            "server CPU, us per item (transfer, record, file; all servers): {} {}\n",
            t.label,
            each.join(", ")
        )
    })
}

/// ior-easy's bandwidth as a share of what the connections of its path
/// carried in the stream test of the same run, and ior-easy-write's as a
/// share of the fresh-memory fill of the same run (None: not measured).
fn against_streams(t: &TargetResult, f: &crate::floor::Floors) -> Option<String> {
    let (path, gib) = f.pool_streams()?;
    let share = |name: &str, of: f64| {
        t.phases
            .iter()
            .find(|p| p.name == name)
            .map_or("-".to_string(), |p| format!("{:.2}", ratio(p.rate, of)))
    };
    let mut s = format!(
        "ior-easy of the system against its path's 1 MiB streams ({path}, {gib:.2} GiB/s): write {}, read {}\n",
        share("ior-easy-write", gib),
        share("ior-easy-read", gib)
    );
    // Writes of new data into a memory store (or tmpfs) fill fresh
    // memory: their other ceiling on this machine.
    if let Some(m) = f.fresh_memory {
        s += &format!(
            "ior-easy-write of the system against fresh memory (first touch {:.2}, again {:.2} GiB/s): {}, {}\n",
            m.first_touch,
            m.again,
            share("ior-easy-write", m.first_touch),
            share("ior-easy-write", m.again)
        );
    }
    Some(s)
}

/// Each metadata phase's time per operation and rank, in µs.
fn per_op(t: &TargetResult, nprocs: usize) -> String {
    t.phases
        .iter()
        .filter(|p| p.kind == Kind::Md && p.name != "find" && p.rate > 0.0)
        .map(|p| {
            let us = nprocs as f64 / (p.rate * 1e3) * 1e6;
            format!("{} {us:.1}", p.name.trim_start_matches("mdtest-"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG chart: one row per phase, a bar for the system and one for the
/// reference, each as long as its rate relative to the larger of the two,
/// labelled with the rate and the ratio.
pub fn svg(run: &RunResult) -> String {
    use std::fmt::Write;
    let rows = run.system.phases.len() + 3;
    let (left, barw, rowh) = (170.0, 420.0, 34.0);
    let charts = series_charts(run);
    let h = 60.0 + rows as f64 * rowh + charts.len().div_ceil(CHART_COLS) as f64 * CHART_H;
    let w = left + barw + 200.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = match &run.reference {
        Some(r) => format!(
            "{} vs {}",
            run.system.target.describe(),
            r.target.describe()
        ),
        None => run.system.target.describe(),
    };
    let _ = writeln!(
        s,
        r#"<text x="10" y="20" font-size="14">chfs-bench: {} ({} ranks)</text>"#,
        esc(&title),
        run.params.nprocs
    );
    let _ = writeln!(
        s,
        r##"<rect x="10" y="30" width="12" height="10" fill="#3566a8"/><text x="26" y="39">system</text><rect x="90" y="30" width="12" height="10" fill="#e08a2c"/><text x="106" y="39">reference</text>"##
    );
    let mut entries: Vec<(String, f64, Option<f64>, String)> = Vec::new();
    for (i, p) in run.system.phases.iter().enumerate() {
        let q = run
            .reference
            .as_ref()
            .and_then(|r| r.phases.get(i))
            .map(|q| q.rate);
        entries.push((p.name.clone(), p.rate, q, p.unit.clone()));
    }
    let sc = |t: &TargetResult| t.score;
    let rs = run.reference.as_ref().map(sc);
    entries.push((
        "bandwidth".into(),
        run.system.score.bandwidth_gib_s,
        rs.map(|x| x.bandwidth_gib_s),
        "GiB/s".into(),
    ));
    entries.push((
        "metadata".into(),
        run.system.score.metadata_kiops,
        rs.map(|x| x.metadata_kiops),
        "kIOPS".into(),
    ));
    entries.push((
        "score".into(),
        run.system.score.score,
        rs.map(|x| x.score),
        String::new(),
    ));
    for (i, (name, a, b, unit)) in entries.iter().enumerate() {
        let y = 50.0 + i as f64 * rowh;
        let max = a.max(b.unwrap_or(0.0)).max(1e-12);
        let _ = writeln!(s, r#"<text x="10" y="{}">{}</text>"#, y + 16.0, esc(name));
        let wa = barw * a / max;
        let _ = writeln!(
            s,
            r##"<rect class="sys" x="{left}" y="{y}" width="{wa:.1}" height="13" fill="#3566a8"/><text x="{:.1}" y="{}">{a:.3} {unit}</text>"##,
            left + wa + 4.0,
            y + 11.0
        );
        if let Some(b) = b {
            let wb = barw * b / max;
            let _ = writeln!(
                s,
                r##"<rect class="ref" x="{left}" y="{}" width="{wb:.1}" height="13" fill="#e08a2c"/><text x="{:.1}" y="{}">{b:.3} {unit} (x{:.2})</text>"##,
                y + 15.0,
                left + wb + 4.0,
                y + 26.0,
                ratio(*a, *b)
            );
        }
    }
    let top = 60.0 + rows as f64 * rowh;
    for (k, c) in charts.iter().enumerate() {
        let x = 10.0 + (k % CHART_COLS) as f64 * CHART_W;
        let y = top + (k / CHART_COLS) as f64 * CHART_H;
        series_chart(&mut s, c, x, y);
    }
    s.push_str("</svg>\n");
    s
}

const CHART_COLS: usize = 3;
const CHART_W: f64 = 260.0;
const CHART_H: f64 = 130.0;

/// One phase's per-second rates on the system and the reference.
struct SeriesChart<'a> {
    name: &'a str,
    unit: &'a str,
    sys: Vec<f64>,
    reference: Option<Vec<f64>>,
}

/// A chart for every phase with a per-second series.
fn series_charts(run: &RunResult) -> Vec<SeriesChart<'_>> {
    let rates = |p: &PhaseResult| p.series.iter().map(|x| x.rate).collect::<Vec<f64>>();
    run.system
        .phases
        .iter()
        .enumerate()
        .map(|(i, p)| SeriesChart {
            name: &p.name,
            unit: &p.unit,
            sys: rates(p),
            reference: run
                .reference
                .as_ref()
                .and_then(|r| r.phases.get(i))
                .map(rates),
        })
        .filter(|c| !c.sys.is_empty() || c.reference.as_ref().is_some_and(|r| !r.is_empty()))
        .collect()
}

/// Draws `c` at (`x`, `y`): the rate in each second as a step line, the
/// system in blue and the reference in orange, from 0 to the largest rate.
fn series_chart(s: &mut String, c: &SeriesChart, x: f64, y: f64) {
    use std::fmt::Write;
    let (pw, ph) = (CHART_W - 60.0, CHART_H - 50.0);
    let (px, py) = (x + 40.0, y + 22.0);
    let secs = c
        .sys
        .len()
        .max(c.reference.as_ref().map_or(0, Vec::len))
        .max(1);
    let max = c
        .sys
        .iter()
        .chain(c.reference.iter().flatten())
        .cloned()
        .fold(0.0, f64::max)
        .max(1e-12);
    let _ = writeln!(
        s,
        r#"<text x="{x}" y="{}">{} per second ({})</text>"#,
        y + 14.0,
        esc(c.name),
        esc(c.unit)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{px}" y="{py}" width="{pw}" height="{ph}" fill="none" stroke="#999"/><text x="{}" y="{}" text-anchor="end" font-size="10">{max:.3}</text><text x="{}" y="{}" text-anchor="end" font-size="10">0</text><text x="{}" y="{}" text-anchor="end" font-size="10">{secs} s</text>"##,
        px - 3.0,
        py + 9.0,
        px - 3.0,
        py + ph,
        px + pw,
        py + ph + 12.0
    );
    let line = |s: &mut String, v: &[f64], class: &str, color: &str| {
        if v.is_empty() {
            return;
        }
        let mut pts = String::new();
        for (i, r) in v.iter().enumerate() {
            let yy = py + ph - ph * r / max;
            let x0 = px + pw * i as f64 / secs as f64;
            let x1 = px + pw * (i + 1) as f64 / secs as f64;
            let _ = write!(pts, "{x0:.1},{yy:.1} {x1:.1},{yy:.1} ");
        }
        let _ = writeln!(
            s,
            r#"<polyline class="{class}" points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
            pts.trim_end()
        );
    };
    line(s, &c.sys, "series-sys", "#3566a8");
    if let Some(r) = &c.reference {
        line(s, r, "series-ref", "#e08a2c");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn target(label: &str, scale: f64) -> TargetResult {
        let one_second = [[(1000.0 * scale) as u64, (GIB * scale) as u64]];
        let phases: Vec<PhaseResult> = Phase::ALL
            .iter()
            .map(|&p| {
                PhaseResult::new(
                    p,
                    (1000.0 * scale) as u64,
                    (GIB * scale) as u64,
                    1.0,
                    vec![1],
                    false,
                    true,
                )
                .with_series(if p == Phase::Find {
                    &[][..]
                } else {
                    &one_second
                })
            })
            .collect();
        let bw: Vec<f64> = phases
            .iter()
            .filter(|p| p.kind == Kind::Bw)
            .map(|p| p.rate)
            .collect();
        let md: Vec<f64> = phases
            .iter()
            .filter(|p| p.kind == Kind::Md)
            .map(|p| p.rate)
            .collect();
        TargetResult {
            label: label.into(),
            target: TargetSpec::Posix {
                dir: PathBuf::from("/x<y"),
            },
            score: crate::score::score(&bw, &md),
            phases,
            find: FindCheck::default(),
            open_storm: OpenStorm {
                ranks: 2,
                max_secs: 1e-3,
                min_secs: 1e-4,
            },
            prefault: Some(Prefault {
                bytes_per_rank: 3 << 29,
                secs: 0.5,
            }),
        }
    }

    fn run() -> RunResult {
        let sys = target("system", 2.0);
        let reference = target("reference", 1.0);
        RunResult {
            tool: "chfs-bench".into(),
            version: "0".into(),
            host: hostname(),
            started_unix: 0,
            command: vec!["chfs-bench".into()],
            params: Params {
                nprocs: 2,
                stonewall_secs: 1.0,
                easy_xfer: 1 << 20,
                easy_max_segments: 1,
                hard_max_records: 1,
                md_easy_max: 1,
                md_hard_max: 1,
                shift: 1,
                prefault: true,
                bind: false,
            },
            ratios: ratios(&sys, &reference),
            system: sys,
            reference: Some(reference),
            floors: Some(crate::floor::Floors {
                unix_same_cpu: 8.0,
                tcp_same_cpu: 14.0,
                rpc_tcp: Some(20.0),
                unix_streams: Some(8.0),
                tcp_streams: Some(4.0),
                fresh_memory: Some(crate::floor::FreshMemory {
                    first_touch: 1.0,
                    again: 4.0,
                    huge_pages: 2.0,
                }),
                stream_pairs: 2,
                pool_path: Some("tcp".into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_table_puts_each_metadata_phase_per_operation_next_to_the_floors() {
        let t = table(&run());
        assert!(t.contains("32-byte ping-pong, TCP"), "{t}");
        // 1000 items in 1 s by 2 ranks: 2,000 us per operation per rank
        // on the system (scale 2: 2000 items), 2,000 on the reference.
        let line = t
            .lines()
            .find(|l| l.starts_with("us per operation per rank: system"))
            .unwrap_or_else(|| panic!("{t}"));
        assert!(line.contains("easy-write 1000.0"), "{line}");
        assert!(!line.contains("find"), "{line}");
        assert!(t.contains("reference easy-write 2000.0"), "{t}");
        // 2 GiB/s against TCP streams of 4 GiB/s
        assert!(
            t.contains("1 MiB streams, 2 at once (GiB/s): Unix socket 8.00, TCP 4.00"),
            "{t}"
        );
        assert!(
            t.contains("(TCP, 4.00 GiB/s): write 0.50, read 0.50"),
            "{t}"
        );
        // and against fresh memory filled at 1 GiB/s
        assert!(
            t.contains("fresh memory filled, 2 at once (GiB/s): first touch 1.00, again 4.00, again on huge pages 2.00"),
            "{t}"
        );
        assert!(
            t.contains(
                "ior-easy-write of the system against fresh memory (first touch 1.00, again 4.00 GiB/s): 2.00, 0.50"
            ),
            "{t}"
        );
    }

    #[test]
    fn series_rates_are_per_second_and_the_last_second_counts_what_ran() {
        // 1.5 s: a full second, then half a second
        let p = PhaseResult::new(Phase::IorEasyWrite, 3, 3 << 30, 1.5, vec![3], false, true)
            .with_series(&[[2, 2 << 30], [1, 1 << 30]]);
        let rates: Vec<f64> = p.series.iter().map(|x| x.rate).collect();
        assert_eq!(rates, vec![2.0, 2.0]);
        assert_eq!((p.series[1].items, p.series[1].bytes), (1, 1 << 30));
        let p = PhaseResult::new(
            Phase::MdtestEasyWrite,
            5000,
            0,
            2.0,
            vec![5000],
            false,
            true,
        )
        .with_series(&[[3000, 0], [2000, 0]]);
        let rates: Vec<f64> = p.series.iter().map(|x| x.rate).collect();
        assert_eq!(rates, vec![3.0, 2.0]);
        // old JSON without series still reads
        let mut j = serde_json::to_value(&p).unwrap();
        j.as_object_mut().unwrap().remove("series");
        let back: PhaseResult = serde_json::from_value(j).unwrap();
        assert!(back.series.is_empty());
    }

    #[test]
    fn svg_draws_a_per_second_chart_for_each_phase_with_a_series() {
        let s = svg(&run());
        // find has no series: 11 charts, a line for each side
        assert_eq!(s.matches(r#"class="series-sys""#).count(), 11);
        assert_eq!(s.matches(r#"class="series-ref""#).count(), 11);
        assert!(s.contains("ior-easy-write per second (GiB/s)"), "{s}");
        assert!(s.contains("mdtest-easy-write per second (kIOPS)"), "{s}");
        assert!(!s.contains("find per second"), "{s}");
        // ior-easy-write's one second: the system (2 GiB/s, the larger)
        // at the top of the chart, the reference (1 GiB/s) half way down
        let ys = |class: &str| -> Vec<f64> {
            let l = s.lines().find(|l| l.contains(class)).unwrap();
            l.split('"')
                .nth(3)
                .unwrap()
                .split(' ')
                .map(|p| p.split(',').nth(1).unwrap().parse().unwrap())
                .collect()
        };
        let (a, b) = (ys(r#"class="series-sys""#), ys(r#"class="series-ref""#));
        assert_eq!(a.len(), 2);
        assert_eq!((a[0], b[0]), (a[1], b[1]));
        let (top, height) = (60.0 + 15.0 * 34.0 + 22.0, CHART_H - 50.0);
        assert_eq!(a[0], top);
        assert_eq!(b[0], top + height / 2.0);
    }

    #[test]
    fn warnings_for_short_writes_and_small_ior_phases() {
        let mut params = run().params;
        params.stonewall_secs = 30.0;
        params.nprocs = 2;
        let warn = |phase, bytes, stonewalled| {
            PhaseResult::new(phase, 10, bytes, 4.0, vec![5, 5], stonewalled, true)
                .with_warnings(phase, &params)
                .warnings
        };
        // stopped by the stonewall, 2 GiB per rank: nothing to say
        assert!(warn(Phase::IorEasyWrite, 4 << 30, true).is_empty());
        // out of items before the stonewall
        let w = warn(Phase::IorEasyWrite, 4 << 30, false);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("before the 30 s stonewall") && w[0].contains("--easy-segments"));
        let w = warn(Phase::MdtestHardWrite, 0, false);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("--hard-files"), "{w:?}");
        // reads are not bounded by the stonewall; 1 GiB per rank is enough
        assert!(warn(Phase::IorHardRead, 2 << 30, false).is_empty());
        assert!(warn(Phase::MdtestEasyStat, 0, false).is_empty());
        // less than 1 GiB per rank on an ior phase, read or write
        let w = warn(Phase::IorHardRead, (2 << 30) - 1, false);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("less than 1 GiB"), "{w:?}");
        assert_eq!(warn(Phase::IorHardWrite, 1 << 30, false).len(), 2);
        // the table lists them, with the target
        let mut r = run();
        r.system.phases[0] = r.system.phases[0]
            .clone()
            .with_warnings(Phase::IorEasyWrite, &params);
        let t = table(&r);
        assert!(
            t.contains("warning: system ior-easy-write: ran out of items after 1.00 s"),
            "{t}"
        );
        // 2 GiB by 2 ranks: 1 GiB per rank is enough
        assert!(!t.contains("moved"), "{t}");
        assert_eq!(t.matches("warning:").count(), 1, "{t}");
    }

    #[test]
    fn rates_units_and_ratios() {
        let p = PhaseResult::new(Phase::IorEasyWrite, 3, 3 << 30, 2.0, vec![3], false, true);
        assert_eq!((p.rate, p.unit.as_str()), (1.5, "GiB/s"));
        let p = PhaseResult::new(Phase::MdtestHardStat, 5000, 0, 0.5, vec![5000], false, true);
        assert_eq!((p.rate, p.unit.as_str()), (10.0, "kIOPS"));
        let r = run();
        assert_eq!(r.ratios.len(), 15);
        for x in &r.ratios {
            assert!((x.ratio - 2.0).abs() < 1e-9, "{x:?}");
        }
    }

    #[test]
    fn json_round_trips_and_table_lists_every_phase() {
        let r = run();
        let j = serde_json::to_string(&r).unwrap();
        let back: RunResult = serde_json::from_str(&j).unwrap();
        assert_eq!(back, r);
        let t = table(&r);
        for p in Phase::ALL {
            assert!(t.contains(p.name()), "{t}");
        }
        assert!(t.contains("[SCORE] score"));
        assert!(
            t.contains("prefault: system: touched each rank's buffers and wrote and deleted 1.50 GiB per rank (0.50 s)"),
            "{t}"
        );
        assert!(t.contains("prefault: reference: "), "{t}");
        let j: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(j["params"]["prefault"], true);
        assert_eq!(j["system"]["prefault"]["bytes_per_rank"], 3u64 << 29);
    }

    #[test]
    fn svg_has_two_bars_per_row_and_escapes() {
        let s = svg(&run());
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches(r#"class="sys""#).count(), 15);
        assert_eq!(s.matches(r#"class="ref""#).count(), 15);
        assert!(s.contains("/x&lt;y"));
        assert!(!s.contains("/x<y"));
        // system twice the reference: full bar and half bar
        assert!(s.contains(r#"width="420.0""#) && s.contains(r#"width="210.0""#));
    }
}
