//! A server's `ListTree` beside many directories: makes DIRS directories
//! with a file each under /pool (unless /pool exists), a 100-entry
//! subtree /sub (10 directories of 9 files), then times the listing of
//! /sub through [`Client::list_tree`] (one request per server) ROUNDS
//! times and prints the best and median in µs. Run against a pool of one
//! server to time one server holding DIRS directories. The pool is
//! `CHFS_SERVER` (and `CHFS_SECRET_FILE`).
//!
//! Usage: treescan [DIRS] [ROUNDS]

use std::time::Instant;

use chfs_client::{flags, Client};

fn main() {
    if let Err(e) = run() {
        eprintln!("treescan: {e}");
        std::process::exit(1);
    }
}

fn touch(c: &Client, p: &str) -> Result<(), Box<dyn std::error::Error>> {
    let fd = c.create(p, flags::O_WRONLY, 0o644)?;
    c.close(fd)?;
    Ok(())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dirs: usize = args.first().map_or(Ok(200_000), |s| s.parse())?;
    let rounds: usize = args.get(1).map_or(Ok(200), |s| s.parse())?;
    let c = Client::from_env()?;
    if c.stat("/pool").is_err() {
        let t = Instant::now();
        c.mkdir("/pool", 0o755)?;
        std::thread::scope(|s| -> Result<(), String> {
            let hs: Vec<_> = (0..4)
                .map(|w| {
                    let c = &c;
                    s.spawn(move || -> Result<(), String> {
                        for i in (w..dirs).step_by(4) {
                            let d = format!("/pool/e{i:07}");
                            c.mkdir(&d, 0o755).map_err(|e| e.to_string())?;
                            touch(c, &format!("{d}/f")).map_err(|e| e.to_string())?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in hs {
                h.join().map_err(|_| "panicked".to_string())??;
            }
            Ok(())
        })?;
        c.mkdir("/sub", 0o755)?;
        for d in 0..10 {
            c.mkdir(&format!("/sub/d{d}"), 0o755)?;
            for f in 0..9 {
                touch(&c, &format!("/sub/d{d}/f{f}"))?;
            }
        }
        eprintln!(
            "made {dirs} directories in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let mut us = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let l = c.list_tree("/sub", false)?.ok_or("no tree listing")?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(l.len(), 100);
    }
    us.sort_by(f64::total_cmp);
    println!(
        "{{\"dirs\": {dirs}, \"best_us\": {:.1}, \"median_us\": {:.1}}}",
        us[0],
        us[us.len() / 2]
    );
    Ok(())
}
