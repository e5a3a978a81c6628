/*
 * Drives libchfs the way the CHFS backend of IOR, mdtest and md-workbench
 * (aiori-CHFS.c) does: chfs_set_chunk_size before chfs_init(NULL), the
 * benchmark's own open-flag constants passed straight to chfs_create /
 * chfs_open, mode 0664, data through chfs_pwrite / chfs_pread at offsets,
 * chfs_fsync, sizes through chfs_stat, chfs_unlink, chfs_mkdir / chfs_rmdir,
 * chfs_term at the end. One process is one benchmark rank.
 *
 * usage:
 *   hpc_backend write PATH RANK NRANKS XFER SEGMENTS fpp|shared [CHUNK]
 *   hpc_backend read PATH WRITER NRANKS XFER SEGMENTS fpp|shared
 *   hpc_backend unlink PATH
 *   hpc_backend mdtest mkdir|create|stat|read|delete|rmdir DIR RANK NFILES SIZE
 *
 * write: create (IOR_WRONLY|IOR_CREAT|IOR_TRUNC) as every IOR rank does,
 *   then SEGMENTS blocks of XFER bytes with chfs_pwrite: block i at
 *   i*XFER of the rank's own file (fpp) or at (i*NRANKS+RANK)*XFER of one
 *   shared file; chfs_fsync; close. With HPC_BARRIER=1 the rank stops after
 *   the create and after the fsync, printing "created" / "synced" and
 *   waiting for a line on stdin (the test's MPI_Barrier).
 * read: open (IOR_RDONLY), chfs_pread the blocks rank WRITER wrote (IO500
 *   reads with another rank than the writer) and compare them, chfs_stat
 *   the size, close. A failed read ends the program with status 2 and
 *   "cannot read from file" on stderr, as IOR does.
 * mdtest: files DIR/tree.0/tree.1/file.mdtest.RANK.I, created with
 *   IOR_WRONLY|IOR_CREAT and SIZE bytes written (mdtest -w), stat'ed,
 *   read back through IOR_RDONLY descriptors, deleted; mkdir / rmdir make
 *   and remove the tree.
 * Prints "hpc_backend: ok" on success.
 */
#include <sys/stat.h>
#include <unistd.h>
#include <chfs.h>
#include "check.h"

/* The open flags of IOR's aiori.h, which its CHFS backend passes as they are. */
#define IOR_RDONLY	0x01
#define IOR_WRONLY	0x02
#define IOR_RDWR	0x04
#define IOR_APPEND	0x08
#define IOR_CREAT	0x10
#define IOR_TRUNC	0x20
#define IOR_EXCL	0x40

static void
barrier(const char *step)
{
	char line[64];
	const char *b = getenv("HPC_BARRIER");

	if (b == NULL || strcmp(b, "1") != 0)
		return;
	printf("%s\n", step);
	fflush(stdout);
	CHECK(fgets(line, sizeof line, stdin) != NULL);
}

static long long
block_offset(int shared, long long i, int rank, int nranks, long long xfer)
{
	return ((shared ? i * nranks + rank : i) * xfer);
}

static void
fill(char *buf, long long off, long long n, int seed)
{
	long long j;

	for (j = 0; j < n; ++j)
		buf[j] = (char)pat(off + j, seed);
}

static int
ior_write(const char *path, int rank, int nranks, long long xfer, int segs,
	int shared)
{
	char *buf = malloc(xfer);
	long long i, off;
	int fd;

	CHECK(buf != NULL);
	fd = chfs_create(path, IOR_WRONLY | IOR_CREAT | IOR_TRUNC, 0664);
	if (fd < 0) {
		fprintf(stderr, "hpc_backend: chfs_create failed: %s: %s\n",
			strerror(errno), chfs_last_error());
		return (1);
	}
	barrier("created");
	for (i = 0; i < segs; ++i) {
		off = block_offset(shared, i, rank, nranks, xfer);
		fill(buf, off, xfer, rank + 1);
		CHECK_EQ(chfs_pwrite(fd, buf, xfer, off), xfer);
	}
	CHECK_EQ(chfs_fsync(fd), 0);
	barrier("synced");
	CHECK_EQ(chfs_close(fd), 0);
	free(buf);
	return (0);
}

