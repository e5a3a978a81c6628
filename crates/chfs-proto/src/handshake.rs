//! Connection handshake: mutual authentication by challenge and response.
//!
//! A pool is protected by a *pool secret* (random bytes, in a file of mode
//! 0600 that servers and the administrator read). From it every party
//! derives the key of its role with HKDF-SHA-256 ([`Keys`]):
//!
//! * [`Role::Client`]: applications (the library, the mount, the tools).
//!   They may be given only this key (a *client key* file,
//!   `chfs-client-key:HEX`), never the secret itself.
//! * [`Role::Server`]: chfsd talking to chfsd (joins, list pushes,
//!   forwarded requests, moved chunks).
//! * [`Role::Admin`]: chfsctl (stop, rebalance).
//!
//! The secret and the keys never cross the wire. The exchange:
//!
//! 1. connector → acceptor: [`Hello`]: magic, protocol version, the role
//!    it asks for, whether it holds a key, a fresh 32-byte nonce `nc`.
//! 2. acceptor → connector: [`HelloReply`]: magic, version, status (0 or
//!    the errno of a refusal), a message; when accepted, whether the pool
//!    authenticates and, if it does, a fresh nonce `ns` and the acceptor's
//!    proof `HMAC(key(role), "chfs-rs server proof" | version | role | nc | ns)`.
//! 3. The connector checks that proof (the acceptor knows the key: no
//!    impostor can collect requests), then sends its own [`Proof`]:
//!    `HMAC(key(role), "chfs-rs client proof" | version | role | nc | ns)`.
//! 4. acceptor → connector: [`Verdict`] (0, or EACCES).
//!
//! Both proofs cover both nonces, so a recorded exchange is worthless on
//! another connection; comparisons are constant-time. A pool started
//! without a secret (`--no-secret`) answers step 2 with "no
//! authentication" and serves every request; a connector that holds a key
//! refuses such a server (it is not the pool the key is for).
//!
//! The reply's first 16 bytes and the refusal path are laid out as in
//! protocol version 3, so that an older client reads this server's "version
//! not supported" message.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::{ErrorReply, ProtoError, PROTOCOL_VERSION};

/// Magic bytes that open every chfs-rs connection, in both directions.
pub const MAGIC: [u8; 8] = *b"CHFS-RS\x01";

/// Longest reply message accepted (bytes).
const MAX_MESSAGE: usize = 4096;

/// Length of nonces, keys and proofs.
pub const NONCE_LEN: usize = 32;

/// A derived key.
pub type Key = [u8; 32];

/// Prefix of a client key file's content: `chfs-client-key:` and 64 hex
/// digits.
pub const CLIENT_KEY_PREFIX: &str = "chfs-client-key:";

/// What a connection authenticates as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// An application: file operations and reports.
    Client,
    /// Another chfsd of the pool: everything, including membership.
    Server,
    /// The pool's administrator (chfsctl): file operations, reports,
    /// shutdown and rebalancing.
    Admin,
}

impl Role {
    /// Wire code.
    pub fn code(self) -> u8 {
        match self {
            Role::Client => 1,
            Role::Server => 2,
            Role::Admin => 3,
        }
    }

    /// From the wire code.
    pub fn from_code(c: u8) -> Option<Role> {
        match c {
            1 => Some(Role::Client),
            2 => Some(Role::Server),
            3 => Some(Role::Admin),
            _ => None,
        }
    }

    fn label(self) -> &'static [u8] {
        match self {
            Role::Client => b"chfs-rs/key/client",
            Role::Server => b"chfs-rs/key/server",
            Role::Admin => b"chfs-rs/key/admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Client => "client",
            Role::Server => "server",
            Role::Admin => "administrator",
        })
    }
}

