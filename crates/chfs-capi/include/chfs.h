/*
 * chfs.h - the CHFS C API, as implemented by chfs-rs (libchfs.so.0).
 *
 * Source- and binary-compatible with the header and library of the original
 * CHFS (soname libchfs.so.0): programs built against the original run
 * against this one, and programs built against this one run against the
 * original unless they call the functions marked as not in CHFS. Build with:
 *   cc prog.c $(pkg-config --cflags --libs chfs)
 *
 * Conventions (all functions):
 *  - On error, functions returning int/ssize_t/off_t return -1 and set errno
 *    (POSIX values); on success errno is left unchanged. Functions returning
 *    void set errno when they fail.
 *  - The cause of the last failure is kept as text: chfs_last_error() below
 *    (for example after chfs_init() fails with EINVAL it names the variable
 *    and the value it rejected). Nothing is printed unless CHFS_LOG_PRIORITY
 *    is set (e.g. CHFS_LOG_PRIORITY=err prints failures to stderr).
 *  - Calls made before chfs_init() fail with ENOTCONN.
 *  - A NULL pointer where a string or struct is required gives EFAULT; a path
 *    that is not valid UTF-8 gives EINVAL.
 *  - Paths are absolute within CHFS (a relative path is taken from "/");
 *    "." and ".." are resolved lexically.
 *  - Descriptors are small integers private to libchfs (not kernel fds). A
 *    child made by fork() reconnects by itself on its first call; it cannot
 *    use descriptors its parent opened (EBADF).
 *  - Every function is safe to call from several threads. The library
 *    installs no signal handlers and never exits or aborts the process.
 *
 * Calling conventions of CHFS (the default): chfs_open() ignores its flags
 * (every descriptor reads and writes), chfs_create() creates or truncates
 * whatever its flags say, so programs passing their own flag constants (the
 * IOR/mdtest CHFS backend passes 0x01 for read-only, 0x02 write-only, 0x04
 * read-write, 0x10 create, 0x20 truncate, 0x40 exclusive) work unchanged.
 * CHFS_POSIX_FLAGS=1 in the environment of chfs_init() makes both take
 * open(2) flags instead: access mode enforced (EBADF), O_EXCL, O_TRUNC only
 * when given.
 *
 * Environment variables (CHFS_SERVER, CHFS_CHUNK_SIZE, CHFS_BUF_SIZE, ...)
 * are read once by chfs_init() and validated: a bad value makes chfs_init()
 * fail with EINVAL. See the table in README.md of crates/chfs-capi, which
 * also lists what differs from the original CHFS library.
 */
#ifndef CHFS_H
#define CHFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct stat;
struct statvfs;
struct timespec;

/* ---- initialisation -------------------------------------------------- */

/* Connects to the servers. `server` is "host:port[,host:port...]" (a scheme
 * prefix such as "ofi+tcp://" is ignored); NULL or "" means CHFS_SERVER.
 * Fails with EINVAL if there is no server or an environment variable is
 * invalid, or with the connection error; chfs_last_error() says which. A
 * second call in the same process while initialised does nothing and
 * returns 0. After chfs_term() it connects again (earlier descriptors stay
 * invalid). */
int chfs_init(const char *server);
/* Text of the last failed call of the calling thread, e.g.
 *   chfs_init: CHFS_CHUNK_SIZE="64k" is not a valid number (EINVAL)
 * or "" if none failed yet. Kept per thread like errno (a successful call
 * does not clear it); the string is valid until the next failing call of
 * the same thread. Not in the original CHFS library. */
const char *chfs_last_error(void);
/* 1 when initialised, else 0. */
int chfs_initialized(void);
/* Flushes the buffers of every open descriptor, then disconnects. */
int chfs_term(void);
/* Disconnects without flushing (buffered writes are lost). */
int chfs_term_without_sync(void);
/* Number of servers. */
int chfs_size(void);
/* Library version, a static string. */
const char *chfs_version(void);

