/*
 * A program that ends while another of its threads still reads through
 * libchfs: it writes PATH (1 MiB), starts a thread reading it in a loop,
 * and once that thread has read it, returns from main ("return") or
 * calls exit(3) ("exit"). The process must end cleanly (exit status 0, no
 * signal, no hang) and, over ofi+shm, leave no queue file in /dev/shm.
 *
 * usage: shm_exit PATH return|exit        (CHFS_SERVER is used)
 */
#include <pthread.h>
#include <fcntl.h>
#include <unistd.h>
#include <chfs.h>
#include "check.h"

#define SIZE (1 << 20)

static const char *path;
static volatile int started;

static void *
reader(void *arg)
{
	char *buf = malloc(SIZE);
	int fd = chfs_open(path, O_RDONLY);

	(void)arg;
	CHECK(buf != NULL);
	CHECK(fd >= 0);
	for (;;) {
		CHECK_EQ(chfs_pread(fd, buf, SIZE, 0), SIZE);
		started = 1;
	}
	return (NULL);
}

int
main(int argc, char **argv)
{
	pthread_t t;
	char *buf;
	int fd, i;

	CHECK(argc == 3);
	path = argv[1];
	buf = malloc(SIZE);
	CHECK(buf != NULL);
	memset(buf, 7, SIZE);
	CHECK_EQ(chfs_init(NULL), 0);
	fd = chfs_create(path, O_WRONLY, 0644);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_pwrite(fd, buf, SIZE, 0), SIZE);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK(pthread_create(&t, NULL, reader, NULL) == 0);
	for (i = 0; !started && i < 10000; ++i)
		usleep(1000);
	CHECK(started);
	printf("shm_exit: ok\n");
	fflush(stdout);
	if (strcmp(argv[2], "exit") == 0)
		exit(0);
	return (0);
}
