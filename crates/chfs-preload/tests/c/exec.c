/* exec from a preloaded program: argv[1] is a chfs-rs path.
   The parent writes 10000 bytes to it (more than one 4 KiB chunk) and,
   without closing, execs itself as "child" with the descriptor's number.
   The child (LD_PRELOAD is inherited, so it has its own preload and
   client) finds that number is only the reserved /dev/null descriptor
   (a character device reading EOF), reopens the path and reads every
   byte the parent wrote (published before the exec), then writes
   argv[1].child. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s\n", __LINE__, #c); return 1; } } while (0)
#define N 10000

static char pat(int i) { return (char)('a' + i % 23); }

int main(int argc, char **argv)
{
    static char buf[N + 10];
    if (argc == 2) {
        int fd = open(argv[1], O_CREAT | O_RDWR | O_TRUNC, 0644);
        CHECK(fd >= 0);
        for (int i = 0; i < N; i++)
            buf[i] = pat(i);
        CHECK(write(fd, buf, N) == N);
        char num[16];
        snprintf(num, sizeof num, "%d", fd);
        execl(argv[0], argv[0], argv[1], "child", num, (char *)NULL);
        perror("execl");
        return 1;
    }
    CHECK(argc == 4 && strcmp(argv[2], "child") == 0);
    int old = atoi(argv[3]);
    struct stat st;
    CHECK(fstat(old, &st) == 0);
    CHECK(S_ISCHR(st.st_mode)); /* /dev/null, not the chfs-rs file */
    CHECK(read(old, buf, 10) == 0);
    int fd = open(argv[1], O_RDONLY);
    CHECK(fd >= 0);
    CHECK(fstat(fd, &st) == 0 && st.st_size == N && S_ISREG(st.st_mode));
    size_t got = 0;
    ssize_t r;
    while ((r = read(fd, buf + got, sizeof buf - got)) > 0)
        got += r;
    CHECK(r == 0 && got == N);
    for (int i = 0; i < N; i++)
        CHECK(buf[i] == pat(i));
    CHECK(close(fd) == 0);
    char p[4096];
    snprintf(p, sizeof p, "%s.child", argv[1]);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    fprintf(f, "child of a preloaded parent\n");
    CHECK(fclose(f) == 0);
    printf("ok\n");
    return 0;
}