static int
ior_read(const char *path, int writer, int nranks, long long xfer, int segs,
	int shared)
{
	char *buf = malloc(xfer), *want = malloc(xfer);
	long long i, off, size;
	struct stat st;
	ssize_t r;
	int fd;

	CHECK(buf != NULL && want != NULL);
	fd = chfs_open(path, IOR_RDONLY);
	if (fd < 0) {
		fprintf(stderr, "hpc_backend: chfs_open failed: %s: %s\n",
			strerror(errno), chfs_last_error());
		return (1);
	}
	for (i = 0; i < segs; ++i) {
		off = block_offset(shared, i, writer, nranks, xfer);
		r = chfs_pread(fd, buf, xfer, off);
		if (r != xfer) {
			fprintf(stderr, "hpc_backend: cannot read from file %s "
				"at %lld: %zd, %s: %s\n", path, off, r,
				strerror(errno), chfs_last_error());
			exit(2);
		}
		fill(want, off, xfer, writer + 1);
		if (memcmp(buf, want, xfer) != 0) {
			fprintf(stderr, "hpc_backend: %s: block at %lld "
				"differs\n", path, off);
			return (1);
		}
	}
	CHECK_EQ(chfs_close(fd), 0);
	size = (shared ? (long long)nranks : 1) * segs * xfer;
	CHECK_EQ(chfs_stat(path, &st), 0);
	CHECK(S_ISREG(st.st_mode));
	CHECK_EQ(st.st_size, size);
	free(buf);
	free(want);
	return (0);
}

static int
mdtest(const char *phase, const char *dir, int rank, int nfiles, int size)
{
	char d1[512], d2[512], p[600], *buf = malloc(size + 1),
		*back = malloc(size + 1);
	struct stat st;
	int i, fd;

	CHECK(buf != NULL && back != NULL);
	snprintf(d1, sizeof d1, "%s/tree.0", dir);
	snprintf(d2, sizeof d2, "%s/tree.0/tree.1", dir);
	if (strcmp(phase, "mkdir") == 0) {
		CHECK_EQ(chfs_mkdir(dir, 0775), 0);
		CHECK_EQ(chfs_mkdir(d1, 0775), 0);
		CHECK_EQ(chfs_mkdir(d2, 0775), 0);
		CHECK_EQ(chfs_stat(d2, &st), 0);
		CHECK(S_ISDIR(st.st_mode));
	} else if (strcmp(phase, "rmdir") == 0) {
		CHECK_EQ(chfs_rmdir(d2), 0);
		CHECK_EQ(chfs_rmdir(d1), 0);
		CHECK_EQ(chfs_rmdir(dir), 0);
		CHECK_ERR(chfs_stat(dir, &st), ENOENT);
	}
	for (i = 0; i < nfiles; ++i) {
		snprintf(p, sizeof p, "%s/file.mdtest.%d.%d", d2, rank, i);
		fill(buf, 0, size, rank * 7919 + i);
		if (strcmp(phase, "create") == 0) {
			fd = chfs_create(p, IOR_WRONLY | IOR_CREAT, 0664);
			CHECK(fd >= 0);
			if (size > 0)
				CHECK_EQ(chfs_pwrite(fd, buf, size, 0), size);
			CHECK_EQ(chfs_close(fd), 0);
		} else if (strcmp(phase, "stat") == 0) {
			CHECK_EQ(chfs_stat(p, &st), 0);
			CHECK(S_ISREG(st.st_mode));
			CHECK_EQ(st.st_mode & 0777, 0664);
			CHECK_EQ(st.st_size, size);
		} else if (strcmp(phase, "read") == 0) {
			fd = chfs_open(p, IOR_RDONLY);
			CHECK(fd >= 0);
			CHECK_EQ(chfs_pread(fd, back, size + 1, 0), size);
			CHECK(memcmp(buf, back, size) == 0);
			CHECK_EQ(chfs_close(fd), 0);
		} else if (strcmp(phase, "delete") == 0) {
			CHECK_EQ(chfs_unlink(p), 0);
			CHECK_ERR(chfs_stat(p, &st), ENOENT);
		}
	}
	free(buf);
	free(back);
	return (0);
}

int
main(int argc, char **argv)
{
	int r;

	CHECK(argc >= 3);
	if (strcmp(argv[1], "write") == 0 && (argc == 8 || argc == 9)) {
		if (argc == 9)
			chfs_set_chunk_size(atoi(argv[8]));
	} else if (strcmp(argv[1], "mdtest") == 0) {
		CHECK(argc == 7);
	} else
		CHECK((strcmp(argv[1], "read") == 0 && argc == 8) ||
		    (strcmp(argv[1], "unlink") == 0 && argc == 3));
	if (chfs_init(NULL) != 0) {
		fprintf(stderr, "hpc_backend: chfs_init: %s\n",
			chfs_last_error());
		return (1);
	}
	if (strcmp(argv[1], "write") == 0)
		r = ior_write(argv[2], atoi(argv[3]), atoi(argv[4]),
			atoll(argv[5]), atoi(argv[6]),
			strcmp(argv[7], "shared") == 0);
	else if (strcmp(argv[1], "read") == 0)
		r = ior_read(argv[2], atoi(argv[3]), atoi(argv[4]),
			atoll(argv[5]), atoi(argv[6]),
			strcmp(argv[7], "shared") == 0);
	else if (strcmp(argv[1], "unlink") == 0) {
		CHECK_EQ(chfs_unlink(argv[2]), 0);
		r = 0;
	} else
		r = mdtest(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]),
			atoi(argv[6]));
	CHECK_EQ(chfs_term(), 0);
	if (r == 0)
		printf("hpc_backend: ok\n");
	return (r);
}
