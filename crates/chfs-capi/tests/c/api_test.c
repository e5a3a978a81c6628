/*
 * Every function of chfs.h against real servers, with error cases.
 *
 * usage: api_test SERVERS NSERVERS LOCALDIR
 *   CHFS_SERVER must be set too (chfs_init(NULL) is tested first);
 *   LOCALDIR is an empty local directory used by the chfs_stagein checks.
 * Prints "api_test: ok" and exits 0 on success.
 */
#include <sys/types.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <chfs.h>
#include "check.h"

#define MAXN 16

struct names {
	int n, calls, stop_after;
	char name[MAXN][64];
	struct stat st[MAXN];
	off_t off[MAXN];
};

static int
filler(void *buf, const char *name, const struct stat *st, off_t off)
{
	struct names *ns = buf;

	ns->calls++;
	if (ns->n < MAXN) {
		snprintf(ns->name[ns->n], sizeof ns->name[0], "%s", name);
		ns->st[ns->n] = *st;
		ns->off[ns->n] = off;
		ns->n++;
	}
	return (ns->stop_after > 0 && ns->calls >= ns->stop_after);
}

static int
find(struct names *ns, const char *name)
{
	int i;

	for (i = 0; i < ns->n; ++i)
		if (strcmp(ns->name[i], name) == 0)
			return (i);
	return (-1);
}

static void
write_local(const char *path, const char *data)
{
	FILE *f = fopen(path, "w");

	CHECK(f != NULL);
	CHECK(fputs(data, f) >= 0);
	CHECK(fclose(f) == 0);
}

struct thr {
	int id;
	int ok;
};

static void *
thread_main(void *arg)
{
	struct thr *t = arg;
	char path[64], buf[20000], back[20000];
	int fd, i, round;

	if (chfs_last_error()[0] != '\0')	/* errors are kept per thread */
		return (NULL);
	for (round = 0; round < 5; ++round) {
		snprintf(path, sizeof path, "/api/thr%d_%d", t->id, round);
		for (i = 0; i < (int)sizeof buf; ++i)
			buf[i] = (char)pat(i, t->id + round);
		fd = chfs_create(path, O_RDWR, 0644);
		if (fd < 0)
			return (NULL);
		if (chfs_write(fd, buf, sizeof buf) != (ssize_t)sizeof buf)
			return (NULL);
		if (chfs_pread(fd, back, sizeof back, 0) != (ssize_t)sizeof back)
			return (NULL);
		if (memcmp(buf, back, sizeof buf) != 0)
			return (NULL);
		if (chfs_close(fd) != 0 || chfs_unlink(path) != 0)
			return (NULL);
	}
	t->ok = 1;
	return (NULL);
}

#define NSIG_CHECKED 64

/* Signal dispositions, to check that the library installs no handlers. */
static void
signal_state(void *handlers[NSIG_CHECKED], stack_t *alt)
{
	struct sigaction sa;
	int s;

	for (s = 1; s < NSIG_CHECKED; ++s) {
		handlers[s] = NULL;
		if (sigaction(s, NULL, &sa) == 0)
			handlers[s] = (void *)sa.sa_handler;
	}
	CHECK(sigaltstack(NULL, alt) == 0);
}

