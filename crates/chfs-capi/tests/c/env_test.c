/*
 * chfs_init must fail cleanly: returns -1 with the errno given as argv[1]
 * (a number), prints nothing, does not abort. The harness sets a bad
 * environment. Prints "env_test: ok" (the only output expected).
 */
#include <chfs.h>
#include "check.h"

int
main(int argc, char **argv)
{
	int want;

	CHECK(argc == 2);
	want = atoi(argv[1]);
	errno = 0;
	if (want == 0) {
		CHECK_EQ(chfs_init(NULL), 0);
		CHECK_EQ(chfs_term(), 0);
	} else {
		CHECK_ERR(chfs_init(NULL), want);
		CHECK_EQ(chfs_initialized(), 0);
	}
	printf("env_test: ok\n");
	return (0);
}
