//! The environment variables CHFS users set, in one table, each parsed once
//! and validated by `chfs_init` (a bad value is an error, never a silent
//! default). `README.md` of this crate shows the same table; a unit test
//! keeps the two in step.

use std::path::PathBuf;
use std::time::Duration;

use chfs_client::ClientConfig;

/// One environment variable understood by libchfs.
pub struct EnvVar {
    /// Name.
    pub name: &'static str,
    /// Default, as text (documentation; README.md is checked against it).
    #[allow(dead_code)]
    pub default: &'static str,
    /// Accepted values (documentation; README.md is checked against it).
    #[allow(dead_code)]
    pub values: &'static str,
    /// What it does in chfs-rs (or that it has no effect yet).
    pub effect: &'static str,
}

/// Every environment variable read by `chfs_init`.
pub const ENV_VARS: &[EnvVar] = &[
    EnvVar {
        name: "CHFS_SERVER",
        default: "(required unless chfs_init gets a server)",
        values: "host:port[,host:port...]; a scheme prefix such as ofi+tcp:// is ignored",
        effect: "servers contacted first; the full server list is fetched from them",
    },
    EnvVar {
        name: "CHFS_CHUNK_SIZE",
        default: "65536",
        values: "1..=MAX_CHUNK_SIZE bytes",
        effect: "chunk size of files created by this process",
    },
    EnvVar {
        name: "CHFS_ASYNC_ACCESS",
        default: "1",
        values: "integer (0 = off)",
        effect: "issue the chunk RPCs of one read/write concurrently",
    },
    EnvVar {
        name: "CHFS_BUF_SIZE",
        default: "0",
        values: "bytes (0 = off)",
        effect: "per-descriptor client write buffer: small writes are aggregated into one request",
    },
    EnvVar {
        name: "CHFS_READ_AHEAD",
        default: "1048576",
        values: "bytes (0 = off)",
        effect: "strided read-ahead per descriptor: once reads of one length follow a constant stride (sequential too), the next records up to this many bytes come in one request per chunk and the following reads need no round trip; kept by that descriptor, at most 1 s, dropped at fsync and when this process changes the file",
    },
    EnvVar {
        name: "CHFS_RPC_TIMEOUT_MSEC",
        default: "30000",
        values: "milliseconds (0 = 30000)",
        effect: "a request unanswered for this long fails with ETIMEDOUT",
    },
    EnvVar {
        name: "CHFS_NODE_LIST_CACHE_TIMEOUT",
        default: "120",
        values: "seconds",
        effect: "how long the server list is cached before it is fetched again",
    },
    EnvVar {
        name: "CHFS_LOG_PRIORITY",
        default: "(off)",
        values: "emerg, alert, crit, err, warning, notice, info, debug, or 0-7",
        effect:
            "messages of this priority or higher go to stderr; unset = the library prints nothing",
    },
    EnvVar {
        name: "CHFS_LOOKUP_LOCAL",
        default: "0",
        values: "0 or 1",
        effect: "relayed lookups: open and stat go to a server on this host (its contact cache or the owner), see the client settings (chfs_client::config::SETTINGS)",
    },
    EnvVar {
        name: "CHFS_LOOKUP_RELAY_GROUP",
        default: "0",
        values: "integer >= 0",
        effect: "group number for relayed lookups (N >= 2; 0 or 1 = direct): open and stat go to a server of this process's group, see the client settings",
    },
    EnvVar {
        name: "CHFS_LOOKUP_RELAY_GROUP_AUTO",
        default: "0",
        values: "0 or 1",
        effect: "1 = relayed lookups with the group number set automatically (ceil(sqrt(servers)))",
    },
    EnvVar {
        name: "CHFS_BACKEND_PATH",
        default: "(none)",
        values: "an existing directory",
        effect:
            "validated only, no effect in the library: cache mode is the servers' job (chfsd --backend, or CHFS_BACKEND_PATH in chfsd's environment)",
    },
    EnvVar {
        name: "CHFS_SUBDIR_PATH",
        default: "(none)",
        values: "a path",
        effect: "chfs_stagein puts what it stages in under this directory",
    },
    EnvVar {
        name: "CHFS_POSIX_FLAGS",
        default: "0",
        values: "0 or 1",
        effect: "0: chfs_open ignores its flags and chfs_create creates or truncates, as in CHFS; 1: both take open(2) flags (access mode enforced, O_EXCL, O_TRUNC only when given)",
    },
    EnvVar {
        name: "CHFS_RDMA_THRESH",
        default: "32768",
        values: "bytes",
        effect: "over a fabric transport (servers at ofi+ addresses, chfsd -p ofi+tcp): chunk data of at least this many bytes moves by the server's RMA instead of in the message; over TCP no effect (a Unix socket to servers on this host copies large writes from the process's memory, `CHFS_CMA`)",
    },
];