/// The keys of every role, derived from a pool secret.
#[derive(Clone)]
pub struct Keys {
    client: Key,
    server: Key,
    admin: Key,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

/// HKDF-SHA-256 of the pool secret for one role.
fn derive(secret: &[u8], role: Role) -> Key {
    let hk = hkdf::Hkdf::<Sha256>::new(Some(b"chfs-rs pool secret"), secret);
    let mut k = [0u8; 32];
    hk.expand(role.label(), &mut k)
        .expect("32 bytes is a valid HKDF-SHA-256 length");
    k
}

impl Keys {
    /// Derives every role's key from the pool secret.
    pub fn from_secret(secret: &[u8]) -> Keys {
        Keys {
            client: derive(secret, Role::Client),
            server: derive(secret, Role::Server),
            admin: derive(secret, Role::Admin),
        }
    }

    /// The key of `role`.
    pub fn get(&self, role: Role) -> &Key {
        match role {
            Role::Client => &self.client,
            Role::Server => &self.server,
            Role::Admin => &self.admin,
        }
    }
}

/// What a connecting party holds.
#[derive(Clone, Default)]
pub enum Credential {
    /// Nothing: it can only reach a pool started without a secret.
    #[default]
    None,
    /// The pool secret: any role.
    Secret(Vec<u8>),
    /// A client key: the client role only.
    ClientKey(Key),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credential::None => "Credential::None",
            Credential::Secret(_) => "Credential::Secret(..)",
            Credential::ClientKey(_) => "Credential::ClientKey(..)",
        })
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Credential {
    /// Reads the content of a secret or client-key file (or of
    /// `CHFS_SECRET`): `chfs-client-key:HEX` is a client key, anything
    /// else (trailing white space removed) the pool secret; empty is none.
    pub fn parse(text: &[u8]) -> Result<Credential, ProtoError> {
        let t = text.trim_ascii_end();
        if t.is_empty() {
            return Ok(Credential::None);
        }
        if let Some(h) = t.strip_prefix(CLIENT_KEY_PREFIX.as_bytes()) {
            let h = h.trim_ascii();
            let bad = || ProtoError::Malformed("a client key is 64 hexadecimal digits".into());
            // Hex digits only: `from_str_radix` alone also takes a sign
            // ("+f").
            if h.len() != 64 || !h.iter().all(u8::is_ascii_hexdigit) {
                return Err(bad());
            }
            let mut k = [0u8; 32];
            for (i, pair) in h.chunks(2).enumerate() {
                let s = std::str::from_utf8(pair).map_err(|_| bad())?;
                k[i] = u8::from_str_radix(s, 16).map_err(|_| bad())?;
            }
            return Ok(Credential::ClientKey(k));
        }
        Ok(Credential::Secret(t.to_vec()))
    }

    /// The text of a client key file for the pool with `secret`.
    pub fn client_key_file(secret: &[u8]) -> String {
        format!(
            "{CLIENT_KEY_PREFIX}{}\n",
            hex(Keys::from_secret(secret).get(Role::Client))
        )
    }

    /// Is there a credential at all?
    pub fn is_some(&self) -> bool {
        !matches!(self, Credential::None)
    }

    /// The key for `role`; None without a credential; an error when the
    /// credential does not allow the role.
    pub fn key(&self, role: Role) -> Result<Option<Key>, ErrorReply> {
        match (self, role) {
            (Credential::None, _) => Ok(None),
            (Credential::Secret(s), r) => Ok(Some(*Keys::from_secret(s).get(r))),
            (Credential::ClientKey(k), Role::Client) => Ok(Some(*k)),
            (Credential::ClientKey(_), r) => Err(ErrorReply::new(
                libc::EPERM,
                format!("a client key cannot act as {r}: that needs the pool secret"),
            )),
        }
    }
}

/// Fresh random bytes from the kernel (`getrandom(2)`).
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: getrandom writes at most `N - got` bytes into the rest
        // of the local array it is given.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), N - got, 0) };
        if n > 0 {
            got += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // No kernel randomness (Linux < 3.17): /dev/urandom.
            use std::io::Read;
            if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
                if f.read_exact(&mut b[got..]).is_ok() {
                    return b;
                }
            }
            panic!("no source of random bytes");
        }
    }
    b
}

/// A new pool secret: 32 random bytes, as hex text for its file.
pub fn new_secret() -> String {
    hex(&random_bytes::<32>())
}

type HmacSha256 = Hmac<Sha256>;

