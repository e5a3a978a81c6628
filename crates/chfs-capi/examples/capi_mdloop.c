/*
 * mdtest-easy-like loop through libchfs: create+close, then stat, then
 * unlink of N files in one directory, each phase timed; run several at
 * once (one directory each) for several ranks. The C API figures of
 * issue 25's note were taken with it.
 *
 *   scripts/install.sh --from target/release PREFIX
 *   cc -O2 -o capi_mdloop capi_mdloop.c \
 *       $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs chfs) \
 *       -Wl,-rpath,PREFIX/lib
 *   CHFS_SERVER=host:port ./capi_mdloop /dir 20000
 *
 * Prints: "create <us> stat <us> unlink <us> us/op". The flags are the
 * benchmark backends' own (0x10 create, 0x02 write-only), as IOR and
 * mdtest pass them.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <chfs.h>

static double
now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec + t.tv_nsec * 1e-9);
}

int
main(int argc, char **argv)
{
	char p[256];
	struct stat sb;
	double t0, t1, t2, t3;
	int i, n, fd;

	if (argc != 3 || (n = atoi(argv[2])) <= 0) {
		fprintf(stderr, "usage: %s DIR FILES\n", argv[0]);
		return (2);
	}
	if (chfs_init(NULL)) {
		fprintf(stderr, "chfs_init: %s\n", chfs_last_error());
		return (1);
	}
	chfs_mkdir(argv[1], 0755);
	t0 = now();
	for (i = 0; i < n; i++) {
		snprintf(p, sizeof(p), "%s/f%d", argv[1], i);
		if ((fd = chfs_create(p, 0x10 | 0x02, 0644)) < 0) {
			perror(p);
			return (1);
		}
		chfs_close(fd);
	}
	t1 = now();
	for (i = 0; i < n; i++) {
		snprintf(p, sizeof(p), "%s/f%d", argv[1], i);
		if (chfs_stat(p, &sb)) {
			perror(p);
			return (1);
		}
	}
	t2 = now();
	for (i = 0; i < n; i++) {
		snprintf(p, sizeof(p), "%s/f%d", argv[1], i);
		if (chfs_unlink(p)) {
			perror(p);
			return (1);
		}
	}
	t3 = now();
	printf("create %.1f stat %.1f unlink %.1f us/op\n", (t1 - t0) / n * 1e6,
	    (t2 - t1) / n * 1e6, (t3 - t2) / n * 1e6);
	chfs_term();
	return (0);
}
