//! Malformed, truncated, oversized and unauthenticated input on the wire:
//! the connection is closed with an error, the server keeps serving.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use chfs_localpool::{LocalPool, PoolOptions};
use chfs_proto::frame::{CmaRef, Header, FLAG_CMA, FLAG_ERROR, FLAG_LAND, MAX_PAYLOAD};
use chfs_proto::handshake::{Connector, Credential, Hello, HelloReply, Role, Verdict};
use chfs_proto::msg::{decode_error, op};
use chfs_proto::{Meta, Request, Response};

mod common;
use common::*;

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
    s.write_all(&Connector::start(Role::Client, &Credential::None).unwrap().1[..5])
        .unwrap();
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
    // An opcode it does not know (a newer client's): refused, and the
    // connection goes on.
    send(&mut s, 5, 4242, b"xyz");
    let (h, payload) = recv(&mut s).unwrap();
    assert_eq!(h.id, 5);
    let e = decode_error(payload).unwrap();
    assert_eq!(e.errno, libc::EPROTO);
    assert!(e.message.contains("4242"), "{}", e.message);
    assert_eq!(call(&mut s, 7, &Request::Ping), Ok(Response::Ok));
    // A known opcode with a payload that does not decode: refused, and
    // the connection closed.
    send(&mut s, 6, op::CREATE, &[0xff; 200]);
    assert!(recv(&mut s).is_some_and(|(h, _)| h.flags & FLAG_ERROR != 0));
    assert!(closed(&mut s));
    still_serves(addr);
}

#[test]
fn wrong_secret_is_refused_and_logged() {
    let p = pool(1, Some("s3cret"));
    let addr = &p.addrs()[0];
    // A client with another secret finds the server's proof wrong and
    // goes no further.
    let (s, status, msg) = hello(addr, b"guess");
    assert_eq!(status, libc::EACCES);
    assert!(msg.contains("secret"), "{msg}");
    drop(s);
    // Without any: refused by the server, which says what to set.
    let (mut s, status, msg) = hello(addr, b"");
    assert_eq!(status, libc::EACCES);
    assert!(msg.contains("CHFS_SECRET_FILE"), "{msg}");
    assert!(closed(&mut s));
    // A proof that is not the key's: refused by the server.
    let mut s = raw(addr);
    let (_, hello_bytes) =
        Connector::start(Role::Client, &Credential::parse(b"any").unwrap()).unwrap();
    s.write_all(&hello_bytes).unwrap();
    let mut reply = [0u8; HelloReply::FIXED_LEN + 1 + HelloReply::CHALLENGE_LEN];
    s.read_exact(&mut reply).unwrap();
    s.write_all(&[0u8; 32]).unwrap();
    let mut v = [0u8; Verdict::FIXED_LEN];
    s.read_exact(&mut v).unwrap();
    let (status, n) = Verdict::decode_fixed(&v).unwrap();
    assert_eq!(status, libc::EACCES);
    let mut msg = vec![0u8; n];
    s.read_exact(&mut msg).unwrap();
    assert!(String::from_utf8_lossy(&msg).contains("failed"));
    assert!(closed(&mut s));
    let (mut s, status, _) = hello(addr, b"s3cret");
    assert_eq!(status, 0);
    assert_eq!(call(&mut s, 1, &Request::Ping), Ok(Response::Ok));
    let log = std::fs::read_to_string(p.log_dir().join("server0.log")).unwrap();
    assert!(
        log.contains("connection refused"),
        "refusal is logged: {log}"
    );
}

/// A client of an older release (an older protocol version with the same
/// hello, as after an upgrade of the servers only) is told which versions
/// differ, not cut off mid-handshake; so is one of a newer release.
#[test]
fn a_client_of_another_release_is_told_the_versions() {
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    for version in [
        chfs_proto::handshake::FIXED_HELLO_SINCE,
        chfs_proto::PROTOCOL_VERSION - 1,
        chfs_proto::PROTOCOL_VERSION + 1,
    ] {
        let mut s = raw(addr);
        let hello = Hello {
            version,
            role: Role::Client,
            has_key: true,
            nonce: [7; chfs_proto::handshake::NONCE_LEN],
        };
        s.write_all(&hello.encode()).unwrap();
        let mut fixed = [0u8; HelloReply::FIXED_LEN];
        s.read_exact(&mut fixed)
            .unwrap_or_else(|e| panic!("version {version}: no answer: {e}"));
        let (_, status, n) = HelloReply::decode_fixed(&fixed).unwrap();
        assert_eq!(status, libc::EPROTO, "version {version}");
        let mut msg = vec![0u8; n];
        s.read_exact(&mut msg).unwrap();
        let msg = String::from_utf8_lossy(&msg);
        assert!(
            msg.contains(&format!("protocol version {version} not supported"))
                && msg.contains(&format!("speaks version {}", chfs_proto::PROTOCOL_VERSION)),
            "{msg}"
        );
        assert!(closed(&mut s));
    }
    still_serves(addr);
}

/// An application holding the client key (what chfsctl hands out) may not
/// stop the pool or change its membership; a server or the administrator
/// (the pool secret) may. Forwarded requests are for servers.
#[test]
fn roles_limit_what_a_connection_may_ask() {
    let p = pool(2, Some("pool-secret"));
    let addr = &p.addrs()[0];
    let key = Credential::client_key_file(b"pool-secret");
    let mut s = raw(addr);
    assert_eq!(handshake_as(&mut s, Role::Client, key.as_bytes()).0, 0);
    let list = match call(&mut s, 1, &Request::GetServers) {
        Ok(Response::Servers(l)) => l,
        other => panic!("{other:?}"),
    };
    let refused = [
        Request::Shutdown,
        Request::Join {
            addr: "10.9.9.9:1".into(),
            fresh: false,
        },
        Request::UpdateServers { list: list.clone() },
        Request::Rebalance { start: true },
        Request::AdoptChunk {
            path: "/x".into(),
            idx: 1,
            meta: Meta::default(),
            data: Bytes::new(),
        },
        Request::PutChunk {
            path: "/x".into(),
            idx: 1,
            meta: Meta::default(),
            data: Bytes::new(),
        },
        // A relayed lookup's server-to-server part: registering as a
        // contact and dropping a contact's answers.
        Request::WatchStat {
            path: "/x".into(),
            contact: "10.9.9.9:1".into(),
            keep_ms: 1000,
        },
        Request::Invalidate { path: "/x".into() },
    ];
    for (i, req) in refused.iter().enumerate() {
        let r = call(&mut s, 10 + i as u64, req);
        assert_eq!(r.unwrap_err().0, libc::EPERM, "{req:?}");
    }
    // Forwarded flag: for servers only.
    let mut payload = Vec::new();
    Request::Stat { path: "/".into() }.encode(&mut payload);
    send_flags(
        &mut s,
        30,
        op::STAT,
        chfs_proto::frame::FLAG_FORWARDED,
        &payload,
    );
    assert_eq!(reply(&mut s, 30).unwrap_err().0, libc::EPERM);
    // File operations are the client's, relayed lookups too (the contact
    // asks the owner as a server).
    assert!(call(&mut s, 31, &Request::Stat { path: "/".into() }).is_ok());
    for i in 0..8 {
        let r = call(
            &mut s,
            40 + i,
            &Request::Lookup {
                path: format!("/relayed{i}"),
                max_age_ms: 1000,
            },
        );
        assert_eq!(r.unwrap_err().0, libc::ENOENT, "the owner's answer");
    }
    // The client key cannot pretend to be a server or the administrator.
    let mut s2 = raw(addr);
    assert_eq!(
        handshake_as(&mut s2, Role::Server, key.as_bytes()).0,
        libc::EPERM
    );
    // The administrator may rebalance (and stop); the pool still serves.
    let mut a = raw(addr);
    assert_eq!(handshake_as(&mut a, Role::Admin, b"pool-secret").0, 0);
    assert!(call(&mut a, 1, &Request::Rebalance { start: false }).is_ok());
    assert!(call(&mut a, 2, &Request::UpdateServers { list }).is_err());
    let status = match call(&mut a, 3, &Request::Status) {
        Ok(Response::Status(st)) => *st,
        other => panic!("{other:?}"),
    };
    assert!(status.denied >= 10, "{status:?}");
    assert!(
        status.lookups >= 8 && status.lookup_forwards >= 1,
        "{status:?}"
    );
    assert_eq!(call(&mut a, 4, &Request::Shutdown), Ok(Response::Ok));
}

