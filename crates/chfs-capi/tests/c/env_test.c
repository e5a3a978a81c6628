/*
 * chfs_init must fail cleanly: returns -1 with the errno given as argv[1]
 * (a number), prints nothing, does not abort, and chfs_last_error() names
 * the cause: it contains argv[2] when given. The harness sets a bad
 * environment. Prints "env_test: ok" (the only output expected).
 */
#include <pthread.h>
#include <chfs.h>
#include "check.h"

static void *
other_thread(void *arg)
{
	/* The text is per thread, like errno. */
	*(int *)arg = chfs_last_error()[0] == '\0';
	return (NULL);
}

int
main(int argc, char **argv)
{
	pthread_t th;
	int want, clean_elsewhere = 0;

	CHECK(argc == 2 || argc == 3);
	want = atoi(argv[1]);
	CHECK(chfs_last_error() != NULL && chfs_last_error()[0] == '\0');
	errno = 0;
	if (want == 0) {
		CHECK_EQ(chfs_init(NULL), 0);
		CHECK_EQ(chfs_term(), 0);
		CHECK(chfs_last_error()[0] == '\0');
	} else {
		CHECK_ERR(chfs_init(NULL), want);
		CHECK_EQ(chfs_initialized(), 0);
		if (argc == 3 && strstr(chfs_last_error(), argv[2]) == NULL) {
			fprintf(stderr, "env_test: chfs_last_error() = \"%s\", "
				"expected to contain \"%s\"\n",
				chfs_last_error(), argv[2]);
			return (1);
		}
		CHECK(strncmp(chfs_last_error(), "chfs_init: ", 11) == 0);
		CHECK(pthread_create(&th, NULL, other_thread,
			&clean_elsewhere) == 0);
		CHECK(pthread_join(th, NULL) == 0);
		CHECK(clean_elsewhere);
	}
	printf("env_test: ok\n");
	return (0);
}
