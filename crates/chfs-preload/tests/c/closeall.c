/* A program that closes every descriptor from 3 up (a daemon, a shell,
   an MPI launcher) and goes on using chfs-rs files.
   usage: closeall DIR MODE   (DIR under the prefix; MODE loop, range, from)
   The descriptor limit is lowered to 64 first, so that the program can
   then fill every free number with local files: the client's sockets must
   have stayed open (a number given to a local file would be written by
   the client). Prints "ok" and exits 0, or names the failed check. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/close_range.h>

#define LIMIT 64
#define SIZE 200000

static void fail(const char *what)
{
    fprintf(stderr, "closeall: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int is_socket(int fd)
{
    char p[64], l[256];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(p, l, sizeof l - 1);
    if (n < 0)
        return 0;
    l[n] = 0;
    return strncmp(l, "socket:", 7) == 0;
}

static void write_file(const char *path, char seed)
{
    static char buf[SIZE];
    for (int i = 0; i < SIZE; i++)
        buf[i] = (char)(seed + i % 31);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0)
        fail("open for writing");
    if (write(fd, buf, SIZE) != SIZE)
        fail("write");
    if (close(fd) != 0)
        fail("close");
}

static void check_file(const char *path, char seed)
{
    static char buf[SIZE + 1];
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        fail("open for reading");
    ssize_t got = 0, n;
    while ((n = read(fd, buf + got, sizeof buf - got)) > 0)
        got += n;
    if (n < 0)
        fail("read");
    close(fd);
    if (got != SIZE)
        fail("size read back");
    for (int i = 0; i < SIZE; i++)
        if (buf[i] != (char)(seed + i % 31)) {
            errno = EIO;
            fail("bytes read back");
        }
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    struct rlimit rl = {LIMIT, LIMIT};
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        fail("getrlimit");
    rl.rlim_cur = LIMIT;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        fail("setrlimit");
    /* Sockets open before the first chfs-rs call were inherited (a parent
       using the client over libfabric passes the provider's descriptors
       on: they are not close-on-exec); only the client's are checked. */
    int inherited[LIMIT] = {0};
    for (int fd = 3; fd < LIMIT; fd++)
        inherited[fd] = is_socket(fd);
    char a[4096], b[4096], local[4096];
    snprintf(a, sizeof a, "%s/a", argv[1]);
    snprintf(b, sizeof b, "%s/b", argv[1]);
    snprintf(local, sizeof local, "closeall-%d.local", (int)getpid());

    if (mkdir(argv[1], 0755) != 0)
        fail("mkdir");
    write_file(a, 'a');
    int open_chfs = open(a, O_RDONLY);
    int open_local = open(local, O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (open_chfs < 0 || open_local < 0)
        fail("open before closing");
    int sockets[LIMIT], ns = 0;
    for (int fd = 3; fd < LIMIT; fd++)
        if (is_socket(fd) && !inherited[fd])
            sockets[ns++] = fd;
    if (ns == 0) {
        errno = ENOENT;
        fail("no client socket before closing");
    }

    if (strcmp(argv[2], "loop") == 0) {
        for (int fd = 3; fd < LIMIT; fd++)
            (void)close(fd);
    } else if (strcmp(argv[2], "range") == 0) {
        if (close_range(3, ~0U, 0) != 0)
            fail("close_range");
    } else if (strcmp(argv[2], "from") == 0) {
        closefrom(3);
    } else {
        return 2;
    }

    /* The program's descriptors are closed, chfs-rs and local alike. */
    if (fcntl(open_chfs, F_GETFD) != -1 || errno != EBADF)
        fail("the chfs-rs descriptor is still open");
    if (fcntl(open_local, F_GETFD) != -1 || errno != EBADF)
        fail("the local descriptor is still open");
    /* The client's are not. */
    for (int i = 0; i < ns; i++)
        if (!is_socket(sockets[i])) {
            errno = EBADF;
            fail("a client socket was closed");
        }
    /* Nor can the program put a file on one's number. */
    int tmp = open(local, O_RDONLY);
    if (tmp < 0)
        fail("open local");
    if (dup2(tmp, sockets[0]) != -1 || errno != EBUSY)
        fail("dup2 onto a client socket");
    close(tmp);

    /* Every free number a local file: none may be written by the client. */
    int filled[LIMIT], nf = 0;
    for (;;) {
        int fd = open(local, O_RDWR);
        if (fd < 0) {
            if (errno != EMFILE)
                fail("open local file");
            break;
        }
        filled[nf++] = fd;
    }
    /* Room for the chfs-rs files of the next steps. */
    for (int i = 0; i < 4 && nf > 0; i++)
        close(filled[--nf]);
    check_file(a, 'a');
    write_file(b, 'b');
    check_file(b, 'b');
    struct stat st;
    if (stat(local, &st) != 0)
        fail("stat local");
    if (st.st_size != 0) {
        errno = EIO;
        fail("the local file was written to");
    }
    for (int i = 0; i < nf; i++)
        close(filled[i]);
    unlink(local);
    printf("ok %d\n", nf);
    return 0;
}