/// Values set through `chfs_set_*` before `chfs_init`; an environment
/// variable that is set overrides them (as in CHFS).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `chfs_set_chunk_size`.
    pub chunk_size: Option<u32>,
    /// `chfs_set_buf_size`.
    pub buf_size: Option<usize>,
    /// `chfs_set_async_access`.
    pub async_access: Option<bool>,
    /// `chfs_set_rpc_timeout_msec`.
    pub rpc_timeout_msec: Option<u64>,
    /// `chfs_set_node_list_cache_timeout`.
    pub node_list_cache_timeout: Option<u64>,
    /// `chfs_set_rdma_thresh`.
    pub rdma_thresh: Option<u64>,
}

impl Overrides {
    /// Nothing set.
    pub const NONE: Overrides = Overrides {
        chunk_size: None,
        buf_size: None,
        async_access: None,
        rpc_timeout_msec: None,
        node_list_cache_timeout: None,
        rdma_thresh: None,
    };
}

/// Everything `chfs_init` derives from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Client configuration (servers, chunk size, buffers, timeouts).
    pub client: ClientConfig,
    /// Highest syslog priority logged (None = silent).
    pub log_level: Option<u8>,
    /// `CHFS_RDMA_THRESH` (also in `client.rdma_thresh`).
    pub rdma_thresh: u64,
    /// `CHFS_BACKEND_PATH` (accepted, unused by the library).
    pub backend_path: Option<PathBuf>,
    /// `CHFS_SUBDIR_PATH`, normalised (`/` when unset).
    pub subdir_path: String,
    /// `CHFS_POSIX_FLAGS=1`: `chfs_open` / `chfs_create` take open(2)
    /// flags instead of ignoring them as CHFS does.
    pub posix_flags: bool,
}

/// Syslog priority names, index = level.
const PRIORITIES: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];

/// Name of a log level.
pub fn priority_name(level: u8) -> &'static str {
    PRIORITIES.get(level as usize).copied().unwrap_or("debug")
}

fn invalid(var: &str, value: &str, why: &str) -> chfs_client::Error {
    chfs_client::Error::new(libc::EINVAL, format!("{var}={value:?}: {why}"))
}

fn parse_priority(v: &str) -> Result<u8, chfs_client::Error> {
    let l = v.trim().to_ascii_lowercase();
    let l = l.strip_prefix("log_").unwrap_or(&l);
    let alias = match l {
        "error" => "err",
        "warn" => "warning",
        "emergency" => "emerg",
        "critical" => "crit",
        other => other,
    };
    if let Some(i) = PRIORITIES.iter().position(|p| *p == alias) {
        return Ok(i as u8);
    }
    match l.parse::<u8>() {
        Ok(n) if n < 8 => Ok(n),
        _ => Err(invalid(
            "CHFS_LOG_PRIORITY",
            v,
            "expected emerg, alert, crit, err, warning, notice, info, debug or 0-7",
        )),
    }
}

fn parse_int<T: std::str::FromStr>(
    var: &str,
    v: &str,
    what: &str,
) -> Result<T, chfs_client::Error> {
    v.trim().parse().map_err(|_| invalid(var, v, what))
}

fn parse_bool(var: &str, v: &str) -> Result<bool, chfs_client::Error> {
    match v.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(invalid(var, v, "expected 0 or 1")),
    }
}

