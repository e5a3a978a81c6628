/*
 * The flags of chfs_open / chfs_create under both conventions.
 *
 * usage: flags_test chfs     CHFS's (the default): flags ignored, create
 *                            creates or truncates
 *        flags_test posix    with CHFS_POSIX_FLAGS=1: open(2) flags
 * CHFS_SERVER must be set. Prints "flags_test: ok" on success.
 */
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <chfs.h>
#include "check.h"

static void
put(const char *path, const char *data)
{
	int fd = chfs_create(path, O_WRONLY | O_TRUNC, 0644);

	CHECK(fd >= 0);
	CHECK_EQ(chfs_write(fd, data, strlen(data)), (long long)strlen(data));
	CHECK_EQ(chfs_close(fd), 0);
}

static long long
size_of(const char *path)
{
	struct stat st;

	CHECK_EQ(chfs_stat(path, &st), 0);
	return (st.st_size);
}

static void
chfs_conventions(void)
{
	struct stat st;
	char b[16];
	int fd;

	CHECK_EQ(chfs_mkdir("/c", 0755), 0);
	/* create: every descriptor reads and writes, whatever the flags */
	fd = chfs_create("/c/a", 0x02 | 0x10 | 0x20, 0644);	/* IOR's */
	CHECK(fd >= 0);
	CHECK_EQ(chfs_pwrite(fd, "hello", 5, 0), 5);
	CHECK_EQ(chfs_pread(fd, b, sizeof b, 0), 5);
	CHECK(memcmp(b, "hello", 5) == 0);
	CHECK_EQ(chfs_close(fd), 0);

	/* open: no access mode restricts, no other bit acts */
	fd = chfs_open("/c/a", O_RDONLY);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_pwrite(fd, "J", 1, 0), 1);
	CHECK_EQ(chfs_close(fd), 0);
	fd = chfs_open("/c/a", 0x01);				/* IOR's read-only */
	CHECK(fd >= 0);
	CHECK_EQ(chfs_pread(fd, b, sizeof b, 0), 5);
	CHECK(memcmp(b, "Jello", 5) == 0);
	CHECK_EQ(chfs_close(fd), 0);
	fd = chfs_open("/c/a", O_WRONLY | O_TRUNC | O_APPEND);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_read(fd, b, sizeof b), 5);		/* not truncated */
	CHECK_EQ(chfs_pwrite(fd, "Y", 1, 0), 1);		/* not appended */
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(size_of("/c/a"), 5);
	fd = chfs_open("/c/a", -1);			/* every bit set */
	CHECK(fd >= 0);
	CHECK_EQ(chfs_pread(fd, b, sizeof b, 0), 5);
	CHECK(memcmp(b, "Yello", 5) == 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_ERR(chfs_open("/c/none", O_CREAT | O_RDWR), ENOENT);

	/* create of an existing file truncates it, O_EXCL or not */
	fd = chfs_create("/c/a", O_WRONLY | O_EXCL, 0600);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_pread(fd, b, sizeof b, 0), 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(chfs_stat("/c/a", &st), 0);
	CHECK_EQ(st.st_size, 0);
	CHECK_EQ(st.st_mode & 07777, 0644);	/* creat(2) keeps the mode */
	fd = chfs_create("/c/b", -1, 0640);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_write(fd, "b", 1), 1);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(size_of("/c/b"), 1);
	fd = chfs_create_chunk_size("/c/b", O_RDONLY | CHFS_O_CACHE, 0640, 4096);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(size_of("/c/b"), 0);

	/* a symbolic link is followed, its target created or truncated */
	CHECK_EQ(chfs_symlink("t", "/c/l"), 0);
	fd = chfs_create("/c/l", 0, 0600);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_write(fd, "tt", 2), 2);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(chfs_stat("/c/l", &st), 0);
	CHECK(S_ISLNK(st.st_mode));
	CHECK_EQ(size_of("/c/t"), 2);
	fd = chfs_create("/c/l", 0, 0600);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(size_of("/c/t"), 0);
	CHECK_EQ(chfs_unlink("/c/l"), 0);
	CHECK_EQ(chfs_unlink("/c/t"), 0);

	/* directories */
	CHECK_ERR(chfs_create("/c", 0, 0644), EISDIR);
	CHECK_ERR(chfs_open("/c", O_RDONLY), EISDIR);
	fd = chfs_open("/c", O_RDONLY | O_DIRECTORY);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_fstat(fd, &st), 0);
	CHECK(S_ISDIR(st.st_mode));
	CHECK_EQ(chfs_close(fd), 0);

	CHECK_EQ(chfs_unlink("/c/a"), 0);
	CHECK_EQ(chfs_unlink("/c/b"), 0);
	CHECK_EQ(chfs_rmdir("/c"), 0);
}

static void
posix_conventions(void)
{
	char b[16];
	int fd;

	CHECK_EQ(chfs_mkdir("/p", 0755), 0);
	fd = chfs_create("/p/a", O_WRONLY, 0644);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_write(fd, "hello", 5), 5);
	CHECK_ERR(chfs_pread(fd, b, sizeof b, 0), EBADF);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_ERR(chfs_create("/p/a", O_WRONLY | O_EXCL, 0644), EEXIST);
	fd = chfs_create("/p/a", O_WRONLY, 0644);	/* no O_TRUNC: kept */
	CHECK(fd >= 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(size_of("/p/a"), 5);

	fd = chfs_open("/p/a", O_RDONLY);
	CHECK(fd >= 0);
	CHECK_ERR(chfs_write(fd, "x", 1), EBADF);
	CHECK_EQ(chfs_close(fd), 0);
	fd = chfs_open("/p/a", 0x01);			/* IOR's 0x01 = O_WRONLY */
	CHECK(fd >= 0);
	CHECK_ERR(chfs_pread(fd, b, sizeof b, 0), EBADF);
	CHECK(strstr(chfs_last_error(), "chfs_pread") != NULL);
	CHECK_EQ(chfs_close(fd), 0);
	fd = chfs_open("/p/a", O_WRONLY | O_TRUNC);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(size_of("/p/a"), 0);
	fd = chfs_open("/p/b", O_CREAT | O_RDWR);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_close(fd), 0);

	put("/p/a", "x");
	CHECK_EQ(chfs_unlink("/p/a"), 0);
	CHECK_EQ(chfs_unlink("/p/b"), 0);
	CHECK_EQ(chfs_rmdir("/p"), 0);
}

int
main(int argc, char **argv)
{
	CHECK(argc == 2);
	CHECK_EQ(chfs_init(NULL), 0);
	if (strcmp(argv[1], "chfs") == 0)
		chfs_conventions();
	else if (strcmp(argv[1], "posix") == 0)
		posix_conventions();
	else
		CHECK(!"mode is chfs or posix");
	CHECK_EQ(chfs_term(), 0);
	printf("flags_test: ok\n");
	return (0);
}
