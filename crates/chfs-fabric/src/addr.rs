//! Protocol names (Mercury's, as CHFS's `-p`) and address strings that
//! can stand in `CHFS_SERVER`: `ofi+tcp://127.0.0.1:40001`,
//! `ofi+tcp://[::1]:40001`, or for providers whose addresses are not IP
//! socket addresses the raw name in hex, `ofi+shm://x66695f...`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use crate::error::Error;

/// A libfabric transport as CHFS names it (`chfsd -p ofi+tcp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// `ofi+tcp`: the tcp provider under `ofi_rxm` (reliable datagrams over
    /// connected TCP sockets).
    Tcp,
    /// `ofi+sockets`: the older sockets provider.
    Sockets,
    /// `ofi+shm`: shared memory between the processes of one host.
    Shm,
    /// `ofi+verbs`: InfiniBand / RoCE verbs under `ofi_rxm`.
    Verbs,
    /// `ofi+cxi`: HPE Slingshot.
    Cxi,
    /// `ofi+efa`: AWS Elastic Fabric Adapter.
    Efa,
    /// `ofi+psm3`: Intel's PSM3 (Ethernet / RoCE).
    Psm3,
}

impl Protocol {
    /// Every protocol, in the order [`Protocol::name`] lists them.
    pub const ALL: [Protocol; 7] = [
        Protocol::Tcp,
        Protocol::Sockets,
        Protocol::Shm,
        Protocol::Verbs,
        Protocol::Cxi,
        Protocol::Efa,
        Protocol::Psm3,
    ];

    /// Mercury's name (`ofi+tcp`).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "ofi+tcp",
            Protocol::Sockets => "ofi+sockets",
            Protocol::Shm => "ofi+shm",
            Protocol::Verbs => "ofi+verbs",
            Protocol::Cxi => "ofi+cxi",
            Protocol::Efa => "ofi+efa",
            Protocol::Psm3 => "ofi+psm3",
        }
    }

    /// The libfabric provider (as `fi_info -p` takes it) that carries it:
    /// connection-oriented providers under the `ofi_rxm` utility for
    /// reliable datagram endpoints.
    pub fn provider(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp;ofi_rxm",
            Protocol::Sockets => "sockets",
            Protocol::Shm => "shm",
            Protocol::Verbs => "verbs;ofi_rxm",
            Protocol::Cxi => "cxi",
            Protocol::Efa => "efa",
            Protocol::Psm3 => "psm3",
        }
    }

    /// Whether its addresses are IP socket addresses (written
    /// `host:port`); others are written as hex.
    pub fn ip_addresses(self) -> bool {
        matches!(self, Protocol::Tcp | Protocol::Sockets | Protocol::Verbs)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Protocol {
    type Err = Error;

    fn from_str(s: &str) -> Result<Protocol, Error> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::BadAddress {
                input: s.to_string(),
                why: format!(
                    "not a libfabric protocol (one of {})",
                    Protocol::ALL.map(Protocol::name).join(", ")
                ),
            })
    }
}

/// An endpoint's address: its protocol and libfabric's name for it (what
/// `fi_getname` gives and `fi_av_insert` takes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    /// The protocol.
    pub protocol: Protocol,
    /// The provider's name of the endpoint.
    pub raw: Vec<u8>,
}

impl Address {
    /// The IP socket address, where the name is one.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        decode_sockaddr(&self.raw)
    }
}

/// `AF_INET` and `AF_INET6` as stored in a sockaddr (host byte order).
const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;
/// Sizes of `struct sockaddr_in` and `struct sockaddr_in6`.
const SOCKADDR_IN_LEN: usize = 16;
const SOCKADDR_IN6_LEN: usize = 28;

