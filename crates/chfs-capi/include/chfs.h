/*
 * chfs.h - the CHFS C API, as implemented by chfs-rs (libchfs.so.0).
 *
 * Source- and binary-compatible with the header and library of the original
 * CHFS (soname libchfs.so.0): programs built against either run against the
 * other. Build with:  cc prog.c $(pkg-config --cflags --libs chfs)
 *
 * Conventions (all functions):
 *  - On error, functions returning int/ssize_t/off_t return -1 and set errno
 *    (POSIX values); on success errno is left unchanged.
 *  - Calls made before chfs_init() fail with ENOTCONN.
 *  - A NULL pointer where a string or struct is required gives EFAULT; a path
 *    that is not valid UTF-8 gives EINVAL.
 *  - Paths are absolute within CHFS; "." and ".." are resolved lexically.
 *  - Descriptors are small integers private to libchfs (not kernel fds). A
 *    child made by fork() reconnects by itself on its first call; it cannot
 *    use descriptors its parent opened (EBADF).
 *  - Every function is safe to call from several threads. The library prints
 *    nothing unless CHFS_LOG_PRIORITY is set, installs no signal handlers, and
 *    never exits or aborts the process.
 *
 * Environment variables (CHFS_SERVER, CHFS_CHUNK_SIZE, CHFS_BUF_SIZE, ...)
 * are read once by chfs_init() and validated: a bad value makes chfs_init()
 * fail with EINVAL. See the table in README.md of crates/chfs-capi.
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
 * invalid, or with the connection error. A second call in the same process
 * while initialised does nothing and returns 0. */
int chfs_init(const char *server);
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
 * into one request (0 = off; ignored if < 0). Applies to descriptors opened
 * afterwards. */
void chfs_set_buf_size(int buf_size);
/* Concurrent chunk RPCs of one read/write (takes effect at chfs_init). */
void chfs_set_async_access(int enable);
/* Accepted for compatibility; no effect (transfers use TCP). */
void chfs_set_rdma_thresh(size_t thresh);
/* RPC timeout in ms (takes effect at chfs_init; 0 = 30000). */
void chfs_set_rpc_timeout_msec(int timeout);
/* Server list cache time in s (takes effect at chfs_init). */
void chfs_set_node_list_cache_timeout(int timeout);
/* Buffer size of chfs_stagein (default 1 MiB; ignored if <= 0). */
void chfs_set_stagein_buf_size(int buf_size);

/* ---- files ------------------------------------------------------------ */

/* Opens `path`, creating it (mode & 07777) if needed; `flags` are open(2)
 * flags (O_CREAT is implied; O_EXCL and O_TRUNC are honoured) possibly with
 * CHFS_O_CACHE. Returns a descriptor. */
int chfs_create(const char *path, int32_t flags, mode_t mode);
/* As chfs_create with a chunk size for the new file (EINVAL if <= 0). */
int chfs_create_chunk_size(const char *path, int32_t flags, mode_t mode,
	int chunk_size);
/* Opens an existing file (ENOENT if missing, EISDIR for a directory opened
 * for writing). */
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
/* Flushes the descriptor's buffer and publishes the file size. */
int chfs_fsync(int fd);
int chfs_truncate(const char *path, off_t len);
int chfs_unlink(const char *path);
int chfs_mkdir(const char *path, mode_t mode);
/* ENOTEMPTY if the directory has entries. */
int chfs_rmdir(const char *path);
/* Follows a final symbolic link. */
int chfs_stat(const char *path, struct stat *st);
/* Calls filler(buf, name, &st, 0) once per entry (no "." or ".."), in no
 * particular order, stopping early when filler returns non-zero. `st` is
 * only valid during the call. Fails with ENOENT/ENOTDIR. */
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
/* Flushes every open descriptor of this process. */
void chfs_sync(void);
/* Copies local `path` (file, directory or symbolic link) into CHFS at
 * CHFS_SUBDIR_PATH/path, creating missing parent directories. If `path` does
 * not exist locally, the servers stage CHFS_SUBDIR_PATH/path in from their
 * backend (cache mode: chfsd --backend), a directory recursively; without a
 * backend that fails with ENOENT. */
int chfs_stagein(const char *path);

/* ---- beyond the original CHFS API ----------------------------------- */

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
/* Capacity of the whole file system (all servers); `path` must exist. */
int chfs_statfs(const char *path, struct statvfs *buf);
/* Regular files, FIFOs, sockets and device nodes (stored as entries). */
int chfs_mknod(const char *path, mode_t mode, dev_t dev);
/* F_OK, R_OK, W_OK, X_OK against the caller's effective uid/gid. */
int chfs_access(const char *path, int mode);

/* Open flag: data is a cached copy of backend data (accepted). */
#define CHFS_O_CACHE	(1 << 28)
/* Mode bit used inside CHFS for replicated entries (masked off). */
#define CHFS_S_IFREP	(4 << 28)

#ifdef __cplusplus
}
#endif

#endif /* CHFS_H */
