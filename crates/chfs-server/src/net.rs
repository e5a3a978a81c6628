//! Async frame and handshake I/O over tokio streams.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chfs_proto::frame::{Header, HEADER_LEN};
use chfs_proto::handshake::{Hello, HelloReply};
use chfs_proto::ProtoError;
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
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        let n = (&mut *r).take(want).read_buf(&mut buf).await?;
        if n == 0 {
            return Err(ProtoError::Truncated {
                needed: len - buf.len(),
            }
            .into());
        }
    }
    Ok(Some((h, buf.freeze())))
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

/// Server side of the handshake: returns Ok if the client may proceed.
pub async fn accept_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &[u8],
) -> Result<(), NetError> {
    let mut fixed = [0u8; Hello::FIXED_LEN];
    s.read_exact(&mut fixed).await?;
    let (version, n) = Hello::decode_fixed(&fixed)?;
    let mut their = vec![0u8; n];
    s.read_exact(&mut their).await?;
    let refuse = if version != chfs_proto::PROTOCOL_VERSION {
        Some((
            libc::EPROTO,
            format!(
                "protocol version {version} not supported (server speaks {})",
                chfs_proto::PROTOCOL_VERSION
            ),
        ))
    } else if !chfs_proto::handshake::secrets_match(&their, secret) {
        Some((
            libc::EACCES,
            "authentication failed: wrong or missing secret (set CHFS_SECRET or CHFS_SECRET_FILE)"
                .to_string(),
        ))
    } else {
        None
    };
    let reply = HelloReply {
        version: chfs_proto::PROTOCOL_VERSION,
        status: refuse.as_ref().map_or(0, |r| r.0),
        message: refuse.as_ref().map_or(String::new(), |r| r.1.clone()),
    };
    s.write_all(&reply.encode()).await?;
    s.flush().await?;
    match refuse {
        Some((errno, message)) => Err(NetError::Refused { errno, message }),
        None => Ok(()),
    }
}

/// Client side of the handshake.
pub async fn connect_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &[u8],
) -> Result<(), NetError> {
    s.write_all(&Hello::new(secret).encode()).await?;
    s.flush().await?;
    let mut fixed = [0u8; HelloReply::FIXED_LEN];
    s.read_exact(&mut fixed).await?;
    let (_, status, n) = HelloReply::decode_fixed(&fixed)?;
    let mut msg = vec![0u8; n];
    s.read_exact(&mut msg).await?;
    if status != 0 {
        return Err(NetError::Refused {
            errno: status,
            message: String::from_utf8_lossy(&msg).into_owned(),
        });
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
