//! Async frame and handshake I/O over tokio streams.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chfs_proto::frame::{Header, HEADER_LEN};
use chfs_proto::handshake::{
    self, Accept, Auth, Connector, Credential, Hello, HelloReply, Keys, Role, Verdict,
};
use chfs_proto::{ErrorReply, ProtoError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Errors of one connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// Socket error.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer violated the protocol.
    #[error("protocol: {0}")]
    Proto(#[from] ProtoError),
    /// The peer refused us (wrong secret, version).
    #[error("refused by peer: {message} (errno {errno})")]
    Refused {
        /// errno of the refusal.
        errno: i32,
        /// Peer's explanation.
        message: String,
    },
    /// The peer did not answer in time.
    #[error("timed out")]
    Timeout,
}

/// Reads one frame; `Ok(None)` on a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<(Header, Bytes)>, NetError> {
    read_frame_reusing(r, None).await
}

/// Largest payload read into a connection's reused buffer.
pub const REUSE_MAX: usize = 4 << 10;

/// [`read_frame`], the payload of a small frame whose request keeps no
/// part of it ([`chfs_proto::msg::keeps_payload`]) read into `reuse`: once
/// the payloads cut from it are gone, its memory serves the next frame,
/// and such a frame allocates nothing. (A request that keeps its data gets
/// memory of its own, as large as the data: a stored chunk holds no
/// connection buffer.)
pub async fn read_frame_reusing<R: AsyncRead + Unpin>(
    r: &mut R,
    reuse: Option<&mut BytesMut>,
) -> Result<Option<(Header, Bytes)>, NetError> {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut hb[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(ProtoError::Truncated {
                needed: HEADER_LEN - got,
            }
            .into());
        }
        got += n;
    }
    let h = Header::decode(&hb)?;
    // Read into spare capacity: no zeroing of a buffer about to be
    // overwritten (write requests carry up to a chunk of data).
    let len = h.len as usize;
    let mut own = BytesMut::new();
    let (buf, reused) = match reuse {
        Some(b) if len <= REUSE_MAX && !chfs_proto::msg::keeps_payload(h.op) => {
            b.clear();
            b.reserve(REUSE_MAX);
            (b, true)
        }
        _ => {
            own.reserve(len);
            (&mut own, false)
        }
    };
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        let n = (&mut *r).take(want).read_buf(buf).await?;
        if n == 0 {
            return Err(ProtoError::Truncated {
                needed: len - buf.len(),
            }
            .into());
        }
    }
    // A buffer of its own is frozen whole (no shared count to allocate).
    let payload = if reused {
        buf.split().freeze()
    } else {
        std::mem::take(buf).freeze()
    };
    Ok(Some((h, payload)))
}

/// Writes one frame (not flushed).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    id: u64,
    op: u16,
    flags: u16,
    payload: &[u8],
) -> std::io::Result<()> {
    let h = Header {
        len: payload.len() as u32,
        id,
        op,
        flags,
    };
    w.write_all(&h.encode()).await?;
    w.write_all(payload).await
}