/// The MAC of a proof: a label, the version, the role and both nonces.
fn mac(key: &Key, label: &[u8], version: u16, role: Role, nc: &[u8], ns: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(label);
    m.update(&version.to_le_bytes());
    m.update(&[role.code()]);
    m.update(nc);
    m.update(ns);
    m
}

fn proof(key: &Key, label: &[u8], version: u16, role: Role, nc: &[u8], ns: &[u8]) -> [u8; 32] {
    mac(key, label, version, role, nc, ns)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a proof in constant time.
fn proof_ok(
    key: &Key,
    label: &[u8],
    version: u16,
    role: Role,
    nc: &[u8],
    ns: &[u8],
    got: &[u8],
) -> bool {
    mac(key, label, version, role, nc, ns)
        .verify_slice(got)
        .is_ok()
}

const SERVER_PROOF: &[u8] = b"chfs-rs server proof";
const CLIENT_PROOF: &[u8] = b"chfs-rs client proof";

/// The first protocol version whose hello is [`Hello`] (fixed length,
/// [`Hello::LEN`]): an acceptor reads all of an older release's hello of
/// this layout before answering it "version not supported".
pub const FIXED_HELLO_SINCE: u16 = 5;

/// First message of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version of the connecting side.
    pub version: u16,
    /// The role it asks for.
    pub role: Role,
    /// It holds a key (and can answer a challenge).
    pub has_key: bool,
    /// Its fresh nonce.
    pub nonce: [u8; NONCE_LEN],
}

impl Hello {
    /// Length of the part that says the version (magic, version): read it
    /// first, the rest depends on it.
    pub const HEAD_LEN: usize = 10;
    /// Length of a whole hello of this version.
    pub const LEN: usize = 12 + NONCE_LEN;

    /// Encodes the hello.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10] = self.role.code();
        b[11] = self.has_key as u8;
        b[12..].copy_from_slice(&self.nonce);
        b
    }

    /// Decodes the head; returns the connector's protocol version.
    pub fn decode_head(b: &[u8; Self::HEAD_LEN]) -> Result<u16, ProtoError> {
        if b[0..8] != MAGIC {
            return Err(ProtoError::BadMagic);
        }
        Ok(u16::from_le_bytes([b[8], b[9]]))
    }

    /// Decodes a whole hello of this version.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<Hello, ProtoError> {
        let version = Self::decode_head(b[..Self::HEAD_LEN].try_into().expect("10 bytes"))?;
        let role = Role::from_code(b[10])
            .ok_or_else(|| ProtoError::Malformed(format!("role {}", b[10])))?;
        if b[11] > 1 {
            return Err(ProtoError::Malformed(format!("hello flags {}", b[11])));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[12..]);
        Ok(Hello {
            version,
            role,
            has_key: b[11] == 1,
            nonce,
        })
    }
}

/// How the acceptor answers an accepted hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// The pool has no secret: no authentication.
    Open,
    /// The challenge: the acceptor's nonce and its proof.
    Challenge {
        /// Acceptor's nonce.
        nonce: [u8; NONCE_LEN],
        /// Acceptor's proof.
        proof: [u8; 32],
    },
}

/// Answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloReply {
    /// Protocol version of the acceptor.
    pub version: u16,
    /// 0 when accepted, otherwise the errno of the refusal.
    pub status: i32,
    /// Why the connection was refused (empty when accepted).
    pub message: String,
    /// When accepted: how.
    pub auth: Auth,
}

impl HelloReply {
    /// Length of the fixed part (magic, version, status, message length).
    pub const FIXED_LEN: usize = 16;
    /// Length of the part after the message when accepted: the auth byte,
    /// then [`HelloReply::CHALLENGE_LEN`] more with a challenge.
    pub const AUTH_LEN: usize = 1;
    /// Length of a challenge (nonce and proof).
    pub const CHALLENGE_LEN: usize = NONCE_LEN + 32;

    /// A refusal.
    pub fn refusal(errno: i32, message: impl Into<String>) -> Self {
        HelloReply {
            version: PROTOCOL_VERSION,
            status: errno,
            message: message.into(),
            auth: Auth::Open,
        }
    }