#[test]
fn unnormalised_paths_and_bad_chunk_sizes_are_refused() {
    let p = pool(1, None);
    let (mut s, _, _) = hello(&p.addrs()[0], b"");
    for bad in ["/a/../etc", "relative", "/a//b", "/a/", "/./a"] {
        let r = call(&mut s, 1, &Request::Stat { path: bad.into() });
        assert_eq!(r.unwrap_err().0, libc::EINVAL, "{bad}");
        // Chunks moved between servers (an open pool lets anyone act as one).
        let r = call(
            &mut s,
            1,
            &Request::AdoptChunk {
                path: bad.into(),
                idx: 1,
                meta: Meta {
                    mode: libc::S_IFREG | 0o644,
                    chunk_size: 4096,
                    ..Default::default()
                },
                data: Bytes::from_static(b"x"),
            },
        );
        assert_eq!(r.unwrap_err().0, libc::EINVAL, "adopt {bad}");
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
        epoch: 0,
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
        epoch: 0,
        data: Bytes::from(vec![1u8; 20]),
    };
    assert_eq!(
        call(&mut s, 5, &w).unwrap_err().0,
        libc::EINVAL,
        "wrong chunk size"
    );
}

/// In cache mode a read that may fetch a chunk from the backend is
/// refused a chunk size out of range (the fetch would read that much).
#[test]
fn cache_mode_reads_with_bad_chunk_sizes_are_refused() {
    let backend = tempfile::tempdir().unwrap();
    std::fs::write(backend.path().join("f"), vec![7u8; 10_000]).unwrap();
    let p = pool_args(&["-b", backend.path().to_str().unwrap()]);
    let (mut s, _, _) = hello(&p.addrs()[0], b"");
    let meta = match call(&mut s, 1, &Request::Stat { path: "/f".into() }) {
        Ok(Response::Meta(m)) => m,
        other => panic!("{other:?}"),
    };
    let read = |chunk_size| Request::Read {
        path: "/f".into(),
        fileid: meta.fileid,
        idx: 1,
        off: 0,
        len: 4096,
        chunk_size,
        flags: chfs_proto::msg::rw::BACKEND,
        epoch: meta.epoch(),
    };
    for (id, cs) in [(2, 0), (3, chfs_proto::MAX_CHUNK_SIZE + 1)] {
        assert_eq!(
            call(&mut s, id, &read(cs)).unwrap_err().0,
            libc::EINVAL,
            "{cs}"
        );
    }
    match call(&mut s, 4, &read(4096)) {
        Ok(Response::Data(d)) => assert_eq!(d.len(), 4096),
        other => panic!("{other:?}"),
    }
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
                epoch: 0,
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
                epoch: 0,
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

/// The head of a write into chunk 0 (of 64 KiB chunks) of `path` at `off`.
fn write_head(path: &str, off: u32, mode: u32) -> Vec<u8> {
    let mut w = Vec::new();
    chfs_proto::msg::encode_write_head(
        &mut w,
        &chfs_proto::msg::WriteHead {
            path,
            fileid: 0,
            chunk_size: 65536,
            mode,
            idx: 0,
            off,
            flags: 0,
            epoch: 0,
        },
    );
    w
}

#[test]
fn cross_memory_attach_reads_only_a_local_peer_and_checks_what_it_is_given() {
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 13) as u8).collect();
    let far = CmaRef::clock_ns() + 60_000_000_000;
    let at = |m: &[u8], deadline_ns| {
        CmaRef {
            addr: m.as_ptr() as u64,
            len: m.len() as u64,
            deadline_ns,
        }
        .encode()
    };
    // The probe: the server reads our memory and sends it back.
    let mut u = local(addr);
    send_flags(&mut u, 1, op::PING, FLAG_CMA, &at(&data[..16], far));
    assert_eq!(
        reply(&mut u, 1),
        Ok(Response::Data(Bytes::copy_from_slice(&data[..16])))
    );
    // A write whose data stays here.
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 65536,
        ..Default::default()
    };
    let create = Request::Create {
        path: "/f".into(),
        meta,
        excl: true,
        data: Bytes::new(),
    };
    call(&mut u, 2, &create).unwrap();
    let head = write_head("/f", 0, meta.mode);
    let mut w = head.clone();
    w.extend_from_slice(&at(&data, far));
    send_flags(&mut u, 3, op::WRITE, FLAG_CMA, &w);
    assert_eq!(reply(&mut u, 3), Ok(Response::Written(65536)));
    let read = whole_chunk0("/f", 65536);
    assert_eq!(
        call(&mut u, 4, &read),
        Ok(Response::Data(Bytes::from(data.clone())))
    );
    // Bad references get an error each, and the connection goes on.
    let mut bad = head.clone();
    bad.extend_from_slice(
        &CmaRef {
            addr: 8,
            len: 4096,
            deadline_ns: far,
        }
        .encode(),
    );
    send_flags(&mut u, 5, op::WRITE, FLAG_CMA, &bad);
    assert_eq!(
        reply(&mut u, 5).unwrap_err().0,
        libc::EFAULT,
        "unmapped address"
    );
    let mut late = head.clone();
    late.extend_from_slice(&at(&data, CmaRef::clock_ns() - 1));
    send_flags(&mut u, 6, op::WRITE, FLAG_CMA, &late);
    assert_eq!(
        reply(&mut u, 6).unwrap_err().0,
        libc::ETIMEDOUT,
        "past the deadline"
    );
    send_flags(&mut u, 7, op::WRITE, FLAG_CMA, &head[..10]);
    assert_eq!(
        reply(&mut u, 7).unwrap_err().0,
        libc::EPROTO,
        "no reference"
    );
    let mut stat = Vec::new();
    Request::Stat { path: "/f".into() }.encode(&mut stat);
    stat.extend_from_slice(&at(&data, far));
    send_flags(&mut u, 8, op::STAT, FLAG_CMA, &stat);
    assert_eq!(reply(&mut u, 8).unwrap_err().0, libc::EINVAL, "not a write");
    let mut both = head.clone();
    both.extend_from_slice(&data[..100]);
    both.extend_from_slice(&at(&data, far));
    send_flags(&mut u, 9, op::WRITE, FLAG_CMA, &both);
    assert_eq!(reply(&mut u, 9).unwrap_err().0, libc::EPROTO, "data twice");
    assert_eq!(
        call(&mut u, 10, &read),
        Ok(Response::Data(Bytes::from(data.clone())))
    );
    // A piece of a chunk, which the server copies straight into the chunk:
    // over its bytes and past its end; then one whose memory ends part of
    // the way (EFAULT): the chunk keeps its length, nothing past it shows.
    let piece = |off: u32, m: &[u8]| {
        let mut w = write_head("/g", off, meta.mode);
        w.extend_from_slice(&at(m, far));
        w
    };
    let create_g = Request::Create {
        path: "/g".into(),
        meta,
        excl: true,
        data: Bytes::copy_from_slice(&data[..30_000]),
    };
    call(&mut u, 11, &create_g).unwrap();
    let read_g = whole_chunk0("/g", 65536);
    let other: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
    send_flags(&mut u, 12, op::WRITE, FLAG_CMA, &piece(20_000, &other));
    assert_eq!(reply(&mut u, 12), Ok(Response::Written(20_000)));
    let mut want = data[..20_000].to_vec();
    want.extend_from_slice(&other);
    assert_eq!(
        call(&mut u, 13, &read_g),
        Ok(Response::Data(Bytes::from(want.clone())))
    );
    // SAFETY: a fresh anonymous mapping of two pages, the second given
    // back, so that a read running off the first one faults.
    let two = unsafe {
        let m = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(m, libc::MAP_FAILED);
        libc::munmap(m.cast::<u8>().add(4096).cast(), 4096);
        std::slice::from_raw_parts(m.cast::<u8>(), 8192)
    };
    send_flags(
        &mut u,
        14,
        op::WRITE,
        FLAG_CMA,
        &piece(40_000, &two[2048..]),
    );
    assert_eq!(
        reply(&mut u, 14).unwrap_err().0,
        libc::EFAULT,
        "memory ends"
    );
    assert_eq!(
        call(&mut u, 15, &read_g),
        Ok(Response::Data(Bytes::from(want)))
    );
    // SAFETY: the mapping's first page, ours, unused from here on.
    unsafe { libc::munmap(two.as_ptr() as *mut libc::c_void, 4096) };
    // Over TCP (another host as far as the server knows): refused.
    let (mut t, _, _) = hello(addr, b"");
    send_flags(&mut t, 1, op::PING, FLAG_CMA, &at(&data[..16], far));
    assert_eq!(reply(&mut t, 1).unwrap_err().0, libc::EPERM);
    assert_eq!(call(&mut t, 2, &Request::Ping), Ok(Response::Ok));
}

