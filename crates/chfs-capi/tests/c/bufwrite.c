/*
 * COUNT sequential chfs_write calls of SIZE bytes, then a read-back check.
 * With CHFS_BUF_SIZE set, the library aggregates them into few requests
 * (the test counts requests on the servers).
 *
 * usage: bufwrite PATH COUNT SIZE      (CHFS_SERVER, CHFS_BUF_SIZE from env)
 */
#include <fcntl.h>
#include <unistd.h>
#include <chfs.h>
#include "check.h"

int
main(int argc, char **argv)
{
	int count, size, fd, i, j;
	char *buf, *back;

	CHECK(argc == 4);
	count = atoi(argv[2]);
	size = atoi(argv[3]);
	buf = malloc(size);
	back = malloc((size_t)count * size);
	CHECK(buf != NULL && back != NULL);
	CHECK_EQ(chfs_init(NULL), 0);
	fd = chfs_create(argv[1], O_WRONLY | O_TRUNC, 0644);
	CHECK(fd >= 0);
	for (i = 0; i < count; ++i) {
		for (j = 0; j < size; ++j)
			buf[j] = (char)pat((long long)i * size + j, 3);
		CHECK_EQ(chfs_write(fd, buf, size), size);
	}
	CHECK_EQ(chfs_close(fd), 0);
	fd = chfs_open(argv[1], O_RDONLY);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_pread(fd, back, (size_t)count * size, 0), (long long)count * size);
	for (i = 0; i < count * size; ++i)
		CHECK((unsigned char)back[i] == pat(i, 3));
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(chfs_term(), 0);
	return (0);
}
