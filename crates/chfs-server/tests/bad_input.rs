//! Malformed, truncated, oversized and unauthenticated input on the wire:
//! the connection is closed with an error, the server keeps serving.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use chfs_localpool::{LocalPool, PoolOptions};
use chfs_proto::frame::{Header, FLAG_ERROR, HEADER_LEN, MAX_PAYLOAD};
use chfs_proto::handshake::{Hello, HelloReply};
use chfs_proto::msg::{decode_error, op};
use chfs_proto::{Meta, Request, Response};

fn pool(n: usize, secret: Option<&str>) -> LocalPool {
    LocalPool::start_with(PoolOptions {
        servers: n,
        secret: secret.map(str::to_string),
        chfsd: Some(env!("CARGO_BIN_EXE_chfsd").into()),
        ..Default::default()
    })
    .unwrap()
}

fn raw(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Connects and completes the handshake; returns the reply status.
fn hello(addr: &str, secret: &[u8]) -> (TcpStream, i32, String) {
    let mut s = raw(addr);
    s.write_all(&Hello::new(secret).encode()).unwrap();
    let mut fixed = [0u8; HelloReply::FIXED_LEN];
    s.read_exact(&mut fixed).unwrap();
    let (_, status, n) = HelloReply::decode_fixed(&fixed).unwrap();
    let mut msg = vec![0u8; n];
    s.read_exact(&mut msg).unwrap();
    (s, status, String::from_utf8_lossy(&msg).into_owned())
}

fn send(s: &mut TcpStream, id: u64, opcode: u16, payload: &[u8]) {
    let h = Header {
        len: payload.len() as u32,
        id,
        op: opcode,
        flags: 0,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(payload).unwrap();
}

fn recv(s: &mut TcpStream) -> Option<(Header, Bytes)> {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).ok()?;
    let h = Header::decode(&hb).unwrap();
    let mut p = vec![0u8; h.len as usize];
    s.read_exact(&mut p).ok()?;
    Some((h, Bytes::from(p)))
}

fn call(s: &mut TcpStream, id: u64, req: &Request) -> Result<Response, (i32, String)> {
    let mut p = Vec::new();
    req.encode(&mut p);
    send(s, id, req.op(), &p);
    let (h, payload) = recv(s).expect("reply");
    assert_eq!(h.id, id);
    if h.flags & FLAG_ERROR != 0 {
        let e = decode_error(payload).unwrap();
        Err((e.errno, e.message))
    } else {
        Ok(Response::decode(payload).unwrap())
    }
}

fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

fn still_serves(addr: &str) {
    let (mut s, status, _) = hello(addr, b"");
    assert_eq!(status, 0);
    assert_eq!(call(&mut s, 1, &Request::Ping), Ok(Response::Ok));
}

#[test]
fn garbage_instead_of_handshake() {
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let mut s = raw(addr);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(closed(&mut s));
    still_serves(addr);
}

#[test]
fn truncated_handshake_and_frames() {
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let mut s = raw(addr);
    s.write_all(&Hello::new(b"").encode()[..5]).unwrap();
    drop(s);
    let (mut s, _, _) = hello(addr, b"");
    s.write_all(
        &Header {
            len: 100,
            id: 1,
            op: op::STAT,
            flags: 0,
        }
        .encode()[..7],
    )
    .unwrap();
    drop(s);
    let (mut s, _, _) = hello(addr, b"");
    send(&mut s, 1, op::STAT, &[]);
    // Empty STAT payload: truncated message -> error reply, then close.
    let (h, payload) = recv(&mut s).unwrap();
    assert!(h.flags & FLAG_ERROR != 0);
    assert_eq!(decode_error(payload).unwrap().errno, libc::EPROTO);
    assert!(closed(&mut s));
    still_serves(addr);
}

#[test]
fn oversized_frame_closes_the_connection() {
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let (mut s, _, _) = hello(addr, b"");
    s.write_all(
        &Header {
            len: MAX_PAYLOAD + 1,
            id: 9,
            op: op::WRITE,
            flags: 0,
        }
        .encode(),
    )
    .unwrap();
    assert!(closed(&mut s));
    still_serves(addr);
}

#[test]
fn unknown_opcode_and_garbage_payload() {
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let (mut s, _, _) = hello(addr, b"");
    send(&mut s, 5, 4242, b"xyz");
    let (h, payload) = recv(&mut s).unwrap();
    assert_eq!(h.id, 5);
    assert_eq!(decode_error(payload).unwrap().errno, libc::EPROTO);
    assert!(closed(&mut s));
    let (mut s, _, _) = hello(addr, b"");
    send(&mut s, 6, op::CREATE, &[0xff; 200]);
    assert!(recv(&mut s).is_some_and(|(h, _)| h.flags & FLAG_ERROR != 0));
    still_serves(addr);
}

#[test]
fn wrong_secret_is_refused_and_logged() {
    let p = pool(1, Some("s3cret"));
    let addr = &p.addrs()[0];
    let (mut s, status, msg) = hello(addr, b"guess");
    assert_eq!(status, libc::EACCES);
    assert!(msg.contains("secret"), "{msg}");
    assert!(closed(&mut s));
    let (_, status, _) = hello(addr, b"");
    assert_eq!(status, libc::EACCES);
    let (mut s, status, _) = hello(addr, b"s3cret");
    assert_eq!(status, 0);
    assert_eq!(call(&mut s, 1, &Request::Ping), Ok(Response::Ok));
    let log = std::fs::read_to_string(p.log_dir().join("server0.log")).unwrap();
    assert!(
        log.contains("connection refused"),
        "refusal is logged: {log}"
    );
}

#[test]
fn unnormalised_paths_and_bad_chunk_sizes_are_refused() {
    let p = pool(1, None);
    let (mut s, _, _) = hello(&p.addrs()[0], b"");
    for bad in ["/a/../etc", "relative", "/a//b", "/a/", "/./a"] {
        let r = call(&mut s, 1, &Request::Stat { path: bad.into() });
        assert_eq!(r.unwrap_err().0, libc::EINVAL, "{bad}");
    }
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 0,
        ..Default::default()
    };
    let r = call(
        &mut s,
        2,
        &Request::Create {
            path: "/f".into(),
            meta,
            excl: true,
            data: Bytes::new(),
        },
    );
    assert_eq!(r.unwrap_err().0, libc::EINVAL);
    let meta = Meta {
        chunk_size: 100,
        ..meta
    };
    call(
        &mut s,
        3,
        &Request::Create {
            path: "/f".into(),
            meta,
            excl: true,
            data: Bytes::new(),
        },
    )
    .unwrap();
    let w = Request::Write {
        path: "/f".into(),
        fileid: 0,
        chunk_size: 100,
        mode: meta.mode,
        idx: 0,
        off: 90,
        flags: 0,
        data: Bytes::from(vec![1u8; 20]),
    };
    assert_eq!(
        call(&mut s, 4, &w).unwrap_err().0,
        libc::EINVAL,
        "crossing the chunk boundary"
    );
    let w = Request::Write {
        path: "/f".into(),
        fileid: 0,
        chunk_size: 64,
        mode: meta.mode,
        idx: 0,
        off: 0,
        flags: 0,
        data: Bytes::from(vec![1u8; 20]),
    };
    assert_eq!(
        call(&mut s, 5, &w).unwrap_err().0,
        libc::EINVAL,
        "wrong chunk size"
    );
}