#[test]
fn a_local_client_that_reads_its_replies_late_gets_them_all() {
    // Replies that overflow the socket's send buffer: the server's writer
    // waits for room (the local socket is polled for writability only
    // then) and resumes when the client reads.
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let mut u = local(addr);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 29 + 7) as u8).collect();
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 1 << 20,
        ..Default::default()
    };
    let create = Request::Create {
        path: "/big".into(),
        meta,
        excl: true,
        data: Bytes::from(data.clone()),
    };
    call(&mut u, 1, &create).unwrap();
    let read = whole_chunk0("/big", 1 << 20);
    let mut p = Vec::new();
    read.encode(&mut p);
    for id in 2..66 {
        send(&mut u, id, read.op(), &p);
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut got = std::collections::HashSet::new();
    for _ in 2..66 {
        let (h, payload) = recv(&mut u).expect("a reply");
        assert_eq!(h.flags & FLAG_ERROR, 0);
        assert_eq!(
            Response::decode(payload).unwrap(),
            Response::Data(Bytes::from(data.clone()))
        );
        assert!(got.insert(h.id), "reply {} twice", h.id);
    }
    assert_eq!(call(&mut u, 66, &Request::Ping), Ok(Response::Ok));
}

/// Names of the threads of process `pid`.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
fn a_local_connection_asking_for_a_cpu_lane_is_served_there() {
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let pid = p.pid(0).unwrap();
    assert!(!thread_names(pid)
        .iter()
        .any(|n| n.starts_with("chfsd-lane")));
    // Asked for by the first request: served by the lane's thread.
    let mut u = local(addr);
    assert_eq!(call(&mut u, 1, &Request::Lane { cpu: 0 }), Ok(Response::Ok));
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 4096,
        ..Default::default()
    };
    let create = Request::Create {
        path: "/laned".into(),
        meta,
        excl: true,
        data: Bytes::from_static(b"on lane zero"),
    };
    call(&mut u, 2, &create).unwrap();
    let read = whole_chunk0("/laned", 4096);
    assert_eq!(
        call(&mut u, 3, &read),
        Ok(Response::Data(Bytes::from_static(b"on lane zero")))
    );
    assert!(thread_names(pid).contains(&"chfsd-lane0".to_string()));
    // Only first, only local, only a CPU of this machine: refused with
    // EINVAL, and the connection goes on.
    assert_eq!(
        call(&mut u, 4, &Request::Lane { cpu: 0 }).unwrap_err().0,
        libc::EINVAL
    );
    assert_eq!(
        call(&mut u, 5, &read).unwrap(),
        Response::Data(Bytes::from_static(b"on lane zero"))
    );
    let mut far = local(addr);
    assert_eq!(
        call(&mut far, 1, &Request::Lane { cpu: 1 << 20 })
            .unwrap_err()
            .0,
        libc::EINVAL
    );
    assert_eq!(call(&mut far, 2, &Request::Ping), Ok(Response::Ok));
    let (mut t, _, _) = hello(addr, b"");
    assert_eq!(
        call(&mut t, 1, &Request::Lane { cpu: 0 }).unwrap_err().0,
        libc::EINVAL
    );
    assert_eq!(
        call(&mut t, 2, &read).unwrap(),
        Response::Data(Bytes::from_static(b"on lane zero"))
    );
}

