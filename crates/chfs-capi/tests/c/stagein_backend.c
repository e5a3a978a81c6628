/*
 * chfs_stagein of a path that exists only in the servers' backend (cache
 * mode): the servers fetch it. usage: stagein_backend PATH
 * (CHFS_SERVER from the environment). Prints "stagein_backend: ok".
 */
#include <sys/stat.h>
#include <fcntl.h>
#include <chfs.h>
#include "check.h"

int
main(int argc, char **argv)
{
	struct stat st;

	CHECK(argc == 2);
	CHECK_EQ(chfs_init(NULL), 0);
	CHECK_EQ(chfs_stagein(argv[1]), 0);
	CHECK_EQ(chfs_stat(argv[1], &st), 0);
	CHECK_ERR(chfs_stagein("/no/such/path/anywhere"), ENOENT);
	CHECK_EQ(chfs_term(), 0);
	printf("stagein_backend: ok\n");
	return (0);
}