#[test]
fn requests_reaching_a_non_owner_are_forwarded() {
    let p = pool(3, None);
    let mut conns: Vec<TcpStream> = p.addrs().iter().map(|a| hello(a, b"").0).collect();
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 10,
        fileid: 7,
        ..Default::default()
    };
    // Everything through server 0, whoever owns the keys.
    let s = &mut conns[0];
    for i in 0..6 {
        let path = format!("/f{i}");
        call(
            s,
            1,
            &Request::Create {
                path: path.clone(),
                meta,
                excl: true,
                data: Bytes::new(),
            },
        )
        .unwrap();
        for idx in 0..3u64 {
            let w = Request::Write {
                path: path.clone(),
                fileid: 7,
                chunk_size: 10,
                mode: meta.mode,
                idx,
                off: 0,
                flags: 0,
                data: Bytes::from(vec![idx as u8 + 1; 10]),
            };
            assert_eq!(call(s, 2, &w), Ok(Response::Written(10)));
        }
        let r = call(
            s,
            3,
            &Request::Read {
                path: path.clone(),
                fileid: 7,
                idx: 2,
                off: 0,
                len: 10,
                chunk_size: 10,
                flags: 0,
            },
        );
        assert_eq!(r, Ok(Response::Data(Bytes::from(vec![3u8; 10]))));
    }
    let mut held = 0;
    for s in conns.iter_mut() {
        match call(s, 9, &Request::Status).unwrap() {
            Response::Status(st) => {
                assert!(st.entries < 24, "not everything on one server");
                held += st.entries;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        held, 18,
        "6 entries + 12 data chunks, each stored once at its owner"
    );
}

#[test]
fn a_stalled_client_does_not_block_others() {
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let _stalled = raw(addr);
    let (mut half, _, _) = hello(addr, b"");
    half.write_all(
        &Header {
            len: 1000,
            id: 1,
            op: op::WRITE,
            flags: 0,
        }
        .encode(),
    )
    .unwrap();
    still_serves(addr);
}