/// A memory file of `len` bytes mapped here (sealed against shrinking when
/// `sealed`); the descriptor stays open for the test's life.
fn memfd(len: usize, sealed: bool) -> (std::fs::File, &'static mut [u8]) {
    use chfs_sys::{memfd, Mapping};
    let fd = memfd::create(c"t", memfd::MFD_ALLOW_SEALING).unwrap();
    fd.set_len(len as u64).unwrap();
    if sealed {
        memfd::add_seals(&fd, memfd::F_SEAL_SHRINK | memfd::F_SEAL_GROW).unwrap();
    }
    let map: &'static Mapping = Box::leak(Box::new(Mapping::shared_read_write(&fd, len).unwrap()));
    // SAFETY: the mapping is leaked, so live for the test's life, and
    // this slice is the only reference to it.
    let win = unsafe { std::slice::from_raw_parts_mut(map.as_ptr(), len) };
    (fd, win)
}

fn shm_writes(s: &mut (impl Read + Write), id: u64) -> u64 {
    match call(s, id, &Request::Status) {
        Ok(Response::Status(st)) => st.shm_writes,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_shared_memory_window_is_checked_then_writes_from_it_are_copied_from_the_servers_mapping() {
    use std::os::fd::AsRawFd;
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let (fd, win) = memfd(1 << 20, true);
    for (i, b) in win.iter_mut().enumerate() {
        *b = (i * 7 + i / 4093) as u8;
    }
    let attach = |fd: i32, base: &[u8], len: u64| Request::ShmAttach {
        fd,
        base: base.as_ptr() as u64,
        len,
    };
    let far = CmaRef::clock_ns() + 60_000_000_000;
    let at = |m: &[u8]| {
        CmaRef {
            addr: m.as_ptr() as u64,
            len: m.len() as u64,
            deadline_ns: far,
        }
        .encode()
    };
    let mut u = local(addr);
    let ok = call(&mut u, 1, &attach(fd.as_raw_fd(), win, 1 << 20));
    assert_eq!(ok, Ok(Response::Ok));
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 65536,
        ..Default::default()
    };
    let create = |path: &str| Request::Create {
        path: path.into(),
        meta,
        excl: true,
        data: Bytes::new(),
    };
    // A write from the window (at an odd offset: the server's copy starts
    // unaligned) and one from elsewhere: the same bytes arrive, and only
    // the first is counted as copied from the window.
    let outside: Vec<u8> = win[3..3 + 65536].to_vec();
    let before = shm_writes(&mut u, 2);
    for (i, (path, data)) in [("/w", &win[3..3 + 65536]), ("/o", &outside[..])]
        .into_iter()
        .enumerate()
    {
        let id = 10 + 10 * i as u64;
        call(&mut u, id, &create(path)).unwrap();
        let mut w = write_head(path, 0, meta.mode);
        w.extend_from_slice(&at(data));
        send_flags(&mut u, id + 1, op::WRITE, FLAG_CMA, &w);
        assert_eq!(reply(&mut u, id + 1), Ok(Response::Written(65536)));
        assert_eq!(
            call(&mut u, id + 2, &whole_chunk0(path, 65536)),
            Ok(Response::Data(Bytes::copy_from_slice(&win[3..3 + 65536]))),
            "{path}"
        );
        let counted = shm_writes(&mut u, id + 3) - before;
        assert_eq!(counted, 1, "{path}");
    }
    // One window per connection.
    let again = call(&mut u, 40, &attach(fd.as_raw_fd(), win, 1 << 20));
    assert_eq!(again.unwrap_err().0, libc::EBUSY);
    // Refused, each on a fresh connection that goes on serving: a file
    // that may shrink under the server's mapping, a window longer than
    // the file, one that is not a memory file, a descriptor not open, an
    // empty window, and any window over TCP.
    let (loose_fd, loose) = memfd(4096, false);
    let exe = std::fs::File::open("/proc/self/exe").unwrap();
    let shm_file = tempfile::tempfile_in("/dev/shm").unwrap();
    shm_file.set_len(4096).unwrap();
    let mut cases = vec![
        (attach(loose_fd.as_raw_fd(), loose, 4096), libc::EPERM),
        (attach(shm_file.as_raw_fd(), loose, 4096), libc::EPERM),
        (attach(fd.as_raw_fd(), win, 2 << 20), libc::EINVAL),
        (attach(exe.as_raw_fd(), win, 4096), libc::EINVAL),
        (attach(1 << 20, win, 4096), libc::ENOENT),
        (attach(fd.as_raw_fd(), win, 0), libc::EINVAL),
    ];
    // A hugetlb memory file (where the kernel has them), sealed: its holes
    // can fault, so it is refused too.
    use chfs_sys::memfd;
    let huge = memfd::create(c"h", memfd::MFD_ALLOW_SEALING | memfd::MFD_HUGETLB).ok();
    if let Some(h) = &huge {
        let sized = h.set_len(2 << 20).is_ok() && memfd::add_seals(h, memfd::F_SEAL_SHRINK).is_ok();
        if sized {
            cases.push((attach(h.as_raw_fd(), win, 2 << 20), libc::EINVAL));
        }
    }
    for (req, errno) in cases {
        let mut c = local(addr);
        assert_eq!(call(&mut c, 1, &req).unwrap_err().0, errno, "{req:?}");
        assert_eq!(call(&mut c, 2, &Request::Ping), Ok(Response::Ok));
    }
    let (mut t, _, _) = hello(addr, b"");
    let tcp = call(&mut t, 1, &attach(fd.as_raw_fd(), win, 1 << 20));
    assert_eq!(tcp.unwrap_err().0, libc::EPERM);
    assert_eq!(call(&mut t, 2, &Request::Ping), Ok(Response::Ok));
}

fn shm_reads(s: &mut (impl Read + Write), id: u64) -> u64 {
    match call(s, id, &Request::Status) {
        Ok(Response::Status(st)) => st.shm_reads,
        other => panic!("{other:?}"),
    }
}

/// A read flagged `FLAG_LAND` has its data placed in the connection's
/// landing window (attached with `FLAG_LAND`, mapped read-write by the
/// server) and is answered `Written(n)`; a room outside the window or too
/// small, a request that is not a read, a connection without a landing
/// window (or with a read-only one), a deadline passed, and a landing
/// window over TCP are refused, the room untouched and the connection
/// still served. On every storage engine (the persistent ones place the
/// data themselves, from their file or mapping).
#[test]
fn reads_land_in_a_landing_window_and_bad_rooms_are_refused() {
    for store in [None, Some("posix"), Some("pmem")] {
        landing_on(store);
    }
}

fn landing_on(store: Option<&str>) {
    use std::os::fd::AsRawFd;
    let p = LocalPool::start_with(PoolOptions {
        servers: 1,
        chfsd: Some(env!("CARGO_BIN_EXE_chfsd").into()),
        store: store.map(str::to_string),
        store_size: "64M".into(),
        ..Default::default()
    })
    .unwrap();
    let addr = &p.addrs()[0];
    let (fd, win) = memfd(1 << 20, true);
    win.fill(0xee);
    let attach = Request::ShmAttach {
        fd: fd.as_raw_fd(),
        base: win.as_ptr() as u64,
        len: 1 << 20,
    };
    let mut att = Vec::new();
    attach.encode(&mut att);
    let far = CmaRef::clock_ns() + 60_000_000_000;
    let room = |addr: u64, len: usize, deadline_ns: u64| {
        CmaRef {
            addr,
            len: len as u64,
            deadline_ns,
        }
        .encode()
    };
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 13 + i / 257) as u8).collect();
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 65536,
        ..Default::default()
    };
    let mut u = local(addr);
    call(
        &mut u,
        1,
        &Request::Create {
            path: "/l".into(),
            meta,
            excl: true,
            data: Bytes::from(data.clone()),
        },
    )
    .unwrap();
    // Before a landing window is attached: refused.
    let read = |len: u32| {
        let mut v = Vec::new();
        let mut r = whole_chunk0("/l", 65536);
        if let Request::Read { len: l, .. } = &mut r {
            *l = len;
        }
        r.encode(&mut v);
        v
    };
    let base = win.as_ptr() as u64;
    let mut r = read(65536);
    r.extend_from_slice(&room(base, 65536, far));
    send_flags(&mut u, 2, op::READ, FLAG_LAND, &r);
    assert_eq!(reply(&mut u, 2).unwrap_err().0, libc::EINVAL);
    // A read-only window (no FLAG_LAND) is not one to land in.
    assert_eq!(call(&mut u, 3, &attach), Ok(Response::Ok));
    send_flags(&mut u, 4, op::READ, FLAG_LAND, &r);
    assert_eq!(reply(&mut u, 4).unwrap_err().0, libc::EINVAL);
    send_flags(&mut u, 5, op::SHM_ATTACH, FLAG_LAND, &att);
    assert_eq!(reply(&mut u, 5), Ok(Response::Ok));
    let before = shm_reads(&mut u, 6);
    // A chunk at an odd place of the window, and a short read (past the
    // end of the data: nothing placed beyond what there is).
    let mut r = read(65536);
    r.extend_from_slice(&room(base + 3, 65536, far));
    send_flags(&mut u, 7, op::READ, FLAG_LAND, &r);
    assert_eq!(reply(&mut u, 7), Ok(Response::Written(65536)));
    assert!(win[3..3 + 65536] == data[..]);
    assert_eq!((win[2], win[3 + 65536]), (0xee, 0xee));
    // A `ReadSpans` of "/l" landing in `len` bytes at `at`.
    let spans_at = |spans: Vec<(u64, u32, u32)>, at: u64, len: usize| {
        let mut r = Vec::new();
        Request::ReadSpans {
            path: "/l".into(),
            fileid: 0,
            chunk_size: 65536,
            flags: 0,
            epoch: 0,
            spans,
        }
        .encode(&mut r);
        r.extend_from_slice(&room(at, len, far));
        r
    };
    let at = base + (512 << 10);
    let r = spans_at(
        vec![(0, 100, 1000), (0, 60000, 5536), (0, 10, 20)],
        at,
        7000,
    );
    send_flags(&mut u, 8, op::READ_SPANS, FLAG_LAND, &r);
    assert_eq!(reply(&mut u, 8), Ok(Response::Written(6556)));
    let want: Vec<u8> = [&data[100..1100], &data[60000..65536], &data[10..30]].concat();
    assert!(win[512 << 10..(512 << 10) + 6556] == want[..]);
    // A chunk of 1,000 bytes read past its end and a chunk not held (a
    // hole): zeros where there are no bytes, in a room that held others.
    let write1 = Request::Write {
        path: "/l".into(),
        fileid: 0,
        chunk_size: 65536,
        mode: libc::S_IFREG | 0o644,
        idx: 1,
        off: 0,
        flags: 0,
        epoch: 0,
        data: Bytes::from(data[..1000].to_vec()),
    };
    assert_eq!(call(&mut u, 10, &write1), Ok(Response::Written(1000)));
    let r = spans_at(vec![(1, 500, 1000), (2, 0, 300), (0, 0, 10)], at, 1310);
    send_flags(&mut u, 11, op::READ_SPANS, FLAG_LAND, &r);
    assert_eq!(reply(&mut u, 11), Ok(Response::Written(1310)));
    let want: Vec<u8> = [&data[500..1000], &[0u8; 800][..], &data[..10]].concat();
    assert!(win[512 << 10..(512 << 10) + 1310] == want[..]);
    // A plain read of both: the bytes there are, nothing past them.
    win[..2000].fill(0xee);
    // A `Read` of 2,000 bytes of "/l" landing at the window's start.
    let read_at = |idx: u64, off: u32| {
        let mut r = Vec::new();
        Request::Read {
            path: "/l".into(),
            fileid: 0,
            idx,
            off,
            len: 2000,
            chunk_size: 65536,
            flags: 0,
            epoch: 0,
        }
        .encode(&mut r);
        r.extend_from_slice(&room(base, 2000, far));
        r
    };
    send_flags(&mut u, 12, op::READ, FLAG_LAND, &read_at(1, 200));
    assert_eq!(reply(&mut u, 12), Ok(Response::Written(800)));
    assert!(win[..800] == data[200..1000] && win[800..2000].iter().all(|&b| b == 0xee));
    send_flags(&mut u, 13, op::READ, FLAG_LAND, &read_at(2, 0));
    assert_eq!(reply(&mut u, 13), Ok(Response::Written(0)));
    assert_eq!(shm_reads(&mut u, 9) - before, 5);
    // Refused, the window untouched, the connection served on.
    win.fill(0xee);
    let heap = vec![0u8; 65536];
    let refused: Vec<(u16, Vec<u8>, i32)> = vec![
        // outside the window
        (
            op::READ,
            [read(65536), room(heap.as_ptr() as u64, 65536, far).to_vec()].concat(),
            libc::EFAULT,
        ),
        // running past its end
        (
            op::READ,
            [
                read(65536),
                room(base + (1 << 20) - 100, 65536, far).to_vec(),
            ]
            .concat(),
            libc::EFAULT,
        ),
        // too small for the data
        (
            op::READ,
            [read(65536), room(base, 100, far).to_vec()].concat(),
            libc::EOVERFLOW,
        ),
        // the client stopped waiting
        (
            op::READ,
            [
                read(65536),
                room(base, 65536, CmaRef::clock_ns() - 1).to_vec(),
            ]
            .concat(),
            libc::ETIMEDOUT,
        ),
        // not a read
        (
            op::STAT,
            {
                let mut v = Vec::new();
                Request::Stat { path: "/l".into() }.encode(&mut v);
                v.extend_from_slice(&room(base, 65536, far));
                v
            },
            libc::EINVAL,
        ),
    ];
    for (i, (opc, payload, errno)) in refused.into_iter().enumerate() {
        let id = 100 + 2 * i as u64;
        send_flags(&mut u, id, opc, FLAG_LAND, &payload);
        assert_eq!(reply(&mut u, id).unwrap_err().0, errno, "case {i}");
        assert_eq!(call(&mut u, id + 1, &Request::Ping), Ok(Response::Ok));
    }
    assert!(win.iter().all(|&b| b == 0xee));
    // FLAG_LAND with FLAG_CMA: refused too.
    let mut r = read(65536);
    r.extend_from_slice(&room(base, 65536, far));
    send_flags(&mut u, 200, op::READ, FLAG_LAND | FLAG_CMA, &r);
    assert_eq!(reply(&mut u, 200).unwrap_err().0, libc::EINVAL);
    // One landing window per connection.
    send_flags(&mut u, 201, op::SHM_ATTACH, FLAG_LAND, &att);
    assert_eq!(reply(&mut u, 201).unwrap_err().0, libc::EBUSY);
    // Over TCP: no landing window.
    let (mut t, _, _) = hello(addr, b"");
    send_flags(&mut t, 1, op::SHM_ATTACH, FLAG_LAND, &att);
    assert_eq!(reply(&mut t, 1).unwrap_err().0, libc::EPERM);
    assert_eq!(call(&mut t, 2, &Request::Ping), Ok(Response::Ok));
}