/// Server side of the handshake ([`chfs_proto::handshake`]): the role the
/// connector proved, None for a pool without a secret (every request
/// allowed), or why it was refused (the connector was told). `refuse`: a
/// reason to refuse whatever the hello says (a local peer of a user not
/// allowed in), sent once the hello is read.
pub async fn accept_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    keys: Option<&Keys>,
    refuse: Option<ErrorReply>,
) -> Result<Option<Role>, NetError> {
    let mut head = [0u8; Hello::HEAD_LEN];
    s.read_exact(&mut head).await?;
    let version = Hello::decode_head(&head)?;
    if version != chfs_proto::PROTOCOL_VERSION {
        if (handshake::FIXED_HELLO_SINCE..chfs_proto::PROTOCOL_VERSION).contains(&version) {
            // A hello of this layout from an older release: read the rest
            // (the connector writes it all before reading), then say why.
            let mut rest = [0u8; Hello::LEN - Hello::HEAD_LEN];
            s.read_exact(&mut rest).await?;
        } else if version < chfs_proto::PROTOCOL_VERSION {
            // Hellos before that: a length and the secret itself; read them
            // so the client gets to read the answer.
            let mut n = [0u8; 2];
            s.read_exact(&mut n).await?;
            let n = u16::from_le_bytes(n) as usize;
            if n <= 1024 {
                let mut skip = vec![0u8; n];
                s.read_exact(&mut skip).await?;
            }
        }
        return refuse_with(s, handshake::version_refusal(version)).await;
    }
    let mut rest = [0u8; Hello::LEN];
    rest[..Hello::HEAD_LEN].copy_from_slice(&head);
    s.read_exact(&mut rest[Hello::HEAD_LEN..]).await?;
    let hello = Hello::decode(&rest)?;
    if let Some(e) = refuse {
        return refuse_with(s, HelloReply::refusal(e.errno, e.message)).await;
    }
    match handshake::accept(&hello, keys) {
        Accept::Refuse(r) => refuse_with(s, r).await,
        Accept::Open(r) => {
            s.write_all(&r.encode()).await?;
            s.flush().await?;
            Ok(None)
        }
        Accept::Challenge(r, pending) => {
            s.write_all(&r.encode()).await?;
            s.flush().await?;
            let mut proof = [0u8; 32];
            s.read_exact(&mut proof).await?;
            match pending.check(&proof) {
                Ok(role) => {
                    s.write_all(&handshake::accepted().encode()).await?;
                    s.flush().await?;
                    Ok(Some(role))
                }
                Err((verdict, e)) => {
                    s.write_all(&verdict.encode()).await?;
                    s.flush().await?;
                    Err(NetError::Refused {
                        errno: e.errno,
                        message: e.message,
                    })
                }
            }
        }
    }
}

async fn refuse_with<S: AsyncWrite + Unpin>(
    s: &mut S,
    r: HelloReply,
) -> Result<Option<Role>, NetError> {
    s.write_all(&r.encode()).await?;
    s.flush().await?;
    Err(NetError::Refused {
        errno: r.status,
        message: r.message,
    })
}

/// Connecting side of the handshake (a server calling another).
pub async fn connect_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    role: Role,
    cred: &Credential,
) -> Result<(), NetError> {
    let refused = |e: ErrorReply| NetError::Refused {
        errno: e.errno,
        message: e.message,
    };
    let (c, hello) = Connector::start(role, cred).map_err(refused)?;
    s.write_all(&hello).await?;
    s.flush().await?;
    let mut fixed = [0u8; HelloReply::FIXED_LEN];
    s.read_exact(&mut fixed).await?;
    let (version, status, n) = HelloReply::decode_fixed(&fixed)?;
    let mut msg = vec![0u8; n];
    s.read_exact(&mut msg).await?;
    let mut auth = Auth::Open;
    if status == 0 {
        let mut a = [0u8; HelloReply::AUTH_LEN];
        s.read_exact(&mut a).await?;
        if HelloReply::decode_auth(a[0])? {
            let mut ch = [0u8; HelloReply::CHALLENGE_LEN];
            s.read_exact(&mut ch).await?;
            auth = HelloReply::decode_challenge(&ch);
        }
    }
    let msg = String::from_utf8_lossy(&msg);
    if let Some(proof) = c.on_reply(version, status, &msg, &auth).map_err(refused)? {
        s.write_all(&proof).await?;
        s.flush().await?;
        let mut fixed = [0u8; Verdict::FIXED_LEN];
        s.read_exact(&mut fixed).await?;
        let (status, n) = Verdict::decode_fixed(&fixed)?;
        let mut msg = vec![0u8; n];
        s.read_exact(&mut msg).await?;
        Connector::on_verdict(status, &String::from_utf8_lossy(&msg)).map_err(refused)?;
    }
    Ok(())
}

/// Runs `f` with a timeout.
pub async fn timeout<T, F: std::future::Future<Output = Result<T, NetError>>>(
    d: Duration,
    f: F,
) -> Result<T, NetError> {
    match tokio::time::timeout(d, f).await {
        Ok(r) => r,
        Err(_) => Err(NetError::Timeout),
    }
}
