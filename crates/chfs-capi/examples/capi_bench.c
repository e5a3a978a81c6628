/*
 * Sequential write then read of one file through libchfs, timed.
 * usage: capi_bench PATH MIB REQ_BYTES   (CHFS_SERVER from the environment)
 * Prints: "write_s=<seconds> read_s=<seconds>".
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <chfs.h>

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (ts.tv_sec + ts.tv_nsec * 1e-9);
}

int
main(int argc, char **argv)
{
	long long total, done;
	size_t req, i;
	char *buf, *back;
	double t0, tw, tr;
	ssize_t n;
	int fd;

	if (argc != 4)
		return (2);
	total = atoll(argv[2]) << 20;
	req = (size_t)atol(argv[3]);
	buf = malloc(req);
	back = malloc(req);
	if (buf == NULL || back == NULL)
		return (3);
	for (i = 0; i < req; ++i)
		buf[i] = (char)(i * 31 + 7);
	if (chfs_init(NULL) != 0) {
		perror("chfs_init");
		return (1);
	}

	t0 = now();
	fd = chfs_create(argv[1], O_WRONLY | O_TRUNC, 0644);
	if (fd < 0) {
		perror("chfs_create");
		return (1);
	}
	for (done = 0; done < total; done += req)
		if (chfs_write(fd, buf, req) != (ssize_t)req) {
			perror("chfs_write");
			return (1);
		}
	if (chfs_close(fd) != 0) {
		perror("chfs_close");
		return (1);
	}
	tw = now() - t0;

	t0 = now();
	fd = chfs_open(argv[1], O_RDONLY);
	if (fd < 0) {
		perror("chfs_open");
		return (1);
	}
	for (done = 0; done < total; done += n) {
		n = chfs_read(fd, back, req);
		if (n <= 0) {
			perror("chfs_read");
			return (1);
		}
	}
	chfs_close(fd);
	tr = now() - t0;
	if (memcmp(buf, back, req) != 0) {
		fprintf(stderr, "capi_bench: data differs\n");
		return (1);
	}
	chfs_unlink(argv[1]);
	chfs_term();
	printf("write_s=%.6f read_s=%.6f\n", tw, tr);
	return (0);
}
