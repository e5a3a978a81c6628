//! The secret never crosses the wire; a client key is only a client.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chfs_client::{Client, ClientConfig};
use chfs_proto::handshake::{Credential, Keys, Role};
use common::*;

/// Forwards one connection to `to`, recording the bytes of both
/// directions.
fn recording_proxy(to: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rec = seen.clone();
    std::thread::spawn(move || {
        let Ok((a, _)) = l.accept() else { return };
        let b = TcpStream::connect(&to).unwrap();
        let pump = |mut from: TcpStream, mut to: TcpStream, rec: Arc<Mutex<Vec<u8>>>| {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            rec.lock().unwrap().extend_from_slice(&buf[..n]);
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Both);
            })
        };
        let t1 = pump(a.try_clone().unwrap(), b.try_clone().unwrap(), rec.clone());
        let t2 = pump(b, a, rec);
        let _ = t1.join();
        let _ = t2.join();
    });
    (addr, seen)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn the_secret_and_its_keys_never_appear_on_the_wire() {
    let secret = "pool-secret-0123456789abcdef";
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        secret: Some(secret.into()),
        ..Default::default()
    })
    .unwrap();
    for (role, cred) in [
        (Role::Client, secret.to_string()),
        (Role::Admin, secret.to_string()),
        (Role::Client, Credential::client_key_file(secret.as_bytes())),
    ] {
        let (proxy, seen) = recording_proxy(p.addrs()[0].clone());
        let c = Client::connect(ClientConfig {
            servers: vec![proxy],
            secret: cred.into_bytes(),
            role,
            rpc_timeout: Duration::from_secs(5),
            ..Default::default()
        })
        .unwrap();
        assert!(c.stat("/").unwrap().is_dir());
        drop(c);
        std::thread::sleep(Duration::from_millis(50));
        let wire = seen.lock().unwrap().clone();
        assert!(wire.len() > 100, "the exchange went through the proxy");
        let keys = Keys::from_secret(secret.as_bytes());
        let mut needles: Vec<Vec<u8>> = vec![secret.as_bytes().to_vec()];
        for r in [Role::Client, Role::Server, Role::Admin] {
            needles.push(keys.get(r).to_vec());
            needles.push(hex(keys.get(r)).into_bytes());
        }
        for n in &needles {
            assert!(
                !wire.windows(n.len()).any(|w| w == &n[..]),
                "{role}: secret material on the wire"
            );
        }
    }
}

#[test]
fn a_client_key_reads_and_writes_but_cannot_stop_the_pool() {
    let secret = "another-pool-secret";
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        secret: Some(secret.into()),
        ..Default::default()
    })
    .unwrap();
    let c = client(&p, |c| {
        c.secret = Credential::client_key_file(secret.as_bytes()).into_bytes()
    });
    let fd = c.create("/f", libc::O_RDWR, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, b"data", 0).unwrap(), 4);
    c.close(fd).unwrap();
    let e = c.shutdown_servers().unwrap_err();
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    let e = c.rebalance().unwrap_err();
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    assert_eq!(c.stat("/f").unwrap().size, 4, "the pool still serves");
    // As the administrator (the pool secret) it can.
    let admin = client(&p, |c| {
        c.secret = secret.as_bytes().to_vec();
        c.role = Role::Admin;
    });
    admin.shutdown_servers().unwrap();
}