/* Chunk size of files created from now on (ignored if <= 0; above the
 * maximum, 64 MiB, ignored with errno EINVAL). Before chfs_init a set
 * CHFS_CHUNK_SIZE overrides it. */
void chfs_set_chunk_size(int chunk_size);
/* Client write buffer per descriptor in bytes; small writes are aggregated
 * into one request (0 or less = off). Applies to descriptors opened
 * afterwards. */
void chfs_set_buf_size(int buf_size);
/* Concurrent chunk RPCs of one read/write (takes effect at chfs_init). */
void chfs_set_async_access(int enable);
/* Chunk data of at least this many bytes moves by RMA over a fabric
 * transport (servers at ofi+ addresses; takes effect at chfs_init; the
 * environment's CHFS_RDMA_THRESH wins). No effect over TCP. */
void chfs_set_rdma_thresh(size_t thresh);
/* RPC timeout in ms (takes effect at chfs_init; 0 = 30000). */
void chfs_set_rpc_timeout_msec(int timeout);
/* Server list cache time in s (takes effect at chfs_init). */
void chfs_set_node_list_cache_timeout(int timeout);
/* Accepted for compatibility: chfs_stagein copies in 1 MiB pieces. */
void chfs_set_stagein_buf_size(int buf_size);

/* ---- files ------------------------------------------------------------ */

/* Creates the regular file `path` (mode & 07777) or truncates it to 0 bytes
 * if it exists (as creat(2)), and returns a descriptor that reads and
 * writes. `flags` are ignored but for CHFS_O_CACHE (accepted, no effect).
 * EISDIR for a directory, ENOENT if the parent is missing. A create after
 * another process wrote to the file empties it: ranks creating one shared
 * file need a barrier between their creates and their writes (IOR -g).
 * With CHFS_POSIX_FLAGS=1: `flags` are open(2) flags (O_CREAT implied;
 * access mode, O_EXCL and O_TRUNC honoured). */
int chfs_create(const char *path, int32_t flags, mode_t mode);
/* As chfs_create with a chunk size for a new file (EINVAL if <= 0; an
 * existing file keeps its chunk size). */
int chfs_create_chunk_size(const char *path, int32_t flags, mode_t mode,
	int chunk_size);
/* Opens an existing file (ENOENT if missing; a final symbolic link is
 * followed). `flags` are ignored: the descriptor reads and writes, whatever
 * access mode or other bits they hold. A directory gives EISDIR unless
 * `flags` contain O_DIRECTORY or O_PATH (then a descriptor for fstat).
 * With CHFS_POSIX_FLAGS=1: open(2) flags (writing through an O_RDONLY
 * descriptor or reading through an O_WRONLY one gives EBADF). */
int chfs_open(const char *path, int32_t flags);
/* Flushes the descriptor's buffer and closes it. */
int chfs_close(int fd);
ssize_t chfs_pwrite(int fd, const void *buf, size_t size, off_t offset);
ssize_t chfs_write(int fd, const void *buf, size_t size);
/* Reads return 0 at end of file; holes read as zeros. */
ssize_t chfs_pread(int fd, void *buf, size_t size, off_t offset);
ssize_t chfs_read(int fd, void *buf, size_t size);
/* whence: SEEK_SET, SEEK_CUR, SEEK_END (EINVAL otherwise or if the result
 * would be negative). */
off_t chfs_seek(int fd, off_t off, int whence);
/* Flushes the descriptor's buffer and publishes the file size: other
 * processes then read the data and see the size before chfs_close. */