impl Settings {
    /// Reads every variable through `get` (an empty value counts as unset,
    /// as in CHFS), applying `ov` where the variable is unset, and `server`
    /// (the argument of `chfs_init`) in place of `CHFS_SERVER` when given.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        ov: &Overrides,
        server: Option<&str>,
    ) -> Result<Self, chfs_client::Error> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        // Checked here too so that the message names the variable.
        if let Some(v) = get("CHFS_CHUNK_SIZE") {
            let max = chfs_proto::MAX_CHUNK_SIZE;
            let cs: u64 = parse_int("CHFS_CHUNK_SIZE", &v, "expected a size in bytes")?;
            if cs == 0 || cs > u64::from(max) {
                return Err(invalid(
                    "CHFS_CHUNK_SIZE",
                    &v,
                    &format!("chunk size out of range 1..={max}"),
                ));
            }
        }
        let mut client = ClientConfig::from_lookup(get)?;
        if let Some(s) = server.filter(|s| !s.trim().is_empty()) {
            client.servers = chfs_client::config::parse_servers(s);
        }
        if client.servers.is_empty() {
            return Err(chfs_client::Error::new(
                libc::EINVAL,
                "no server: chfs_init(NULL) needs CHFS_SERVER",
            ));
        }
        if get("CHFS_CHUNK_SIZE").is_none() {
            if let Some(cs) = ov.chunk_size {
                client.set_chunk_size(cs as u64)?;
            }
        }
        if get("CHFS_BUF_SIZE").is_none() {
            if let Some(b) = ov.buf_size {
                client.buf_size = b;
            }
        }
        if get("CHFS_ASYNC_ACCESS").is_none() {
            if let Some(a) = ov.async_access {
                client.async_access = a;
            }
        }
        if get("CHFS_RPC_TIMEOUT_MSEC").is_none() {
            if let Some(ms) = ov.rpc_timeout_msec {
                client.rpc_timeout = Duration::from_millis(if ms == 0 { 30_000 } else { ms });
            }
        }
        if get("CHFS_NODE_LIST_CACHE_TIMEOUT").is_none() {
            if let Some(s) = ov.node_list_cache_timeout {
                client.node_list_cache_timeout = Duration::from_secs(s);
            }
        }
        let log_level = get("CHFS_LOG_PRIORITY")
            .map(|v| parse_priority(&v))
            .transpose()?;
        let rdma_thresh = match get("CHFS_RDMA_THRESH") {
            Some(v) => parse_int("CHFS_RDMA_THRESH", &v, "expected a size in bytes")?,
            None => ov.rdma_thresh.unwrap_or(32768),
        };
        client.rdma_thresh = usize::try_from(rdma_thresh).unwrap_or(usize::MAX).max(1);
        let backend_path = match get("CHFS_BACKEND_PATH") {
            Some(v) => {
                let p = PathBuf::from(&v);
                match std::fs::metadata(&p) {
                    Ok(m) if m.is_dir() => Some(p),
                    Ok(_) => {
                        return Err(chfs_client::Error::new(
                            libc::ENOTDIR,
                            format!("CHFS_BACKEND_PATH={v:?}: not a directory"),
                        ))
                    }
                    Err(e) => {
                        return Err(chfs_client::Error::new(
                            e.raw_os_error().unwrap_or(libc::ENOENT),
                            format!("CHFS_BACKEND_PATH={v:?}: {e}"),
                        ))
                    }
                }
            }
            None => None,
        };
        let subdir_path = match get("CHFS_SUBDIR_PATH") {
            Some(v) => chfs_proto::path::normalize(&v)
                .map_err(|e| invalid("CHFS_SUBDIR_PATH", &v, &e.message))?,
            None => "/".to_string(),
        };
        let posix_flags = get("CHFS_POSIX_FLAGS")
            .map(|v| parse_bool("CHFS_POSIX_FLAGS", &v))
            .transpose()?
            .unwrap_or(false);
        Ok(Settings {
            client,
            log_level,
            rdma_thresh,
            backend_path,
            subdir_path,
            posix_flags,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(kv: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| kv.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn server_argument_wins_and_null_needs_env() {
        let s = Settings::from_lookup(
            env(&[("CHFS_SERVER", "a:1")]),
            &Overrides::default(),
            Some("b:2"),
        )
        .unwrap();
        assert_eq!(s.client.servers, ["b:2"]);
        let s = Settings::from_lookup(env(&[("CHFS_SERVER", "a:1")]), &Overrides::default(), None)
            .unwrap();
        assert_eq!(s.client.servers, ["a:1"]);
        let e = Settings::from_lookup(env(&[]), &Overrides::default(), None).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        let e = Settings::from_lookup(
            env(&[("CHFS_SERVER", " ")]),
            &Overrides::default(),
            Some(""),
        )
        .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
    }

    #[test]
    fn every_bad_value_is_an_error() {
        let bad = [
            ("CHFS_CHUNK_SIZE", "0"),
            ("CHFS_CHUNK_SIZE", "64k"),
            ("CHFS_BUF_SIZE", "-1"),
            ("CHFS_READ_AHEAD", "1M"),
            ("CHFS_ASYNC_ACCESS", "yes"),
            ("CHFS_RPC_TIMEOUT_MSEC", "1.5"),
            ("CHFS_NODE_LIST_CACHE_TIMEOUT", "x"),
            ("CHFS_LOG_PRIORITY", "loud"),
            ("CHFS_LOG_PRIORITY", "9"),
            ("CHFS_LOOKUP_LOCAL", "2"),
            ("CHFS_LOOKUP_RELAY_GROUP", "-3"),
            ("CHFS_LOOKUP_RELAY_GROUP_AUTO", "on"),
            ("CHFS_BACKEND_PATH", "/nonexistent/chfs/backend"),
            ("CHFS_RDMA_THRESH", "big"),
            ("CHFS_POSIX_FLAGS", "yes"),
        ];
        for (k, v) in bad {
            let kv = [("CHFS_SERVER", "h:1"), (k, v)];
            let r = Settings::from_lookup(env(&kv), &Overrides::default(), None);
            assert!(r.is_err(), "{k}={v} accepted");
        }
        for v in ["0", "64k", "67108865"] {
            let kv = [("CHFS_SERVER", "h:1"), ("CHFS_CHUNK_SIZE", v)];
            let e = Settings::from_lookup(env(&kv), &Overrides::default(), None).unwrap_err();
            assert!(
                e.message().starts_with(&format!("CHFS_CHUNK_SIZE={v:?}")),
                "{e}"
            );
        }
        let kv = [("CHFS_SERVER", "h:1"), ("CHFS_BACKEND_PATH", "/etc/passwd")];
        let e = Settings::from_lookup(env(&kv), &Overrides::default(), None).unwrap_err();
        assert_eq!(e.errno(), libc::ENOTDIR);
    }

    #[test]
    fn good_values_are_taken_and_env_overrides_setters() {
        let kv = [
            ("CHFS_SERVER", "h:1"),
            ("CHFS_CHUNK_SIZE", "4096"),
            ("CHFS_LOG_PRIORITY", "Warning"),
            ("CHFS_LOOKUP_LOCAL", "1"),
            ("CHFS_SUBDIR_PATH", "stage//in/"),
            ("CHFS_RDMA_THRESH", ""),
        ];
        let ov = Overrides {
            chunk_size: Some(8192),
            buf_size: Some(1000),
            ..Default::default()
        };
        let s = Settings::from_lookup(env(&kv), &ov, None).unwrap();
        assert_eq!(s.client.chunk_size, 4096, "env wins over the setter");
        assert_eq!(s.client.buf_size, 1000, "setter used where env is unset");
        assert_eq!(s.log_level, Some(4));
        assert_eq!(s.client.lookup, chfs_client::Lookup::Local);
        assert_eq!(s.subdir_path, "/stage/in");
        assert_eq!(s.rdma_thresh, 32768, "empty value = unset");
        assert!(!s.posix_flags, "CHFS calling conventions by default");
        let kv = [("CHFS_SERVER", "h:1"), ("CHFS_POSIX_FLAGS", "1")];
        let s = Settings::from_lookup(env(&kv), &Overrides::default(), None).unwrap();
        assert!(s.posix_flags);
    }

    #[test]
    fn readme_documents_every_variable() {
        let readme = include_str!("../README.md");
        for v in ENV_VARS {
            assert!(
                readme.contains(&format!("| `{}` |", v.name)),
                "{} missing from README.md",
                v.name
            );
            let row = format!(
                "| `{}` | {} | {} | {} |",
                v.name, v.default, v.values, v.effect
            );
            assert!(readme.contains(&row), "README.md row differs: {row}");
        }
    }
}
