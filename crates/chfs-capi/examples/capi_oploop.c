/*
 * One kind of operation M times through libchfs, for counting what one
 * operation costs (issue 25's breakdown, crates/chfs-bench/README.md):
 *
 *   capi_oploop OP DIR N M
 *
 * OP is create (create+close of an empty file), stat, unlink, read (a
 * 47,008-byte pread, IOR-hard's record), write (a 1 MiB pwrite) or small
 * (open, read and close of a 3,901-byte file, mdtest-hard's read). The
 * set-up (N files for stat, unlink and small, a file of N records for
 * read) is
 * done first; then, between two markers, M operations: the loop is the
 * function oploop() (for callgrind --toggle-collect=oploop), it is
 * bracketed by access("/OPLOOP-START") and access("/OPLOOP-END") (for
 * strace -f: count the calls between the markers), and $OPLOOP_HOOK, if
 * set, is run with system(3) before and after it with OPLOOP_PHASE=start
 * or end in its environment (e.g. to dump a server's callgrind counters
 * or attach strace to it). Prints "OP M us/op".
 *
 *   cc -O2 -o capi_oploop capi_oploop.c \
 *       $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs chfs) \
 *       -Wl,-rpath,PREFIX/lib
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <chfs.h>

#define RECORD	47008
#define BIG	(1 << 20)
#define SMALL	3901

static double
now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec + t.tv_nsec * 1e-9);
}

static void
hook(const char *phase)
{
	const char *h = getenv("OPLOOP_HOOK");

	if (h == NULL || *h == '\0')
		return;
	setenv("OPLOOP_PHASE", phase, 1);
	if (system(h) != 0)
		fprintf(stderr, "OPLOOP_HOOK failed at %s\n", phase);
}

static void
die(const char *what)
{
	fprintf(stderr, "%s: %s\n", what, chfs_last_error());
	exit(1);
}

/* The measured loop; not inlined so that callgrind can toggle on it. */
static __attribute__((noinline)) int
oploop(const char *op, const char *dir, int m, int fd, char *buf)
{
	char p[256];
	struct stat sb;
	int i, f;

	for (i = 0; i < m; i++) {
		snprintf(p, sizeof(p), "%s/f%d", dir, i);
		if (strcmp(op, "create") == 0) {
			if ((f = chfs_create(p, 0x10 | 0x02, 0644)) < 0)
				return (-1);
			chfs_close(f);
		} else if (strcmp(op, "stat") == 0) {
			if (chfs_stat(p, &sb))
				return (-1);
		} else if (strcmp(op, "unlink") == 0) {
			if (chfs_unlink(p))
				return (-1);
		} else if (strcmp(op, "read") == 0) {
			if (chfs_pread(fd, buf, RECORD, (off_t)i * RECORD) !=
			    RECORD)
				return (-1);
		} else if (strcmp(op, "small") == 0) {
			if ((f = chfs_open(p, 0)) < 0)
				return (-1);
			if (chfs_read(f, buf, SMALL) != SMALL)
				return (-1);
			chfs_close(f);
		} else {
			if (chfs_pwrite(fd, buf, BIG, (off_t)i * BIG) != BIG)
				return (-1);
		}
	}
	return (0);
}

int
main(int argc, char **argv)
{
	char p[256], *buf;
	const char *op, *dir;
	double t0, t1;
	int i, n, m, fd = -1, f;

	if (argc != 5 || (n = atoi(argv[3])) < 0 || (m = atoi(argv[4])) < 0 ||
	    (strcmp(argv[1], "create") && strcmp(argv[1], "stat") &&
	    strcmp(argv[1], "unlink") && strcmp(argv[1], "read") &&
	    strcmp(argv[1], "write") && strcmp(argv[1], "small"))) {
		fprintf(stderr,
		    "usage: %s create|stat|unlink|read|write|small DIR N M\n",
		    argv[0]);
		return (2);
	}
	op = argv[1];
	dir = argv[2];
	if ((strcmp(op, "stat") == 0 || strcmp(op, "unlink") == 0 ||
	    strcmp(op, "read") == 0 || strcmp(op, "small") == 0) && m > n) {
		fprintf(stderr, "%s: M must be at most N\n", op);
		return (2);
	}
	if (chfs_init(NULL))
		die("chfs_init");
	chfs_mkdir(dir, 0755);
	/* Page aligned, touched, as IOR's buffers. */
	if (posix_memalign((void **)&buf, 4096, BIG))
		return (1);
	memset(buf, 'x', BIG);
	if (strcmp(op, "stat") == 0 || strcmp(op, "unlink") == 0 ||
	    strcmp(op, "small") == 0) {
		for (i = 0; i < n; i++) {
			snprintf(p, sizeof(p), "%s/f%d", dir, i);
			if ((f = chfs_create(p, 0x10 | 0x02, 0644)) < 0)
				die(p);
			if (strcmp(op, "small") == 0 &&
			    chfs_write(f, buf, SMALL) != SMALL)
				die(p);
			chfs_close(f);
		}
	} else if (strcmp(op, "read") == 0) {
		snprintf(p, sizeof(p), "%s/data", dir);
		if ((fd = chfs_create(p, 0x10 | 0x02, 0644)) < 0)
			die(p);
		for (i = 0; i < n; i++)
			if (chfs_pwrite(fd, buf, RECORD, (off_t)i * RECORD) !=
			    RECORD)
				die("pwrite");
		chfs_close(fd);
		if ((fd = chfs_open(p, 0)) < 0)
			die(p);
	} else if (strcmp(op, "write") == 0) {
		snprintf(p, sizeof(p), "%s/data", dir);
		if ((fd = chfs_create(p, 0x10 | 0x02, 0644)) < 0)
			die(p);
	}
	hook("start");
	access("/OPLOOP-START", F_OK);
	t0 = now();
	if (oploop(op, dir, m, fd, buf))
		die(op);
	t1 = now();
	access("/OPLOOP-END", F_OK);
	hook("end");
	printf("%s %d %.2f us/op\n", op, m, m ? (t1 - t0) / m * 1e6 : 0.0);
	if (fd >= 0)
		chfs_close(fd);
	free(buf);
	chfs_term();
	return (0);
}
