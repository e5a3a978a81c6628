/*
 * A pool that fills up: chfs_write returns the bytes stored (a short
 * count) or -1 with ENOSPC when none was, and the size covers exactly what
 * was stored. usage: enospc   (CHFS_SERVER set; servers of 1 MiB each)
 * Prints "enospc: ok".
 */
#include <sys/stat.h>
#include <sys/types.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <chfs.h>
#include "check.h"

int
main(void)
{
	static char buf[4 << 20], back[4 << 20];
	struct stat st;
	long long total = 0, n;
	size_t i;
	int fd;

	for (i = 0; i < sizeof buf; ++i)
		buf[i] = (char)(i * 7 + i / 4093);
	CHECK_EQ(chfs_init(NULL), 0);
	fd = chfs_create("/full", O_WRONLY, 0644);
	CHECK(fd >= 0);
	for (;;) {
		errno = 0;
		n = chfs_write(fd, buf + total, sizeof buf - total);
		if (n == -1) {
			CHECK_EQ(errno, ENOSPC);
			break;
		}
		CHECK(n > 0 && n < (long long)sizeof buf - total);
		total += n;
	}
	CHECK(total > 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(chfs_stat("/full", &st), 0);
	CHECK_EQ((long long)st.st_size, total);
	fd = chfs_open("/full", O_RDONLY);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_pread(fd, back, sizeof back, 0), total);
	CHECK(memcmp(back, buf, (size_t)total) == 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(chfs_unlink("/full"), 0);
	chfs_term();
	printf("enospc: ok\n");
	return (0);
}