/// A landing read sent to a server that does not own the chunk (a client
/// with an old server list) is forwarded to the owner, whose bytes are
/// placed in the room all the same: sent to both servers of a pool, one
/// of them forwards.
#[test]
fn a_forwarded_landing_read_is_placed_too() {
    use std::os::fd::AsRawFd;
    let p = pool(2, None);
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let far = CmaRef::clock_ns() + 60_000_000_000;
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 65536,
        ..Default::default()
    };
    let forwarded = || -> u64 {
        p.addrs()
            .iter()
            .map(|a| match call(&mut local(a), 1, &Request::Status) {
                Ok(Response::Status(st)) => st.forwarded,
                other => panic!("{other:?}"),
            })
            .sum()
    };
    for j in 0..2 {
        let r = call(
            &mut local(&p.addrs()[0]),
            2,
            &Request::Create {
                path: format!("/fw-{j}"),
                meta,
                excl: true,
                data: Bytes::from(data.clone()),
            },
        );
        assert!(matches!(r, Ok(Response::Created { .. })), "{r:?}");
    }
    let before = forwarded();
    // Each file read through each server: one of the two forwards.
    for addr in p.addrs() {
        let (fd, win) = memfd(1 << 20, true);
        win.fill(0xee);
        let mut att = Vec::new();
        Request::ShmAttach {
            fd: fd.as_raw_fd(),
            base: win.as_ptr() as u64,
            len: 1 << 20,
        }
        .encode(&mut att);
        let mut u = local(addr);
        send_flags(&mut u, 1, op::SHM_ATTACH, FLAG_LAND, &att);
        assert_eq!(reply(&mut u, 1), Ok(Response::Ok));
        for j in 0..2u64 {
            let mut r = Vec::new();
            let mut read = whole_chunk0(&format!("/fw-{j}"), 65536);
            if let Request::Read { len, .. } = &mut read {
                *len = 30_000;
            }
            read.encode(&mut r);
            let at = win.as_ptr() as u64 + j * 65536;
            r.extend_from_slice(
                &CmaRef {
                    addr: at,
                    len: 30_000,
                    deadline_ns: far,
                }
                .encode(),
            );
            send_flags(&mut u, 10 + j, op::READ, FLAG_LAND, &r);
            assert_eq!(reply(&mut u, 10 + j), Ok(Response::Written(20_000)));
            let o = j as usize * 65536;
            assert!(win[o..o + 20_000] == data[..]);
            assert!(win[o + 20_000..o + 30_000].iter().all(|&b| b == 0xee));
        }
    }
    assert_eq!(forwarded() - before, 2);
}

