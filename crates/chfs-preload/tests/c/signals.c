/* Signals of a preloaded program whose first chfs-rs call opens the
   client's transport (over ofi+*, libfabric is loaded then, and with it
   libraries whose constructors install handlers of their own): argv[1]
   is a chfs-rs path. The program's own SIGTERM handler, installed before
   that first call, still gets SIGTERM after it; SIGINT left at its
   default still terminates the program by the signal (not exit(1)). */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s\n", __LINE__, #c); return 1; } } while (0)

static volatile sig_atomic_t got;

static void on_term(int sig)
{
    got = sig;
}

int main(int argc, char **argv)
{
    struct sigaction sa, now;
    char b[8];

    CHECK(argc == 2);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGTERM, &sa, NULL) == 0);
    CHECK(signal(SIGINT, SIG_DFL) != SIG_ERR);

    /* the first call into the pool: connects (and loads libfabric) */
    int fd = open(argv[1], O_CREAT | O_RDWR | O_TRUNC, 0644);
    CHECK(fd >= 0);
    CHECK(write(fd, "signals", 7) == 7);

    /* the handlers are the program's */
    CHECK(sigaction(SIGTERM, NULL, &now) == 0);
    CHECK(now.sa_handler == on_term);
    CHECK(sigaction(SIGINT, NULL, &now) == 0);
    CHECK(now.sa_handler == SIG_DFL);

    CHECK(kill(getpid(), SIGTERM) == 0);
    CHECK(got == SIGTERM);
    /* and the pool is still reachable after the handler ran */
    CHECK(pread(fd, b, 7, 0) == 7 && memcmp(b, "signals", 7) == 0);
    CHECK(close(fd) == 0);
    printf("ok\n");
    fflush(stdout);
    kill(getpid(), SIGINT);
    return 5;
}
