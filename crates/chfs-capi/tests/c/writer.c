/*
 * Several processes writing one file at disjoint offsets.
 *
 * usage: writer PATH RANK NRANKS BLOCK NBLOCKS        (write own blocks)
 *        writer PATH verify NRANKS BLOCK NBLOCKS      (check the whole file)
 * Block b (= i * NRANKS + RANK) holds pat(offset, 0). CHFS_SERVER is used.
 */
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <chfs.h>
#include "check.h"

int
main(int argc, char **argv)
{
	const char *path;
	int verify, rank, nranks, block, nblocks, fd, i, j;
	char *buf;
	struct stat st;

	CHECK(argc == 6);
	path = argv[1];
	verify = strcmp(argv[2], "verify") == 0;
	rank = verify ? 0 : atoi(argv[2]);
	nranks = atoi(argv[3]);
	block = atoi(argv[4]);
	nblocks = atoi(argv[5]);
	buf = malloc(block);
	CHECK(buf != NULL);
	CHECK_EQ(chfs_init(NULL), 0);

	if (!verify) {
		/*
		 * As the POSIX backend of IOR: rank 0 creates (and truncates),
		 * the others open the file once it exists, so no late create
		 * truncates what an early rank wrote.
		 */
		if (rank == 0)
			fd = chfs_create(path, O_WRONLY, 0644);
		else
			for (i = 0; (fd = chfs_open(path, O_WRONLY)) < 0 &&
			    errno == ENOENT && i < 1000; ++i)
				usleep(10000);
		CHECK(fd >= 0);
		for (i = 0; i < nblocks; ++i) {
			long long b = (long long)i * nranks + rank;

			for (j = 0; j < block; ++j)
				buf[j] = (char)pat(b * block + j, 0);
			CHECK_EQ(chfs_pwrite(fd, buf, block, b * block), block);
		}
		CHECK_EQ(chfs_close(fd), 0);
	} else {
		long long b, n = (long long)nranks * nblocks;

		CHECK_EQ(chfs_stat(path, &st), 0);
		CHECK_EQ(st.st_size, n * block);
		fd = chfs_open(path, O_RDONLY);
		CHECK(fd >= 0);
		for (b = 0; b < n; ++b) {
			CHECK_EQ(chfs_read(fd, buf, block), block);
			for (j = 0; j < block; ++j)
				if ((unsigned char)buf[j] != pat(b * block + j, 0)) {
					fprintf(stderr, "writer: byte %lld differs\n",
						b * block + j);
					return (1);
				}
		}
		CHECK_EQ(chfs_read(fd, buf, block), 0);
		CHECK_EQ(chfs_close(fd), 0);
		printf("writer: verified %lld bytes\n", n * block);
	}
	CHECK_EQ(chfs_term(), 0);
	free(buf);
	return (0);
}
