/*
 * Compile-only check: redeclares every function with the exact C signature
 * the CHFS API has (issue 8 list); the compiler rejects any declaration in
 * chfs.h that differs. Built with -Werror by tests/capi.rs.
 */
#include <sys/types.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <stdint.h>
#include <time.h>
#include <chfs.h>

int chfs_init(const char *server);
int chfs_initialized(void);
int chfs_term(void);
int chfs_term_without_sync(void);
int chfs_size(void);
const char *chfs_version(void);
void chfs_set_chunk_size(int);
void chfs_set_buf_size(int);
void chfs_set_async_access(int);
void chfs_set_rdma_thresh(size_t);
void chfs_set_rpc_timeout_msec(int);
void chfs_set_node_list_cache_timeout(int);
int chfs_create(const char *path, int32_t flags, mode_t mode);
int chfs_create_chunk_size(const char *path, int32_t flags, mode_t mode, int chunk_size);
int chfs_open(const char *path, int32_t flags);
int chfs_close(int fd);
ssize_t chfs_pwrite(int fd, const void *buf, size_t size, off_t offset);
ssize_t chfs_write(int fd, const void *buf, size_t size);
ssize_t chfs_pread(int fd, void *buf, size_t size, off_t offset);
ssize_t chfs_read(int fd, void *buf, size_t size);
off_t chfs_seek(int fd, off_t off, int whence);
int chfs_fsync(int fd);
int chfs_truncate(const char *path, off_t len);
int chfs_unlink(const char *path);
int chfs_mkdir(const char *path, mode_t mode);
int chfs_rmdir(const char *path);
int chfs_stat(const char *path, struct stat *st);
int chfs_readdir(const char *path, void *buf, int (*filler)(void *, const char *, const struct stat *, off_t));
int chfs_readdir_index(const char *path, int index, void *buf, int (*filler)(void *, const char *, const struct stat *, off_t));
int chfs_symlink(const char *target, const char *path);
int chfs_readlink(const char *path, char *buf, size_t size);
void chfs_sync(void);
void chfs_set_stagein_buf_size(int);
int chfs_stagein(const char *path);

#if CHFS_O_CACHE != (1 << 28)
#error CHFS_O_CACHE
#endif
#if CHFS_S_IFREP != (4 << 28)
#error CHFS_S_IFREP
#endif

int
main(void)
{
	/* Take the address of each function so that linking checks that the
	 * library exports them all. */
	void *fns[] = {
		(void *)chfs_init, (void *)chfs_initialized, (void *)chfs_term,
		(void *)chfs_term_without_sync, (void *)chfs_size,
		(void *)chfs_version, (void *)chfs_set_chunk_size,
		(void *)chfs_set_buf_size, (void *)chfs_set_async_access,
		(void *)chfs_set_rdma_thresh, (void *)chfs_set_rpc_timeout_msec,
		(void *)chfs_set_node_list_cache_timeout, (void *)chfs_create,
		(void *)chfs_create_chunk_size, (void *)chfs_open,
		(void *)chfs_close, (void *)chfs_pwrite, (void *)chfs_write,
		(void *)chfs_pread, (void *)chfs_read, (void *)chfs_seek,
		(void *)chfs_fsync, (void *)chfs_truncate, (void *)chfs_unlink,
		(void *)chfs_mkdir, (void *)chfs_rmdir, (void *)chfs_stat,
		(void *)chfs_readdir, (void *)chfs_readdir_index,
		(void *)chfs_symlink, (void *)chfs_readlink, (void *)chfs_sync,
		(void *)chfs_set_stagein_buf_size, (void *)chfs_stagein,
		(void *)chfs_rename, (void *)chfs_chmod, (void *)chfs_chown,
		(void *)chfs_utimens, (void *)chfs_lstat, (void *)chfs_fstat,
		(void *)chfs_ftruncate, (void *)chfs_statfs, (void *)chfs_mknod,
		(void *)chfs_access,
	};
	size_t i;

	for (i = 0; i < sizeof(fns) / sizeof(fns[0]); ++i)
		if (fns[i] == NULL)
			return (1);
	return (0);
}