int
main(int argc, char **argv)
{
	void *sig_before[NSIG_CHECKED], *sig_after[NSIG_CHECKED];
	stack_t alt_before, alt_after;
	struct stat st;
	struct statvfs vfs;
	struct names ns;
	struct timespec ts[2];
	char buf[70000], back[70000], lbuf[64], local[512], p[600];
	const char *servers;
	int nservers, fd, fd2, i, total;
	off_t o;

	CHECK(argc == 4);
	servers = argv[1];
	nservers = atoi(argv[2]);

	signal_state(sig_before, &alt_before);

	/* before chfs_init */
	CHECK_EQ(chfs_initialized(), 0);
	CHECK_ERR(chfs_open("/x", O_RDONLY), ENOTCONN);
	CHECK_ERR(chfs_size(), ENOTCONN);
	chfs_set_chunk_size(0);		/* ignored, no crash */
	errno = 0;
	chfs_set_chunk_size(0x7fffffff);	/* too big: ignored, EINVAL */
	CHECK(errno == EINVAL);
	chfs_set_rdma_thresh(65536);
	chfs_set_async_access(1);
	chfs_set_rpc_timeout_msec(20000);
	chfs_set_node_list_cache_timeout(60);

	CHECK_EQ(chfs_init(NULL), 0);
	CHECK_EQ(chfs_initialized(), 1);
	CHECK_EQ(chfs_init(NULL), 0);	/* second call is a no-op */
	CHECK_EQ(chfs_size(), nservers);
	CHECK(chfs_version() != NULL && chfs_version()[0] != '\0');

	/* directories */
	CHECK_EQ(chfs_mkdir("/api", 0755), 0);
	CHECK_ERR(chfs_mkdir("/api", 0755), EEXIST);
	CHECK_ERR(chfs_mkdir("/nonexistent/x", 0755), ENOENT);
	CHECK_EQ(chfs_stat("/api", &st), 0);
	CHECK(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0755);

	/* write through chfs_create, holes, positions */
	fd = chfs_create("/api/a", O_WRONLY, 0644);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_write(fd, "hello", 5), 5);
	CHECK_EQ(chfs_pwrite(fd, "world", 5, 100), 5);
	CHECK_EQ(chfs_fsync(fd), 0);
	CHECK_EQ(chfs_fstat(fd, &st), 0);
	CHECK_EQ(st.st_size, 105);
	CHECK_EQ(chfs_pread(fd, back, 5, 0), 5);	/* flags are CHFS's */
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_ERR(chfs_close(fd), EBADF);
	CHECK_ERR(chfs_write(fd, "x", 1), EBADF);
	CHECK_ERR(chfs_fsync(-1), EBADF);

	CHECK_EQ(chfs_stat("/api/a", &st), 0);
	CHECK(S_ISREG(st.st_mode));
	CHECK_EQ(st.st_mode & 07777, 0644);
	CHECK_EQ(st.st_size, 105);
	CHECK_EQ(st.st_blksize, 65536);
	CHECK_EQ(st.st_uid, geteuid());
	CHECK_EQ(st.st_nlink, 1);
	CHECK(st.st_mtime > 1600000000);

	fd = chfs_open("/api/a", O_RDONLY);
	CHECK(fd >= 0);
	memset(back, 0x55, sizeof back);
	CHECK_EQ(chfs_read(fd, back, 5), 5);
	CHECK(memcmp(back, "hello", 5) == 0);
	CHECK_EQ(chfs_pread(fd, back, 95, 5), 95);
	for (i = 0; i < 95; ++i)
		CHECK(back[i] == 0);
	CHECK_EQ(chfs_pread(fd, back, 50, 100), 5);
	CHECK(memcmp(back, "world", 5) == 0);
	CHECK_EQ(chfs_pread(fd, back, 10, 105), 0);
	CHECK_EQ(chfs_seek(fd, 0, SEEK_END), 105);
	CHECK_EQ(chfs_seek(fd, -5, SEEK_CUR), 100);
	CHECK_EQ(chfs_read(fd, back, 100), 5);
	CHECK_EQ(chfs_read(fd, back, 100), 0);
	CHECK_ERR(chfs_seek(fd, -1, SEEK_SET), EINVAL);
	CHECK_ERR(chfs_seek(fd, 0, 99), EINVAL);
	CHECK_ERR(chfs_pread(fd, back, 1, -1), EINVAL);
	CHECK_ERR(chfs_pread(fd, NULL, 1, 0), EFAULT);
	CHECK_EQ(chfs_pread(fd, NULL, 0, 0), 0);
	CHECK_EQ(chfs_close(fd), 0);

	CHECK_ERR(chfs_open("/api/missing", O_RDONLY), ENOENT);
	CHECK(strstr(chfs_last_error(), "chfs_open: ") == chfs_last_error() &&
	    strstr(chfs_last_error(), "/api/missing") != NULL &&
	    strstr(chfs_last_error(), "ENOENT") != NULL);
	CHECK_EQ(chfs_stat("/api/a", &st), 0);	/* success keeps the text */
	CHECK(strstr(chfs_last_error(), "/api/missing") != NULL);
	CHECK_ERR(chfs_open("/api", O_WRONLY), EISDIR);
	CHECK_ERR(chfs_create("/api/missing_dir/f", O_WRONLY, 0644), ENOENT);

	/* chunk size, multi-chunk data, CHFS_O_CACHE accepted */
	CHECK_ERR(chfs_create_chunk_size("/api/b", O_WRONLY, 0644, 0), EINVAL);
	CHECK_ERR(chfs_create_chunk_size("/api/b", O_WRONLY, 0644, -5), EINVAL);
	fd = chfs_create_chunk_size("/api/b", O_RDWR | CHFS_O_CACHE, 0600, 4096);
	CHECK(fd >= 0);
	for (i = 0; i < 3 * 4096 + 10; ++i)
		buf[i] = (char)pat(i, 1);
	CHECK_EQ(chfs_pwrite(fd, buf, 3 * 4096 + 10, 0), 3 * 4096 + 10);
	CHECK_EQ(chfs_pread(fd, back, sizeof back, 0), 3 * 4096 + 10);
	CHECK(memcmp(buf, back, 3 * 4096 + 10) == 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(chfs_stat("/api/b", &st), 0);
	CHECK_EQ(st.st_blksize, 4096);
	CHECK_EQ(st.st_size, 3 * 4096 + 10);
	CHECK_EQ(st.st_mode & 07777, 0600);

	/* truncate / ftruncate */
	CHECK_EQ(chfs_truncate("/api/b", 5000), 0);
	CHECK_EQ(chfs_stat("/api/b", &st), 0);
	CHECK_EQ(st.st_size, 5000);
	CHECK_ERR(chfs_truncate("/api/b", -1), EINVAL);
	CHECK_ERR(chfs_truncate("/api/nope", 0), ENOENT);
	CHECK_ERR(chfs_truncate("/api", 0), EISDIR);
	fd = chfs_open("/api/b", O_RDWR);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_ftruncate(fd, 100), 0);
	CHECK_EQ(chfs_fstat(fd, &st), 0);
	CHECK_EQ(st.st_size, 100);
	CHECK_EQ(chfs_pread(fd, back, sizeof back, 0), 100);
	CHECK(memcmp(buf, back, 100) == 0);
	CHECK_ERR(chfs_ftruncate(fd, -1), EINVAL);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_ERR(chfs_ftruncate(fd, 0), EBADF);
	CHECK_ERR(chfs_fstat(fd, &st), EBADF);

	/* symbolic links */
	CHECK_EQ(chfs_symlink("a", "/api/l"), 0);
	CHECK_ERR(chfs_symlink("a", "/api/l"), EEXIST);
	memset(lbuf, 'Z', sizeof lbuf);
	CHECK_EQ(chfs_readlink("/api/l", lbuf, sizeof lbuf), 1);
	CHECK(lbuf[0] == 'a' && lbuf[1] == 'Z');	/* no NUL added */
	CHECK_ERR(chfs_readlink("/api/l", lbuf, 0), EINVAL);
	CHECK_ERR(chfs_readlink("/api/a", lbuf, sizeof lbuf), EINVAL);
	CHECK_ERR(chfs_readlink("/api/none", lbuf, sizeof lbuf), ENOENT);
	CHECK_EQ(chfs_lstat("/api/l", &st), 0);
	CHECK(S_ISLNK(st.st_mode));
	CHECK_EQ(chfs_stat("/api/l", &st), 0);	/* the link, as in CHFS */
	CHECK(S_ISLNK(st.st_mode));
	fd = chfs_open("/api/l", O_RDONLY);	/* open follows it */
	CHECK(fd >= 0);
	CHECK_EQ(chfs_fstat(fd, &st), 0);
	CHECK(S_ISREG(st.st_mode) && st.st_size == 105);
	CHECK_EQ(chfs_close(fd), 0);

	/* readdir filler semantics */
	memset(&ns, 0, sizeof ns);
	CHECK_EQ(chfs_readdir("/api", &ns, filler), 0);
	CHECK_EQ(ns.n, 3);
	CHECK(find(&ns, ".") < 0 && find(&ns, "..") < 0);
	i = find(&ns, "a");
	CHECK(i >= 0);
	CHECK(S_ISREG(ns.st[i].st_mode) && ns.st[i].st_size == 105);
	CHECK_EQ(ns.st[i].st_mode & 07777, 0644);
	CHECK_EQ(ns.st[i].st_uid, geteuid());
	CHECK_EQ(ns.off[i], 0);
	i = find(&ns, "b");
	CHECK(i >= 0 && ns.st[i].st_size == 100 && ns.st[i].st_blksize == 4096);
	i = find(&ns, "l");
	CHECK(i >= 0 && S_ISLNK(ns.st[i].st_mode));
	memset(&ns, 0, sizeof ns);
	ns.stop_after = 1;		/* filler returning non-zero stops */
	CHECK_EQ(chfs_readdir("/api", &ns, filler), 0);
	CHECK_EQ(ns.calls, 1);
	memset(&ns, 0, sizeof ns);
	CHECK_EQ(chfs_readdir("/", &ns, filler), 0);
	CHECK(find(&ns, "api") >= 0 && S_ISDIR(ns.st[find(&ns, "api")].st_mode));
	CHECK_ERR(chfs_readdir("/api/none", &ns, filler), ENOENT);
	CHECK_ERR(chfs_readdir("/api/a", &ns, filler), ENOTDIR);
	CHECK_EQ(chfs_readdir("/api", &ns, NULL), 0);

	/* readdir_index: every entry is held by exactly one server */
	for (total = 0, i = 0; i < nservers; ++i) {
		memset(&ns, 0, sizeof ns);
		CHECK_EQ(chfs_readdir_index("/api", i, &ns, filler), 0);
		total += ns.n;
	}
	CHECK_EQ(total, 3);
	CHECK_ERR(chfs_readdir_index("/api", nservers, &ns, filler), EINVAL);
	CHECK_ERR(chfs_readdir_index("/api", -1, &ns, filler), EINVAL);

	/* beyond CHFS: rename, chmod, chown, utimens, access, statfs, mknod */
	CHECK_EQ(chfs_rename("/api/a", "/api/c"), 0);
	CHECK_ERR(chfs_stat("/api/a", &st), ENOENT);
	CHECK_EQ(chfs_stat("/api/c", &st), 0);
	CHECK_EQ(st.st_size, 105);
	CHECK_ERR(chfs_rename("/api/none", "/api/d"), ENOENT);
	CHECK_EQ(chfs_chmod("/api/c", 0600), 0);
	CHECK_EQ(chfs_stat("/api/c", &st), 0);
	CHECK_EQ(st.st_mode & 07777, 0600);
	CHECK(S_ISREG(st.st_mode));
	CHECK_ERR(chfs_chmod("/api/none", 0600), ENOENT);
	CHECK_EQ(chfs_chown("/api/c", (uid_t)-1, (gid_t)-1), 0);
	CHECK_EQ(chfs_chown("/api/c", geteuid(), getegid()), 0);
	ts[0].tv_sec = 1000; ts[0].tv_nsec = 5;
	ts[1].tv_sec = 2000; ts[1].tv_nsec = 7;
	CHECK_EQ(chfs_utimens("/api/c", ts), 0);
	CHECK_EQ(chfs_stat("/api/c", &st), 0);
	CHECK_EQ(st.st_atime, 1000);
	CHECK_EQ(st.st_atim.tv_nsec, 5);
	CHECK_EQ(st.st_mtime, 2000);
	CHECK_EQ(st.st_mtim.tv_nsec, 7);
	ts[0].tv_nsec = UTIME_OMIT;
	ts[1].tv_nsec = UTIME_NOW;
	CHECK_EQ(chfs_utimens("/api/c", ts), 0);
	CHECK_EQ(chfs_stat("/api/c", &st), 0);
	CHECK_EQ(st.st_atime, 1000);
	CHECK(st.st_mtime > time(NULL) - 600);
	ts[1].tv_nsec = 1000000000;
	CHECK_ERR(chfs_utimens("/api/c", ts), EINVAL);
	CHECK_EQ(chfs_utimens("/api/c", NULL), 0);
	CHECK_EQ(chfs_access("/api/c", F_OK), 0);
	CHECK_EQ(chfs_access("/api/c", R_OK | W_OK), 0);
	CHECK_ERR(chfs_access("/api/none", F_OK), ENOENT);
	CHECK_EQ(chfs_statfs("/", &vfs), 0);
	CHECK_EQ(vfs.f_bsize, 4096);
	CHECK_EQ(vfs.f_namemax, 255);
	CHECK(vfs.f_files > 0);
	CHECK_ERR(chfs_statfs("/api/none", &vfs), ENOENT);
	CHECK_ERR(chfs_statfs("/", NULL), EFAULT);
	CHECK_EQ(chfs_mknod("/api/fifo", S_IFIFO | 0644, 0), 0);
	CHECK_EQ(chfs_lstat("/api/fifo", &st), 0);
	CHECK(S_ISFIFO(st.st_mode));
	CHECK_ERR(chfs_mknod("/api/dir2", S_IFDIR | 0755, 0), EINVAL);

	/* NULL arguments */
	CHECK_ERR(chfs_stat(NULL, &st), EFAULT);
	CHECK_ERR(chfs_stat("/api/c", NULL), EFAULT);
	CHECK_ERR(chfs_open(NULL, O_RDONLY), EFAULT);
	CHECK_ERR(chfs_symlink(NULL, "/api/x"), EFAULT);

	/* unlink / rmdir */
	CHECK_ERR(chfs_rmdir("/api"), ENOTEMPTY);
	CHECK_ERR(chfs_unlink("/api"), EISDIR);
	CHECK_ERR(chfs_rmdir("/api/c"), ENOTDIR);
	CHECK_EQ(chfs_unlink("/api/c"), 0);
	CHECK_ERR(chfs_unlink("/api/c"), ENOENT);
	CHECK_EQ(chfs_unlink("/api/b"), 0);
	CHECK_EQ(chfs_unlink("/api/l"), 0);
	CHECK_EQ(chfs_unlink("/api/fifo"), 0);

	/* threads share the client */
	{
		pthread_t th[4];
		struct thr t[4];

		for (i = 0; i < 4; ++i) {
			t[i].id = i;
			t[i].ok = 0;
			CHECK(pthread_create(&th[i], NULL, thread_main, &t[i]) == 0);
		}
		for (i = 0; i < 4; ++i) {
			CHECK(pthread_join(th[i], NULL) == 0);
			CHECK(t[i].ok);
		}
	}

	/* fork: the child reconnects by itself; the parent keeps working */
	fd = chfs_create("/api/parent", O_RDWR, 0644);
	CHECK(fd >= 0);
	{
		pid_t pid = fork();
		int status;

		CHECK(pid >= 0);
		if (pid == 0) {
			int cfd = chfs_create("/api/child", O_WRONLY, 0644);

			if (cfd < 0 || chfs_write(cfd, "kid", 3) != 3 ||
			    chfs_close(cfd) != 0)
				_exit(2);
			/* the parent's descriptor is not valid here */
			if (chfs_write(fd, "x", 1) != -1 || errno != EBADF)
				_exit(3);
			_exit(chfs_term() == 0 ? 0 : 4);
		}
		CHECK(waitpid(pid, &status, 0) == pid);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	CHECK_EQ(chfs_write(fd, "mom", 3), 3);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(chfs_stat("/api/child", &st), 0);
	CHECK_EQ(st.st_size, 3);
	CHECK_EQ(chfs_stat("/api/parent", &st), 0);
	CHECK_EQ(st.st_size, 3);
	CHECK_EQ(chfs_unlink("/api/child"), 0);
	CHECK_EQ(chfs_unlink("/api/parent"), 0);

	/* stage-in of a local file, directory and link */
	snprintf(local, sizeof local, "%s/in", argv[3]);
	CHECK(mkdir(local, 0750) == 0);
	snprintf(p, sizeof p, "%s/in/data", argv[3]);
	write_local(p, "staged data\n");
	snprintf(p, sizeof p, "%s/in/link", argv[3]);
	CHECK(symlink("data", p) == 0);
	chfs_set_stagein_buf_size(4);		/* several reads per file */
	CHECK_EQ(chfs_stagein(local), 0);	/* the directory and its contents */
	snprintf(p, sizeof p, "%s/in/data", argv[3]);
	CHECK_EQ(chfs_stat(p, &st), 0);
	CHECK_EQ(st.st_size, 12);
	CHECK_EQ(chfs_stagein(local), 0);	/* existing directory is fine */
	snprintf(p, sizeof p, "%s/in/data", argv[3]);
	CHECK_EQ(chfs_stagein(p), 0);
	snprintf(p, sizeof p, "%s/in/link", argv[3]);
	CHECK_EQ(chfs_stagein(p), 0);
	snprintf(p, sizeof p, "%s/in/none", argv[3]);
	CHECK_ERR(chfs_stagein(p), ENOENT);
	CHECK_EQ(chfs_stat(local, &st), 0);
	CHECK(S_ISDIR(st.st_mode));
	snprintf(p, sizeof p, "%s/in/data", argv[3]);
	fd = chfs_open(p, O_RDONLY);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_read(fd, back, sizeof back), 12);
	CHECK(memcmp(back, "staged data\n", 12) == 0);
	CHECK_EQ(chfs_close(fd), 0);
	snprintf(p, sizeof p, "%s/in/link", argv[3]);
	CHECK_EQ(chfs_readlink(p, lbuf, sizeof lbuf), 4);
	CHECK(memcmp(lbuf, "data", 4) == 0);

	/* chfs_sync flushes buffered writes of open descriptors */
	chfs_set_buf_size(1 << 16);
	fd = chfs_create("/api/buffered", O_WRONLY, 0644);
	CHECK(fd >= 0);
	for (o = 0; o < 1000; o += 10)
		CHECK_EQ(chfs_pwrite(fd, "0123456789", 10, o), 10);
	chfs_sync();
	fd2 = chfs_open("/api/buffered", O_RDONLY);
	CHECK(fd2 >= 0);
	CHECK_EQ(chfs_pread(fd2, back, sizeof back, 0), 1000);
	CHECK(memcmp(back + 990, "0123456789", 10) == 0);
	CHECK_EQ(chfs_close(fd2), 0);
	CHECK_EQ(chfs_close(fd), 0);
	chfs_set_buf_size(0);
	CHECK_EQ(chfs_unlink("/api/buffered"), 0);
	CHECK_EQ(chfs_rmdir("/api"), 0);

	/* no signal handler or alternate stack was installed */
	signal_state(sig_after, &alt_after);
	for (i = 1; i < NSIG_CHECKED; ++i)
		CHECK(sig_before[i] == sig_after[i]);
	CHECK(alt_before.ss_flags == alt_after.ss_flags &&
	    alt_before.ss_sp == alt_after.ss_sp);

	/* term, re-init with an explicit server, term_without_sync */
	fd = chfs_create("/open_at_term", O_WRONLY, 0644);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_term(), 0);
	CHECK_EQ(chfs_initialized(), 0);
	CHECK_ERR(chfs_stat("/", &st), ENOTCONN);
	CHECK_EQ(chfs_term(), 0);
	CHECK_EQ(chfs_init(servers), 0);
	CHECK_EQ(chfs_stat("/", &st), 0);
	CHECK(S_ISDIR(st.st_mode));
	CHECK_ERR(chfs_write(fd, "x", 1), EBADF);	/* from before chfs_term */
	CHECK_EQ(chfs_unlink("/open_at_term"), 0);
	CHECK_EQ(chfs_term_without_sync(), 0);
	CHECK_EQ(chfs_initialized(), 0);

	/* chfs_term flushes buffered writes; chfs_term_without_sync drops them */
	chfs_set_buf_size(4096);
	CHECK_EQ(chfs_init(NULL), 0);
	fd = chfs_create("/kept", O_WRONLY, 0644);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_write(fd, "0123456789", 10), 10);
	fd2 = chfs_create("/dropped", O_WRONLY, 0644);
	CHECK(fd2 >= 0);
	CHECK_EQ(chfs_write(fd2, "0123456789", 10), 10);
	CHECK_EQ(chfs_term(), 0);
	CHECK_EQ(chfs_init(NULL), 0);
	CHECK_EQ(chfs_stat("/kept", &st), 0);
	CHECK_EQ(st.st_size, 10);
	CHECK_EQ(chfs_stat("/dropped", &st), 0);
	CHECK_EQ(st.st_size, 10);	/* flushed by the chfs_term above */
	fd = chfs_open("/dropped", O_WRONLY);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_pwrite(fd, "abc", 3, 10), 3);	/* buffered */
	CHECK_EQ(chfs_term_without_sync(), 0);
	CHECK_EQ(chfs_init(NULL), 0);
	CHECK_EQ(chfs_stat("/dropped", &st), 0);
	CHECK_EQ(st.st_size, 10);
	CHECK_EQ(chfs_unlink("/kept"), 0);
	CHECK_EQ(chfs_unlink("/dropped"), 0);
	CHECK_EQ(chfs_term(), 0);

	printf("api_test: ok\n");
	return (0);
}