int chfs_fsync(int fd);
int chfs_truncate(const char *path, off_t len);
int chfs_unlink(const char *path);
int chfs_mkdir(const char *path, mode_t mode);
/* ENOTEMPTY if the directory has entries. */
int chfs_rmdir(const char *path);
/* The entry itself: a final symbolic link is NOT followed (as in CHFS, the
 * same as chfs_lstat). Fills st_mode, st_ino, st_nlink, st_uid, st_gid,
 * st_rdev, st_size, st_blksize (the chunk size of a file), st_blocks
 * (512-byte units of st_size) and the three times; st_dev is 0. */
int chfs_stat(const char *path, struct stat *st);
/* Calls filler(buf, name, &st, 0) once per entry (no "." or ".."), in no
 * particular order, stopping early when filler returns non-zero; `st` is
 * filled as by chfs_stat and only valid during the call. Fails with
 * ENOENT/ENOTDIR. */
int chfs_readdir(const char *path, void *buf,
	int (*filler)(void *, const char *, const struct stat *, off_t));
/* As chfs_readdir, listing only the entries held by server `index`
 * (0 <= index < chfs_size(), else EINVAL). */
int chfs_readdir_index(const char *path, int index, void *buf,
	int (*filler)(void *, const char *, const struct stat *, off_t));
int chfs_symlink(const char *target, const char *path);
/* Copies at most `size` bytes of the target, without a NUL; returns the
 * number of bytes (EINVAL if not a link or size is 0). */
int chfs_readlink(const char *path, char *buf, size_t size);
/* Flushes every open descriptor of this process (buffered writes and file
 * sizes), asks every server to make its store durable and, when the servers
 * cache a backend (chfsd --backend), waits until every dirty chunk of the
 * whole pool is written back to it. Sets errno if that fails (for example
 * a backend write error with no progress for 10 s). chfs_term() does the
 * same before disconnecting. */
void chfs_sync(void);
/* Stages `path` in, as chstagein does: a local file, directory (with
 * everything below it) or symbolic link is copied into CHFS at
 * CHFS_SUBDIR_PATH/path, creating missing parent directories; a local path
 * inside the servers' backend directory, or a path that does not exist
 * locally, is fetched by the servers from their backend (cache mode: chfsd
 * --backend), a directory recursively; without a backend that fails with
 * ENOENT. */
int chfs_stagein(const char *path);

/* ---- beyond the original CHFS API ----------------------------------- */
/* (chfs_ftruncate, chfs_fstat and chfs_access are in recent CHFS releases
 * too.) */

int chfs_rename(const char *from, const char *to);
int chfs_chmod(const char *path, mode_t mode);
/* (uid_t)-1 / (gid_t)-1 leave the id unchanged; does not follow links. */
int chfs_chown(const char *path, uid_t uid, gid_t gid);
/* times[0] = atime, times[1] = mtime (UTIME_NOW, UTIME_OMIT allowed); NULL
 * sets both to now. Does not follow links. */
int chfs_utimens(const char *path, const struct timespec times[2]);
int chfs_lstat(const char *path, struct stat *st);
int chfs_fstat(int fd, struct stat *st);
int chfs_ftruncate(int fd, off_t len);
/* Capacity of the whole file system (all servers); `path` must exist.
 * 4 KiB blocks; f_files is the entries stored plus the free blocks and
 * f_ffree the free blocks, as the mount's statfs reports. */
int chfs_statfs(const char *path, struct statvfs *buf);
/* Regular files, FIFOs, sockets and device nodes (stored as entries). */
int chfs_mknod(const char *path, mode_t mode, dev_t dev);
/* F_OK, R_OK, W_OK, X_OK against the stored mode and owner and the
 * caller's effective uid/gid (as access(2); CHFS checked existence only). */
int chfs_access(const char *path, int mode);

/* Open flag: data is a cached copy of backend data (accepted, no effect:
 * what is written back is decided by the servers). */
#define CHFS_O_CACHE	(1 << 28)
/* Mode bit used inside CHFS for replicated entries (masked off). */
#define CHFS_S_IFREP	(4 << 28)

#ifdef __cplusplus
}
#endif

#endif /* CHFS_H */