/// A client that sends requests and never reads the replies is not read
/// further once it has --max-inflight of them in the server (or
/// --conn-memory bytes): the server's memory stays bounded, other clients
/// are served, and every request is answered once the client reads.
#[test]
fn a_client_that_does_not_read_its_replies_is_held_back_not_buffered() {
    // (the posix engine reads into a new buffer per reply; the DRAM one
    // would hand out slices of one chunk)
    let p = LocalPool::start_with(PoolOptions {
        servers: 1,
        args: ["--max-inflight", "16", "--conn-memory", "4M"]
            .map(String::from)
            .to_vec(),
        store: Some("posix".into()),
        store_size: "64M".into(),
        chfsd: Some(env!("CARGO_BIN_EXE_chfsd").into()),
        ..Default::default()
    })
    .unwrap();
    let addr = &p.addrs()[0];
    // A file of one 1 MiB chunk.
    let (mut s, _, _) = hello(addr, b"");
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 1 << 20,
        fileid: 7,
        ..Default::default()
    };
    let r = call(
        &mut s,
        1,
        &Request::Create {
            path: "/big".into(),
            meta,
            excl: true,
            data: Bytes::from(vec![5u8; 1 << 20]),
        },
    );
    assert!(r.is_ok(), "{r:?}");
    let before = rss_kib(p.pid(0).unwrap());
    // 2,000 reads of the whole chunk (2 GiB of replies), none read yet.
    let writer = {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut req = Vec::new();
            let mut p = whole_chunk0("/big", 1 << 20);
            if let Request::Read { fileid, .. } = &mut p {
                *fileid = 7;
            }
            p.encode(&mut req);
            for id in 0..2000u64 {
                // The server stops reading: this blocks once the socket's
                // buffers are full.
                send(&mut w, 100 + id, op::READ, &req);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    still_serves(addr);
    let grown = rss_kib(p.pid(0).unwrap()).saturating_sub(before);
    assert!(grown < 64 << 10, "server grew by {grown} KiB");
    assert!(status(addr).throttled > 0);
    // Now the client reads: every request is answered (in any order).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..2000u64 {
        let (h, payload) = recv(&mut s).expect("reply");
        assert_eq!(payload.len(), 1 + (1 << 20), "request {}", h.id);
        seen.insert(h.id);
    }
    assert_eq!(seen, (100..2100).collect());
    writer.join().unwrap();
}

