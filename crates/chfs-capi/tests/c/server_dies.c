/*
 * The servers go away under a running program: calls fail with an errno;
 * the process is not killed (no SIGPIPE), nothing is printed, nothing
 * aborts. usage: server_dies PID...   (the chfsd PIDs; CHFS_SERVER set)
 * Prints "server_dies: ok".
 */
#include <sys/stat.h>
#include <sys/types.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <chfs.h>
#include "check.h"

int
main(int argc, char **argv)
{
	static char buf[1 << 20];
	struct stat st;
	int fd, i, failed = 0;

	CHECK(argc >= 2);
	CHECK_EQ(chfs_init(NULL), 0);
	fd = chfs_create("/victim", O_WRONLY, 0644);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_write(fd, buf, sizeof buf), (long long)sizeof buf);
	for (i = 1; i < argc; ++i)
		CHECK(kill((pid_t)atoi(argv[i]), SIGKILL) == 0);
	usleep(200 * 1000);
	for (i = 0; i < 20; ++i) {
		errno = 0;
		if (chfs_write(fd, buf, sizeof buf) == -1) {
			CHECK(errno != 0);
			failed = 1;
			break;
		}
	}
	CHECK(failed);
	CHECK_EQ(chfs_stat("/victim", &st), -1);
	CHECK(errno != 0);
	chfs_close(fd);
	chfs_term();
	printf("server_dies: ok\n");
	return (0);
}
