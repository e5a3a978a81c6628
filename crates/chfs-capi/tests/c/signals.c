/*
 * A C program's signals once libchfs has reached the pool (over ofi+*,
 * chfs_init loads libfabric, whose Debian build brings a library that
 * installs SIGINT/SIGTERM handlers calling exit(1)): its own SIGTERM
 * handler, installed before chfs_init, still gets SIGTERM; SIGINT left
 * at its default still terminates it by the signal. CHFS_SERVER set.
 * Prints "signals: ok", then raises SIGINT.
 */
#include <sys/types.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <chfs.h>
#include "check.h"

static volatile sig_atomic_t got;

static void
on_term(int sig)
{
	got = sig;
}

int
main(void)
{
	struct sigaction sa, now;
	char b[8];
	int fd;

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_term;
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGTERM, &sa, NULL) == 0);
	CHECK(signal(SIGINT, SIG_DFL) != SIG_ERR);

	CHECK_EQ(chfs_init(NULL), 0);
	fd = chfs_create("/signals", O_RDWR, 0644);
	CHECK(fd >= 0);
	CHECK_EQ(chfs_write(fd, "signals", 7), 7);

	CHECK(sigaction(SIGTERM, NULL, &now) == 0);
	CHECK(now.sa_handler == on_term);
	CHECK(sigaction(SIGINT, NULL, &now) == 0);
	CHECK(now.sa_handler == SIG_DFL);
	CHECK(kill(getpid(), SIGTERM) == 0);
	CHECK(got == SIGTERM);
	CHECK_EQ(chfs_pread(fd, b, 7, 0), 7);
	CHECK(memcmp(b, "signals", 7) == 0);
	CHECK_EQ(chfs_close(fd), 0);
	CHECK_EQ(chfs_term(), 0);
	printf("signals: ok\n");
	fflush(stdout);
	kill(getpid(), SIGINT);
	return 5;
}