    /// Encodes the reply.
    pub fn encode(&self) -> Vec<u8> {
        let msg = &self.message.as_bytes()[..self.message.len().min(MAX_MESSAGE)];
        let mut b = Vec::with_capacity(Self::FIXED_LEN + msg.len() + 1 + Self::CHALLENGE_LEN);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.status.to_le_bytes());
        b.extend_from_slice(&(msg.len() as u16).to_le_bytes());
        b.extend_from_slice(msg);
        if self.status == 0 {
            match &self.auth {
                Auth::Open => b.push(0),
                Auth::Challenge { nonce, proof } => {
                    b.push(1);
                    b.extend_from_slice(nonce);
                    b.extend_from_slice(proof);
                }
            }
        }
        b
    }

    /// Decodes the fixed part; returns (version, status, message length).
    pub fn decode_fixed(b: &[u8; Self::FIXED_LEN]) -> Result<(u16, i32, usize), ProtoError> {
        if b[0..8] != MAGIC {
            return Err(ProtoError::BadMagic);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        let status = i32::from_le_bytes([b[10], b[11], b[12], b[13]]);
        let n = u16::from_le_bytes([b[14], b[15]]) as usize;
        if n > MAX_MESSAGE {
            return Err(ProtoError::Malformed("hello reply message too long".into()));
        }
        Ok((version, status, n))
    }

    /// Decodes the auth byte of an accepted reply: true when a challenge
    /// ([`HelloReply::CHALLENGE_LEN`] bytes) follows.
    pub fn decode_auth(b: u8) -> Result<bool, ProtoError> {
        match b {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(ProtoError::Malformed(format!("hello reply auth {v}"))),
        }
    }

    /// Decodes a challenge.
    pub fn decode_challenge(b: &[u8; Self::CHALLENGE_LEN]) -> Auth {
        let mut nonce = [0u8; NONCE_LEN];
        let mut proof = [0u8; 32];
        nonce.copy_from_slice(&b[..NONCE_LEN]);
        proof.copy_from_slice(&b[NONCE_LEN..]);
        Auth::Challenge { nonce, proof }
    }
}

/// The connector's answer to a challenge.
pub type Proof = [u8; 32];

/// The acceptor's decision after a [`Proof`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// 0, or the errno of the refusal.
    pub status: i32,
    /// Why refused.
    pub message: String,
}

impl Verdict {
    /// Length of the fixed part (status, message length).
    pub const FIXED_LEN: usize = 6;

    /// Encodes the verdict.
    pub fn encode(&self) -> Vec<u8> {
        let msg = &self.message.as_bytes()[..self.message.len().min(MAX_MESSAGE)];
        let mut b = Vec::with_capacity(Self::FIXED_LEN + msg.len());
        b.extend_from_slice(&self.status.to_le_bytes());
        b.extend_from_slice(&(msg.len() as u16).to_le_bytes());
        b.extend_from_slice(msg);
        b
    }

    /// Decodes the fixed part: (status, message length).
    pub fn decode_fixed(b: &[u8; Self::FIXED_LEN]) -> Result<(i32, usize), ProtoError> {
        let n = u16::from_le_bytes([b[4], b[5]]) as usize;
        if n > MAX_MESSAGE {
            return Err(ProtoError::Malformed("verdict message too long".into()));
        }
        Ok((i32::from_le_bytes([b[0], b[1], b[2], b[3]]), n))
    }
}

/// The connecting side of a handshake.
pub struct Connector {
    role: Role,
    key: Option<Key>,
    nonce: [u8; NONCE_LEN],
}

impl Connector {
    /// Starts a handshake as `role` with `cred`; returns it and the hello
    /// to send.
    pub fn start(
        role: Role,
        cred: &Credential,
    ) -> Result<(Connector, [u8; Hello::LEN]), ErrorReply> {
        let key = cred.key(role)?;
        let nonce = random_bytes();
        let hello = Hello {
            version: PROTOCOL_VERSION,
            role,
            has_key: key.is_some(),
            nonce,
        };
        Ok((Connector { role, key, nonce }, hello.encode()))
    }

