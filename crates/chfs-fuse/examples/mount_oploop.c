/*
 * mdtest-easy's operations through a mount, one process (issue 25's
 * per-operation breakdown of chfuse, crates/chfs-bench/README.md):
 *
 *   mount_oploop DIR N [PHASES]
 *
 * PHASES (default "csu"): c = N creates (open(O_CREAT|O_WRONLY) + close
 * of an empty file, as mdtest -F does), s = N stats, u = N unlinks of
 * DIR/file.mdtest.0.I, n = N stats of those names expecting ENOENT (an
 * existence check: "nc" creates names the kernel holds as negative
 * entries, which it creates without a LOOKUP). Each phase prints its time per operation and the
 * caller's CPU time and context switches per operation (getrusage). Run
 * one phase per call, with a pause longer than the mount's timeouts in
 * between, to see the requests IO500's phases see. $OPLOOP_HOOK, if set,
 * runs with system(3) before and after each phase (OPLOOP_PHASE=start or
 * end), e.g. to read counters.
 *
 *   cc -O2 -o mount_oploop crates/chfs-fuse/examples/mount_oploop.c
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void hook(const char *phase)
{
	const char *h = getenv("OPLOOP_HOOK");
	if (h) {
		setenv("OPLOOP_PHASE", phase, 1);
		if (system(h) != 0)
			fprintf(stderr, "OPLOOP_HOOK failed\n");
	}
}

static double us(struct timeval a, struct timeval b)
{
	return (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_usec - a.tv_usec);
}

static int run(char op, const char *dir, int n)
{
	char p[4096];
	struct rusage r0, r1;
	struct stat st;
	hook("start");
	getrusage(RUSAGE_SELF, &r0);
	double t0 = now();
	for (int i = 0; i < n; i++) {
		snprintf(p, sizeof p, "%s/file.mdtest.0.%d", dir, i);
		int bad;
		if (op == 'c') {
			int fd = open(p, O_CREAT | O_WRONLY, 0644);
			bad = fd < 0 || close(fd) != 0;
		} else if (op == 's') {
			bad = stat(p, &st) != 0;
		} else if (op == 'n') {
			bad = stat(p, &st) == 0 || errno != ENOENT;
		} else {
			bad = unlink(p) != 0;
		}
		if (bad) {
			perror(p);
			return 1;
		}
	}
	double t1 = now();
	getrusage(RUSAGE_SELF, &r1);
	hook("end");
	const char *name = op == 'c'   ? "create"
			   : op == 's' ? "stat"
			   : op == 'n' ? "stat-missing"
				       : "unlink";
	printf("%s %d %.2f us/op, caller cpu %.2f us/op, context switches %.2f/op\n",
	       name, n, (t1 - t0) * 1e6 / n,
	       (us(r0.ru_utime, r1.ru_utime) + us(r0.ru_stime, r1.ru_stime)) / n,
	       (double)(r1.ru_nvcsw - r0.ru_nvcsw + r1.ru_nivcsw - r0.ru_nivcsw) / n);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s DIR N [csun]\n", argv[0]);
		return 2;
	}
	int n = atoi(argv[2]);
	const char *phases = argc > 3 ? argv[3] : "csu";
	for (const char *c = phases; *c; c++)
		if (strchr("csun", *c) && run(*c, argv[1], n))
			return 1;
	return 0;
}
