//! Helpers shared by the server's integration tests: pools of real chfsd
//! processes and a client that speaks the wire protocol by hand (handshake,
//! frames, requests), so tests can send what no real client would.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
pub use chfs_localpool::{LocalPool, PoolOptions};
use chfs_proto::frame::{Header, FLAG_ERROR, HEADER_LEN};
use chfs_proto::handshake::{Auth, Connector, Credential, HelloReply, Role, Verdict};
use chfs_proto::msg::decode_error;
use chfs_proto::{Request, Response};

pub fn pool(n: usize, secret: Option<&str>) -> LocalPool {
    LocalPool::start_with(PoolOptions {
        servers: n,
        secret: secret.map(str::to_string),
        chfsd: Some(env!("CARGO_BIN_EXE_chfsd").into()),
        ..Default::default()
    })
    .unwrap()
}

pub fn raw(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Performs the handshake on `s` as a client with `secret` (a pool secret,
/// a client key file's text, or nothing); returns the status and message.
pub fn handshake(s: &mut (impl Read + Write), secret: &[u8]) -> (i32, String) {
    handshake_as(s, Role::Client, secret)
}

/// [`handshake`] as `role`.
pub fn handshake_as(s: &mut (impl Read + Write), role: Role, secret: &[u8]) -> (i32, String) {
    let cred = Credential::parse(secret).unwrap();
    let (c, hello) = match Connector::start(role, &cred) {
        Ok(x) => x,
        Err(e) => return (e.errno, e.message),
    };
    s.write_all(&hello).unwrap();
    let (version, status, msg, auth) = read_hello_reply(s).expect("a reply to the hello");
    let proof = match c.on_reply(version, status, &msg, &auth) {
        Ok(Some(p)) => p,
        Ok(None) => return (0, msg),
        Err(e) => return (e.errno, e.message),
    };
    s.write_all(&proof).unwrap();
    read_verdict(s).expect("a verdict")
}

/// The server's reply to a hello: protocol version, status, message and,
/// when it asks for a proof, its challenge (else `Auth::Open`); `None` if
/// the connection ends first or the reply is malformed.
pub fn read_hello_reply(s: &mut impl Read) -> Option<(u16, i32, String, Auth)> {
    let mut fixed = [0u8; HelloReply::FIXED_LEN];
    s.read_exact(&mut fixed).ok()?;
    let (version, status, n) = HelloReply::decode_fixed(&fixed).ok()?;
    let mut msg = vec![0u8; n];
    s.read_exact(&mut msg).ok()?;
    let msg = String::from_utf8_lossy(&msg).into_owned();
    if status != 0 {
        return Some((version, status, msg, Auth::Open));
    }
    let mut a = [0u8; 1];
    s.read_exact(&mut a).ok()?;
    if !HelloReply::decode_auth(a[0]).ok()? {
        return Some((version, status, msg, Auth::Open));
    }
    let mut ch = [0u8; HelloReply::CHALLENGE_LEN];
    s.read_exact(&mut ch).ok()?;
    Some((version, status, msg, HelloReply::decode_challenge(&ch)))
}

/// The server's verdict on a proof: status and message; `None` if the
/// connection ends first or the verdict is malformed.
pub fn read_verdict(s: &mut impl Read) -> Option<(i32, String)> {
    let mut fixed = [0u8; Verdict::FIXED_LEN];
    s.read_exact(&mut fixed).ok()?;
    let (status, n) = Verdict::decode_fixed(&fixed).ok()?;
    let mut msg = vec![0u8; n];
    s.read_exact(&mut msg).ok()?;
    Some((status, String::from_utf8_lossy(&msg).into_owned()))
}

/// Connects over TCP and completes the handshake; returns the reply status.
pub fn hello(addr: &str, secret: &[u8]) -> (TcpStream, i32, String) {
    let mut s = raw(addr);
    let (status, msg) = handshake(&mut s, secret);
    (s, status, msg)
}

pub fn send(s: &mut impl Write, id: u64, opcode: u16, payload: &[u8]) {
    send_flags(s, id, opcode, 0, payload)
}

pub fn send_flags(s: &mut impl Write, id: u64, opcode: u16, flags: u16, payload: &[u8]) {
    let h = Header {
        len: payload.len() as u32,
        id,
        op: opcode,
        flags,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(payload).unwrap();
}

pub fn recv(s: &mut impl Read) -> Option<(Header, Bytes)> {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).ok()?;
    let h = Header::decode(&hb).unwrap();
    let mut p = vec![0u8; h.len as usize];
    s.read_exact(&mut p).ok()?;
    Some((h, Bytes::from(p)))
}

pub fn call(
    s: &mut (impl Read + Write),
    id: u64,
    req: &Request,
) -> Result<Response, (i32, String)> {
    let mut p = Vec::new();
    req.encode(&mut p);
    send(s, id, req.op(), &p);
    reply(s, id)
}

pub fn reply(s: &mut impl Read, id: u64) -> Result<Response, (i32, String)> {
    let (h, payload) = recv(s).expect("reply");
    assert_eq!(h.id, id);
    if h.flags & FLAG_ERROR != 0 {
        let e = decode_error(payload).unwrap();
        Err((e.errno, e.message))
    } else {
        Ok(Response::decode(payload).unwrap())
    }
}

/// A read of all of chunk 0 of `path` (fileid 0, chunk size `cs`).
pub fn whole_chunk0(path: &str, cs: u32) -> Request {
    Request::Read {
        path: path.into(),
        fileid: 0,
        idx: 0,
        off: 0,
        len: cs,
        chunk_size: cs,
        flags: 0,
        epoch: 0,
    }
}

pub fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

pub fn still_serves(addr: &str) {
    let (mut s, status, _) = hello(addr, b"");
    assert_eq!(status, 0);
    assert_eq!(call(&mut s, 1, &Request::Ping), Ok(Response::Ok));
}

/// The local (Unix socket) connection a client on this host uses.
pub fn local(addr: &str) -> std::os::unix::net::UnixStream {
    let mut s = local_raw(addr);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(handshake(&mut s, b""), (0, String::new()));
    s
}

/// A connection to the local socket of the server at `addr`, before the
/// handshake.
pub fn local_raw(addr: &str) -> std::os::unix::net::UnixStream {
    use std::os::linux::net::SocketAddrExt;
    let name = chfs_proto::local_socket_name(addr);
    let sa = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    std::os::unix::net::UnixStream::connect_addr(&sa).unwrap()
}

/// A pool of one server with extra chfsd options.
pub fn pool_args(args: &[&str]) -> LocalPool {
    LocalPool::start_with(PoolOptions {
        servers: 1,
        args: args.iter().map(|a| a.to_string()).collect(),
        chfsd: Some(env!("CARGO_BIN_EXE_chfsd").into()),
        ..Default::default()
    })
    .unwrap()
}

pub fn status(addr: &str) -> chfs_proto::msg::ServerStatus {
    status_with(addr, b"")
}

/// Status of a server, asked over TCP with `secret` ([`handshake`]).
pub fn status_with(addr: &str, secret: &[u8]) -> chfs_proto::msg::ServerStatus {
    let (mut s, st, msg) = hello(addr, secret);
    assert_eq!(st, 0, "{msg}");
    match call(&mut s, 1, &Request::Status) {
        Ok(Response::Status(st)) => *st,
        other => panic!("{other:?}"),
    }
}

/// VmRSS of a process, in KiB.
#[allow(unused_imports)]
pub use chfs_localpool::rss_kib;