    /// After the reply: `Ok(None)` when the connection is ready (an open
    /// pool), `Ok(Some(proof))` to send before the verdict, or why it
    /// cannot go on.
    pub fn on_reply(
        &self,
        version: u16,
        status: i32,
        message: &str,
        auth: &Auth,
    ) -> Result<Option<Proof>, ErrorReply> {
        if status != 0 {
            return Err(ErrorReply::new(
                status,
                format!("refused the connection: {message}"),
            ));
        }
        if version != PROTOCOL_VERSION {
            return Err(ErrorReply::new(
                libc::EPROTO,
                format!("speaks protocol version {version}, this side {PROTOCOL_VERSION}"),
            ));
        }
        match (auth, &self.key) {
            (Auth::Open, None) => Ok(None),
            (Auth::Open, Some(_)) => Err(ErrorReply::new(
                libc::EACCES,
                "did not authenticate itself (it runs without a secret), so it is not the pool this secret is for",
            )),
            (Auth::Challenge { .. }, None) => Err(ErrorReply::new(
                libc::EACCES,
                "this pool needs its secret: set CHFS_SECRET_FILE (or CHFS_SECRET)",
            )),
            (Auth::Challenge { nonce, proof: theirs }, Some(key)) => {
                if !proof_ok(key, SERVER_PROOF, version, self.role, &self.nonce, nonce, theirs) {
                    return Err(ErrorReply::new(
                        libc::EACCES,
                        "failed to prove that it knows the pool's secret (wrong secret, or not the pool's server)",
                    ));
                }
                Ok(Some(proof(key, CLIENT_PROOF, version, self.role, &self.nonce, nonce)))
            }
        }
    }

    /// After the verdict.
    pub fn on_verdict(status: i32, message: &str) -> Result<(), ErrorReply> {
        if status != 0 {
            return Err(ErrorReply::new(
                status,
                format!("refused the connection: {message}"),
            ));
        }
        Ok(())
    }
}

/// What an acceptor does after a hello.
pub enum Accept {
    /// Refuse with this reply.
    Refuse(HelloReply),
    /// Accept with this reply (an open pool: every request is allowed).
    Open(HelloReply),
    /// Send this challenge, then check the proof with [`Pending::check`].
    Challenge(HelloReply, Pending),
}

/// An acceptor waiting for the connector's proof.
pub struct Pending {
    role: Role,
    key: Key,
    nc: [u8; NONCE_LEN],
    ns: [u8; NONCE_LEN],
}

impl Pending {
    /// Checks the proof: the role it proves, or the verdict to send (a
    /// refusal) and the error.
    pub fn check(&self, got: &Proof) -> Result<Role, (Verdict, ErrorReply)> {
        if proof_ok(
            &self.key,
            CLIENT_PROOF,
            PROTOCOL_VERSION,
            self.role,
            &self.nc,
            &self.ns,
            got,
        ) {
            return Ok(self.role);
        }
        let msg = format!(
            "authentication as {} failed: wrong secret or key (set CHFS_SECRET_FILE)",
            self.role
        );
        Err((
            Verdict {
                status: libc::EACCES,
                message: msg.clone(),
            },
            ErrorReply::new(libc::EACCES, msg),
        ))
    }
}

/// The verdict of an accepted proof.
pub fn accepted() -> Verdict {
    Verdict {
        status: 0,
        message: String::new(),
    }
}

/// The reply to a hello of another protocol version (read as version 3
/// laid it out, so older clients show the message).
pub fn version_refusal(version: u16) -> HelloReply {
    HelloReply::refusal(
        libc::EPROTO,
        format!(
            "protocol version {version} not supported: this server speaks version {PROTOCOL_VERSION} (use client and server of the same chfs-rs release)"
        ),
    )
}