/// Small replies written straight from the connection's reader: while
/// the client reads none of them, the socket fills in the middle of a
/// reply and the writer task must finish it; once the client reads, every
/// reply arrives whole, once, in frames that decode.
#[test]
fn small_replies_that_do_not_fit_the_socket_arrive_whole() {
    let p = pool_args(&[]);
    let addr = &p.addrs()[0];
    let (mut s, _, _) = hello(addr, b"");
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 1 << 16,
        fileid: 9,
        ..Default::default()
    };
    let r = call(
        &mut s,
        1,
        &Request::Create {
            path: "/s".into(),
            meta,
            excl: true,
            data: Bytes::new(),
        },
    );
    assert!(r.is_ok(), "{r:?}");
    const N: u64 = 150_000;
    let writer = {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut req = Vec::new();
            Request::Stat { path: "/s".into() }.encode(&mut req);
            let mut frames = Vec::new();
            for id in 0..N {
                let h = Header {
                    len: req.len() as u32,
                    id: 100 + id,
                    op: op::STAT,
                    flags: 0,
                };
                frames.extend_from_slice(&h.encode());
                frames.extend_from_slice(&req);
                if frames.len() >= 64 << 10 {
                    w.write_all(&frames).unwrap();
                    frames.clear();
                }
            }
            w.write_all(&frames).unwrap();
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    // The replies did not fit: the server held the connection back.
    assert!(status(addr).throttled > 0);
    let mut seen = vec![false; N as usize];
    for _ in 0..N {
        let (h, payload) = recv(&mut s).expect("reply");
        assert_eq!(h.flags & FLAG_ERROR, 0, "request {}", h.id);
        match Response::decode(payload) {
            Ok(Response::Meta(m)) => assert_eq!(m.fileid, 9, "request {}", h.id),
            other => panic!("request {}: {other:?}", h.id),
        }
        let i = (h.id - 100) as usize;
        assert!(!seen[i], "request {} answered twice", h.id);
        seen[i] = true;
    }
    writer.join().unwrap();
}