/// A `struct sockaddr_in` / `sockaddr_in6` in bytes.
fn encode_sockaddr(sa: SocketAddr) -> Vec<u8> {
    match sa {
        SocketAddr::V4(v4) => {
            let mut b = vec![0u8; SOCKADDR_IN_LEN];
            b[0..2].copy_from_slice(&AF_INET.to_ne_bytes());
            b[2..4].copy_from_slice(&v4.port().to_be_bytes());
            b[4..8].copy_from_slice(&v4.ip().octets());
            b
        }
        SocketAddr::V6(v6) => {
            let mut b = vec![0u8; SOCKADDR_IN6_LEN];
            b[0..2].copy_from_slice(&AF_INET6.to_ne_bytes());
            b[2..4].copy_from_slice(&v6.port().to_be_bytes());
            b[4..8].copy_from_slice(&v6.flowinfo().to_be_bytes());
            b[8..24].copy_from_slice(&v6.ip().octets());
            b[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
            b
        }
    }
}

fn decode_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes(b.get(0..2)?.try_into().ok()?);
    let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
    match (family, b.len()) {
        (AF_INET, SOCKADDR_IN_LEN) => {
            let ip: [u8; 4] = b[4..8].try_into().ok()?;
            Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port))
        }
        (AF_INET6, SOCKADDR_IN6_LEN) => {
            let ip: [u8; 16] = b[8..24].try_into().ok()?;
            let scope = u32::from_ne_bytes(b[24..28].try_into().ok()?);
            let flow = u32::from_be_bytes(b[4..8].try_into().ok()?);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                flow,
                scope,
            )))
        }
        _ => None,
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.protocol.name())?;
        match self.socket_addr() {
            Some(sa) => write!(f, "{sa}"),
            None => {
                f.write_str("x")?;
                self.raw.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

impl FromStr for Address {
    type Err = Error;

    /// Parses `ofi+PROTOCOL://HOST:PORT` (an IP address, not a host name:
    /// it must name the endpoint exactly) or `ofi+PROTOCOL://xHEX`.
    fn from_str(s: &str) -> Result<Address, Error> {
        let bad = |why: String| Error::BadAddress {
            input: s.to_string(),
            why,
        };
        let (proto, rest) = s.split_once("://").ok_or_else(|| {
            bad("expected PROTOCOL://ADDRESS, e.g. ofi+tcp://127.0.0.1:40001".into())
        })?;
        let protocol: Protocol = proto.parse().map_err(|e: Error| match e {
            Error::BadAddress { why, .. } => bad(format!("{proto:?} is {why}")),
            other => other,
        })?;
        if rest.is_empty() {
            return Err(bad("no address after ://".into()));
        }
        let raw = if let Some(hex) = rest.strip_prefix('x') {
            if hex.is_empty() || hex.len() % 2 != 0 {
                return Err(bad(
                    "a raw address is x followed by an even number of hex digits".into(),
                ));
            }
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .map_err(|_| bad(format!("{hex:?} is not hex")))?
        } else {
            if !protocol.ip_addresses() {
                return Err(bad(format!(
                    "{} addresses are written x followed by hex (as the endpoint prints them)",
                    protocol.name()
                )));
            }
            let sa: SocketAddr = rest.parse().map_err(|_| {
                bad(format!(
                    "{rest:?} is not IP:PORT (e.g. 127.0.0.1:40001 or [::1]:40001)"
                ))
            })?;
            if sa.port() == 0 {
                return Err(bad("port 0 names no endpoint".into()));
            }
            encode_sockaddr(sa)
        };
        Ok(Address { protocol, raw })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_addresses_round_trip() {
        for s in [
            "ofi+tcp://127.0.0.1:40001",
            "ofi+verbs://[::1]:7",
            "ofi+tcp://[fe80::1%3]:9",
        ] {
            let a: Address = s.parse().unwrap();
            let back = a.to_string();
            let again: Address = back.parse().unwrap();
            assert_eq!(a, again, "{s} -> {back}");
        }
        let a: Address = "ofi+tcp://127.0.0.1:40001".parse().unwrap();
        assert_eq!(a.to_string(), "ofi+tcp://127.0.0.1:40001");
        assert_eq!(a.raw.len(), SOCKADDR_IN_LEN);
        assert_eq!(a.protocol.provider(), "tcp;ofi_rxm");
    }

    #[test]
    fn raw_addresses_round_trip() {
        let a = Address {
            protocol: Protocol::Shm,
            raw: b"fi_shm://1234\0".to_vec(),
        };
        let s = a.to_string();
        assert!(s.starts_with("ofi+shm://x6669"), "{s}");
        assert_eq!(s.parse::<Address>().unwrap(), a);
    }

    #[test]
    fn malformed_addresses_say_what_is_wrong() {
        let cases = [
            ("127.0.0.1:40001", "PROTOCOL://"),
            ("tcp://127.0.0.1:40001", "not a libfabric protocol"),
            ("ofi+carrier-pigeon://1.2.3.4:5", "not a libfabric protocol"),
            ("ofi+tcp://", "no address"),
            ("ofi+tcp://localhost:40001", "not IP:PORT"),
            ("ofi+tcp://127.0.0.1", "not IP:PORT"),
            ("ofi+tcp://127.0.0.1:0", "port 0"),
            ("ofi+tcp://127.0.0.1:70000", "not IP:PORT"),
            ("ofi+shm://127.0.0.1:5", "hex"),
            ("ofi+shm://x123", "even number"),
            ("ofi+shm://xzz", "not hex"),
        ];
        for (input, want) in cases {
            let err = input.parse::<Address>().unwrap_err();
            assert!(
                matches!(&err, Error::BadAddress { input: i, .. } if i == input),
                "{input}: {err:?}"
            );
            assert!(err.to_string().contains(want), "{input}: {err}");
            assert_eq!(err.errno(), libc::EINVAL);
        }
    }

    #[test]
    fn protocol_names() {
        for p in Protocol::ALL {
            assert_eq!(p.name().parse::<Protocol>().unwrap(), p);
        }
        assert!("tcp".parse::<Protocol>().is_err());
    }
}
