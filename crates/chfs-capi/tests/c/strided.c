/*
 * IOR-hard's read with -C through the C API: a file of NRANKS * COUNT
 * records of RECORD bytes is written, then read back as rank 1 of NRANKS
 * reads it (every NRANKS-th record, from the second), each record checked;
 * then a read across the end of the file and one at the end. With
 * CHFS_READ_AHEAD (the default) the records come several per request (the
 * test counts reads on the servers).
 *
 * usage: strided PATH RECORD NRANKS COUNT  (CHFS_SERVER, CHFS_READ_AHEAD
 * from env)
 */
#include <fcntl.h>
#include <unistd.h>
#include <chfs.h>
#include "check.h"

int
main(int argc, char **argv)
{
	long long record, nranks, count, size, off, i, j;
	char *buf;
	int fd;

	CHECK(argc == 5);
	record = atoll(argv[2]);
	nranks = atoll(argv[3]);
	count = atoll(argv[4]);
	size = record * nranks * count;
	buf = malloc(record);
	CHECK(buf != NULL);
	CHECK_EQ(chfs_init(NULL), 0);
	fd = chfs_create(argv[1], O_WRONLY | O_TRUNC, 0644);
	CHECK(fd >= 0);
	for (i = 0; i < nranks * count; ++i) {
		for (j = 0; j < record; ++j)
			buf[j] = (char)pat(i * record + j, 5);
		CHECK_EQ(chfs_pwrite(fd, buf, record, i * record), record);
	}
	CHECK_EQ(chfs_close(fd), 0);
	fd = chfs_open(argv[1], O_RDONLY);
	CHECK(fd >= 0);
	for (i = 0; i < count; ++i) {
		off = (i * nranks + 1) * record;
		CHECK_EQ(chfs_pread(fd, buf, record, off), record);
		for (j = 0; j < record; ++j)
			CHECK((unsigned char)buf[j] == pat(off + j, 5));
	}
	CHECK_EQ(chfs_pread(fd, buf, record, size - 100), 100);
	for (j = 0; j < 100; ++j)
		CHECK((unsigned char)buf[j] == pat(size - 100 + j, 5));
	CHECK_EQ(chfs_pread(fd, buf, record, size), 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(chfs_term(), 0);
	return (0);
}