#[test]
fn connections_per_host_are_limited() {
    let p = pool_args(&["--max-conns-per-peer", "3"]);
    let addr = &p.addrs()[0];
    let mut keep: Vec<TcpStream> = (0..3).map(|_| hello(addr, b"").0).collect();
    let (_, status4, msg) = hello(addr, b"");
    assert_eq!(status4, libc::EAGAIN, "{msg}");
    assert!(msg.contains("max-conns-per-peer"), "{msg}");
    // Status counts the open connections (the one asking included) and the
    // hosts they come from.
    match call(&mut keep[0], 1, &Request::Status) {
        Ok(Response::Status(st)) => assert_eq!((st.connections, st.peers), (3, 1)),
        other => panic!("{other:?}"),
    }
    drop(keep);
    std::thread::sleep(Duration::from_millis(100));
    let (mut s, st, _) = hello(addr, b"");
    assert_eq!(st, 0);
    match call(&mut s, 1, &Request::Status) {
        Ok(Response::Status(st)) => {
            assert_eq!(st.over_limit, 1);
            assert_eq!((st.connections, st.peers), (1, 1));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn idle_and_stalled_connections_are_closed() {
    let p = pool_args(&["--idle-timeout", "1"]);
    let addr = &p.addrs()[0];
    let (mut idle, _, _) = hello(addr, b"");
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
    let t = std::time::Instant::now();
    assert!(closed(&mut idle));
    assert!(closed(&mut half));
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(status(addr).idle_closed >= 2);
    // A connection busy with a slow request is not idle: a client that
    // keeps asking stays connected.
    let (mut busy, _, _) = hello(addr, b"");
    for i in 0..4 {
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(call(&mut busy, i, &Request::Ping), Ok(Response::Ok));
    }
}

/// Sizes past the largest file size are EFBIG, not an overflow (found by
/// tests/fuzz.rs: two append reservations of 2^63 bytes overflowed the
/// size, which panicked the request's task in a debug build and wrapped
/// in a release build).
#[test]
fn sizes_past_the_largest_file_are_refused() {
    let p = pool(1, None);
    let (mut s, _, _) = hello(&p.addrs()[0], b"");
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 4096,
        ..Default::default()
    };
    let r = call(
        &mut s,
        1,
        &Request::Create {
            path: "/f".into(),
            meta,
            excl: true,
            data: Bytes::new(),
        },
    );
    assert!(r.is_ok(), "{r:?}");
    let append = |s: &mut TcpStream, len| {
        call(
            s,
            2,
            &Request::AppendReserve {
                path: "/f".into(),
                len,
            },
        )
    };
    assert_eq!(append(&mut s, 1 << 62), Ok(Response::Count(0)));
    assert_eq!(append(&mut s, 1 << 62).unwrap_err().0, libc::EFBIG);
    assert_eq!(append(&mut s, u64::MAX).unwrap_err().0, libc::EFBIG);
    let set = Request::SetSize {
        path: "/f".into(),
        size: u64::MAX,
        grow_only: true,
        stray: false,
        if_size: None,
    };
    assert_eq!(call(&mut s, 3, &set).unwrap_err().0, libc::EFBIG);
    match call(&mut s, 4, &Request::Stat { path: "/f".into() }) {
        Ok(Response::Meta(m)) => assert_eq!(m.size, 1 << 62),
        other => panic!("{other:?}"),
    }
    still_serves(&p.addrs()[0]);
}

/// Requests are served in the connection's reader when they complete at
/// once; one that waits (here: forwarded to an owner that is stopped) must
/// not hold up the requests after it on the same connection.
#[test]
fn a_waiting_request_does_not_hold_up_the_next_ones() {
    let mut p = pool(2, None);
    let (mut s, st, msg) = hello(&p.addrs()[0], b"");
    assert_eq!(st, 0, "{msg}");
    // A path whose entry server 1 owns: server 0 forwards its stat.
    let ring = match call(&mut s, 9, &Request::GetServers) {
        Ok(Response::Servers(l)) => chfs_proto::ring::Ring::new(l),
        other => panic!("{other:?}"),
    };
    let path = (0..100)
        .map(|i| format!("/w{i}"))
        .find(|x| ring.owner(x, 0) == 1)
        .expect("a path owned by server 1");
    p.signal(1, libc::SIGSTOP).unwrap();
    let mut req = Vec::new();
    Request::Stat { path }.encode(&mut req);
    send(&mut s, 1, op::STAT, &req);
    let t = std::time::Instant::now();
    assert_eq!(call(&mut s, 2, &Request::Ping), Ok(Response::Ok));
    let took = t.elapsed();
    p.signal(1, libc::SIGCONT).unwrap();
    assert!(took < Duration::from_secs(2), "the ping waited {took:?}");
    // The stat is answered once the owner runs again.
    let r = reply(&mut s, 1);
    assert!(matches!(r, Err((libc::ENOENT, _))), "{r:?}");
    p.kill(1);
}

/// Memory per open connection stays small (a server of a large job holds
/// one per client process): 150 idle connections cost under 100 KiB each.
#[test]
fn an_open_connection_costs_little_memory() {
    let p = pool(1, None);
    let addr = &p.addrs()[0];
    let pid = p.pid(0).unwrap();
    let (mut first, _, _) = hello(addr, b"");
    assert_eq!(call(&mut first, 1, &Request::Ping), Ok(Response::Ok));
    let before = rss_kib(pid);
    assert!(before > 0, "VmRSS of chfsd {pid} unreadable");
    let mut conns = Vec::new();
    for i in 0..150u64 {
        let (mut s, st, msg) = hello(addr, b"");
        assert_eq!(st, 0, "{msg}");
        assert_eq!(call(&mut s, i + 1, &Request::Ping), Ok(Response::Ok));
        conns.push(s);
    }
    let per = (rss_kib(pid).saturating_sub(before)) / 150;
    assert!(per < 100, "{per} KiB per connection");
    drop(conns);
}

#[test]
fn read_spans_pad_holes_and_refuse_chunks_of_other_servers() {
    let p = pool(3, None);
    let (mut s, _, _) = hello(&p.addrs()[0], b"");
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 10,
        fileid: 7,
        ..Default::default()
    };
    let path = "/spans".to_string();
    let create = Request::Create {
        path: path.clone(),
        meta,
        excl: true,
        data: Bytes::new(),
    };
    call(&mut s, 1, &create).unwrap();
    for idx in 0..3u64 {
        let w = Request::Write {
            path: path.clone(),
            fileid: 7,
            chunk_size: 10,
            mode: meta.mode,
            idx,
            off: 0,
            flags: 0,
            epoch: 0,
            data: Bytes::from((0..10).map(|b| idx as u8 * 16 + b).collect::<Vec<_>>()),
        };
        assert_eq!(call(&mut s, 2, &w), Ok(Response::Written(10)));
    }
    let spans = |spans: Vec<(u64, u32, u32)>| Request::ReadSpans {
        path: path.clone(),
        fileid: 7,
        chunk_size: 10,
        flags: 0,
        epoch: 0,
        spans,
    };
    // One chunk (forwarded to its owner): the spans in order, the one past
    // the chunk's end padded with zeros; a chunk never written is a hole.
    let r = call(&mut s, 3, &spans(vec![(1, 8, 5), (1, 0, 2)]));
    assert_eq!(
        r,
        Ok(Response::Data(Bytes::from(vec![24, 25, 0, 0, 0, 16, 17])))
    );
    let r = call(&mut s, 4, &spans(vec![(40, 0, 3)]));
    assert_eq!(r, Ok(Response::Data(Bytes::from(vec![0, 0, 0]))));
    // Consecutive chunks belong to different servers of three: whoever
    // gets the request does not own them all.
    let e = call(&mut s, 5, &spans(vec![(0, 0, 2), (1, 0, 2), (2, 0, 2)])).unwrap_err();
    assert_eq!(e.0, libc::ESTALE, "{e:?}");
    // More than a chunk's size in all: refused when decoded.
    let huge = spans(vec![(0, 0, u32::MAX), (0, 0, u32::MAX)]);
    let mut payload = Vec::new();
    huge.encode(&mut payload);
    send(&mut s, 6, huge.op(), &payload);
    let e = reply(&mut s, 6).unwrap_err();
    assert_eq!(e.0, libc::EPROTO, "{e:?}");
}

/// `WriteSpans`: each span written as a `Write` of it would be, in order;
/// spans of chunks of other servers refused before anything is written
/// (ESTALE); a span that crosses its chunk's end fails the request there
/// (EINVAL, the spans before it written); data not as long as the spans
/// refused when decoded.
#[test]
fn write_spans_write_each_span_and_refuse_chunks_of_other_servers() {
    let p = pool(3, None);
    let (mut s, _, _) = hello(&p.addrs()[0], b"");
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 10,
        fileid: 7,
        ..Default::default()
    };
    let path = "/wspans".to_string();
    let create = Request::Create {
        path: path.clone(),
        meta,
        excl: true,
        data: Bytes::new(),
    };
    call(&mut s, 1, &create).unwrap();
    let spans = |spans: Vec<(u64, u32, u32)>, data: &[u8]| Request::WriteSpans {
        path: path.clone(),
        fileid: 7,
        chunk_size: 10,
        mode: meta.mode,
        flags: 0,
        epoch: 0,
        spans,
        data: Bytes::copy_from_slice(data),
    };
    let read = |s: &mut TcpStream, idx: u64| {
        let r = Request::Read {
            path: path.clone(),
            fileid: 7,
            idx,
            off: 0,
            len: 10,
            chunk_size: 10,
            flags: 0,
            epoch: 0,
        };
        match call(s, 9, &r) {
            Ok(Response::Data(d)) => d.to_vec(),
            other => panic!("read of chunk {idx}: {other:?}"),
        }
    };
    // Two spans of one chunk (forwarded to its owner), a gap between.
    let r = call(&mut s, 2, &spans(vec![(1, 0, 3), (1, 5, 2)], b"abcde"));
    assert_eq!(r, Ok(Response::Written(5)));
    assert_eq!(read(&mut s, 1), b"abc\0\0de");
    // Consecutive chunks belong to different servers of three: refused,
    // nothing written.
    let e = call(&mut s, 3, &spans(vec![(1, 0, 1), (2, 0, 2)], b"xyz")).unwrap_err();
    assert_eq!(e.0, libc::ESTALE, "{e:?}");
    assert_eq!(read(&mut s, 1), b"abc\0\0de");
    assert_eq!(read(&mut s, 2), b"");
    // The second span crosses the chunk's end: the first is written.
    let e = call(&mut s, 4, &spans(vec![(1, 0, 2), (1, 8, 4)], b"XY1234")).unwrap_err();
    assert_eq!(e.0, libc::EINVAL, "{e:?}");
    assert_eq!(read(&mut s, 1), b"XYc\0\0de");
    // Data shorter than the spans: refused when decoded.
    let mut payload = Vec::new();
    spans(vec![(1, 0, 5)], b"abc").encode(&mut payload);
    send(&mut s, 5, chfs_proto::msg::op::WRITE_SPANS, &payload);
    let e = reply(&mut s, 5).unwrap_err();
    assert_eq!(e.0, libc::EPROTO, "{e:?}");
    still_serves(&p.addrs()[0]);
}
