//! chfs-fabric: the libfabric calls a chfs-rs transport needs, safe.
//!
//! CHFS rides Mercury over libfabric, so on InfiniBand, Slingshot or EFA
//! its bulk data moves by RDMA. This crate is the layer a chfs-rs fabric
//! transport stands on: reliable datagram endpoints (`FI_EP_RDM`; for
//! connection-oriented providers through `ofi_rxm`) of a provider chosen
//! by CHFS's protocol names ([`Protocol`]: `ofi+tcp`, `ofi+verbs`,
//! `ofi+cxi`, `ofi+shm`, ...), addresses that can be written in
//! `CHFS_SERVER` ([`Address`]), messages into pre-posted receive buffers,
//! RMA reads and writes of registered memory ([`Buffer`], [`Window`],
//! [`Pinned`] through the [`RegCache`]), and completions waited for on the
//! queue's wait object, so an idle endpoint costs no CPU. Failures are
//! typed ([`Error`], with an errno); every wait has a deadline.
//!
//! Built where pkg-config finds libfabric (`libfabric-dev`); elsewhere it
//! builds too, and [`Endpoint::open`] fails with [`Error::Unavailable`].
//! All unsafe code is in the `ffi` module, over a small C shim
//! (src/shim.c): libfabric's calls are mostly inline functions in its
//! headers. See doc/fabric.md for how the transport will carry chfs-rs.

mod addr;
mod cache;
mod endpoint;
mod error;
// Without libfabric the types exist but cannot be made: what only an
// open endpoint reaches is unused there.
#[cfg_attr(not(chfs_libfabric), allow(dead_code, unused_imports))]
mod ffi;
pub mod rpc;

pub use addr::{Address, Protocol};
pub use cache::{CacheStats, RegCache, Registered};
pub use endpoint::{Config, Endpoint, InFlight, Message, Peer, Sent, Stats};
pub use error::{Error, Result};
pub use ffi::{
    libfabric_version, Buffer, DomainAttr, Lent, Local, Piece, Pinned, RemoteKey, StableBuf,
    WaitKind, Window, WRITEV_MAX,
};

/// Whether this build has libfabric (the transport may still find no
/// provider at run time).
pub const BUILT_WITH_LIBFABRIC: bool = cfg!(chfs_libfabric);