/// The acceptor's answer to `hello` for a pool with `keys` (None: no
/// secret).
pub fn accept(hello: &Hello, keys: Option<&Keys>) -> Accept {
    if hello.version != PROTOCOL_VERSION {
        return Accept::Refuse(version_refusal(hello.version));
    }
    let Some(keys) = keys else {
        return Accept::Open(HelloReply {
            version: PROTOCOL_VERSION,
            status: 0,
            message: String::new(),
            auth: Auth::Open,
        });
    };
    if !hello.has_key {
        return Accept::Refuse(HelloReply::refusal(
            libc::EACCES,
            "this pool needs its secret: set CHFS_SECRET_FILE (or CHFS_SECRET)",
        ));
    }
    let key = *keys.get(hello.role);
    let ns = random_bytes();
    let p = proof(
        &key,
        SERVER_PROOF,
        PROTOCOL_VERSION,
        hello.role,
        &hello.nonce,
        &ns,
    );
    Accept::Challenge(
        HelloReply {
            version: PROTOCOL_VERSION,
            status: 0,
            message: String::new(),
            auth: Auth::Challenge {
                nonce: ns,
                proof: p,
            },
        },
        Pending {
            role: hello.role,
            key,
            nc: hello.nonce,
            ns,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a whole exchange in memory; returns the bytes that crossed.
    fn exchange(
        role: Role,
        cred: &Credential,
        pool: Option<&[u8]>,
    ) -> (Result<Role, ErrorReply>, Vec<u8>) {
        let keys = pool.map(Keys::from_secret);
        let mut wire = Vec::new();
        let (c, hello) = match Connector::start(role, cred) {
            Ok(x) => x,
            Err(e) => return (Err(e), wire),
        };
        wire.extend_from_slice(&hello);
        let h = Hello::decode(&hello).unwrap();
        let (reply, pending) = match accept(&h, keys.as_ref()) {
            Accept::Refuse(r) => (r, None),
            Accept::Open(r) => (r, None),
            Accept::Challenge(r, p) => (r, Some(p)),
        };
        wire.extend_from_slice(&reply.encode());
        let proof = match c.on_reply(reply.version, reply.status, &reply.message, &reply.auth) {
            Ok(Some(p)) => p,
            Ok(None) => return (Ok(role), wire),
            Err(e) => return (Err(e), wire),
        };
        wire.extend_from_slice(&proof);
        match pending.unwrap().check(&proof) {
            Ok(r) => {
                wire.extend_from_slice(&accepted().encode());
                (Connector::on_verdict(0, "").map(|()| r), wire)
            }
            Err((v, e)) => {
                wire.extend_from_slice(&v.encode());
                (Err(e), wire)
            }
        }
    }

    #[test]
    fn every_role_authenticates_with_the_pool_secret() {
        let s = b"pool secret".to_vec();
        for role in [Role::Client, Role::Server, Role::Admin] {
            let (r, wire) = exchange(role, &Credential::Secret(s.clone()), Some(&s));
            assert_eq!(r.unwrap(), role);
            // Neither the secret nor any key crosses the wire.
            let keys = Keys::from_secret(&s);
            for needle in [
                &s[..],
                keys.get(Role::Client),
                keys.get(Role::Server),
                keys.get(Role::Admin),
            ] {
                assert!(!wire.windows(needle.len()).any(|w| w == needle));
            }
        }
    }

    #[test]
    fn a_client_key_is_for_the_client_role_only() {
        let s = b"s".to_vec();
        let file = Credential::client_key_file(&s);
        let ck = Credential::parse(file.as_bytes()).unwrap();
        assert!(matches!(ck, Credential::ClientKey(_)));
        assert_eq!(
            exchange(Role::Client, &ck, Some(&s)).0.unwrap(),
            Role::Client
        );
        for role in [Role::Server, Role::Admin] {
            assert_eq!(
                exchange(role, &ck, Some(&s)).0.unwrap_err().errno,
                libc::EPERM
            );
        }
    }

    #[test]
    fn wrong_missing_or_unexpected_secrets_are_refused() {
        let s = b"right".to_vec();
        let wrong = Credential::Secret(b"wrong".to_vec());
        assert_eq!(
            exchange(Role::Client, &wrong, Some(&s))
                .0
                .unwrap_err()
                .errno,
            libc::EACCES
        );
        let e = exchange(Role::Client, &Credential::None, Some(&s))
            .0
            .unwrap_err();
        assert_eq!(e.errno, libc::EACCES);
        assert!(e.message.contains("CHFS_SECRET_FILE"), "{e}");
        // A pool without a secret: everyone in; a connector holding a key
        // refuses it (not its pool).
        assert_eq!(
            exchange(Role::Admin, &Credential::None, None).0.unwrap(),
            Role::Admin
        );
        assert_eq!(
            exchange(Role::Client, &Credential::Secret(s.clone()), None)
                .0
                .unwrap_err()
                .errno,
            libc::EACCES
        );
    }

    #[test]
    fn a_replayed_proof_fails_on_a_new_connection() {
        let s = b"secret".to_vec();
        let cred = Credential::Secret(s.clone());
        let keys = Keys::from_secret(&s);
        // A recorded exchange.
        let (c, hello) = Connector::start(Role::Admin, &cred).unwrap();
        let h = Hello::decode(&hello).unwrap();
        let Accept::Challenge(reply, pending) = accept(&h, Some(&keys)) else {
            panic!()
        };
        let proof = c
            .on_reply(reply.version, 0, "", &reply.auth)
            .unwrap()
            .unwrap();
        assert!(pending.check(&proof).is_ok());
        // The same hello and proof sent again: the acceptor's new nonce
        // makes the old proof wrong.
        let Accept::Challenge(_, pending2) = accept(&h, Some(&keys)) else {
            panic!()
        };
        assert_eq!(pending2.check(&proof).unwrap_err().1.errno, libc::EACCES);
        // An impostor server that replays the recorded reply to a new
        // connector fails the connector's check.
        let (c2, _) = Connector::start(Role::Admin, &cred).unwrap();
        assert_eq!(
            c2.on_reply(reply.version, 0, "", &reply.auth)
                .unwrap_err()
                .errno,
            libc::EACCES
        );
    }

    #[test]
    fn other_versions_get_a_message_older_clients_can_read() {
        let mut h =
            Hello::decode(&Connector::start(Role::Client, &Credential::None).unwrap().1).unwrap();
        h.version = 3;
        let Accept::Refuse(r) = accept(&h, None) else {
            panic!()
        };
        let b = r.encode();
        // Version 3's reply layout: magic, version, status, length, text.
        let (_, status, n) = HelloReply::decode_fixed(b[..16].try_into().unwrap()).unwrap();
        assert_eq!(status, libc::EPROTO);
        assert!(String::from_utf8_lossy(&b[16..16 + n]).contains("version 3 not supported"));
        assert_eq!(b.len(), 16 + n);
    }

    #[test]
    fn golden_hello_and_credentials() {
        let h = Hello {
            version: 5,
            role: Role::Admin,
            has_key: true,
            nonce: [7; 32],
        };
        let b = h.encode();
        assert_eq!(&b[..12], b"CHFS-RS\x01\x05\x00\x03\x01");
        assert_eq!(&b[12..], &[7u8; 32]);
        assert_eq!(Hello::decode(&b).unwrap(), h);
        let mut bad = b;
        bad[0] = b'X';
        assert!(matches!(Hello::decode(&bad), Err(ProtoError::BadMagic)));
        // Key derivation is fixed: a change would lock every pool out.
        assert_eq!(
            Credential::client_key_file(b"secret"),
            format!(
                "{CLIENT_KEY_PREFIX}{}\n",
                hex(&derive(b"secret", Role::Client))
            )
        );
        assert_eq!(
            hex(&derive(b"secret", Role::Client))[..16],
            *GOLDEN_CLIENT_KEY_PREFIX
        );
        assert!(Credential::parse(b"chfs-client-key:12").is_err());
        assert!(matches!(
            Credential::parse(b"  \n").unwrap(),
            Credential::None
        ));
        assert!(
            matches!(Credential::parse(b"abc\n").unwrap(), Credential::Secret(s) if s == b"abc")
        );
    }

    const GOLDEN_CLIENT_KEY_PREFIX: &str = "3d6ce4e17f05eb45";
}
