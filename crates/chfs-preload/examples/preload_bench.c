/* Driver of examples/preload_bench.rs, run with and without LD_PRELOAD.
   preload_bench_driver io PATH MIB     1 MiB sequential write then read
   preload_bench_driver md DIR N        create+close, stat, unlink of N files
   preload_bench_driver openclose PATH N  open/close of a (local) file
   Prints the seconds of each phase on one line. Before timing, 1000
   stat calls of the (missing) path: the client connects and the server
   is busy, as the native side's long-lived client and server are. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    long n = atol(argv[3]);
    char p[4096];
    struct stat st;
    for (int i = 0; i < 1000; i++)
        (void)stat(argv[2], &st);
    if (strcmp(argv[1], "io") == 0) {
        size_t bs = 1 << 20;
        char *buf = malloc(bs);
        for (size_t i = 0; i < bs; i++)
            buf[i] = (char)(i * 7);
        double t0 = now();
        int fd = open(argv[2], O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0)
            die("open");
        for (long i = 0; i < n; i++)
            if (write(fd, buf, bs) != (ssize_t)bs)
                die("write");
        if (close(fd) != 0)
            die("close");
        double t1 = now();
        fd = open(argv[2], O_RDONLY);
        if (fd < 0)
            die("open");
        for (long i = 0; i < n; i++)
            if (read(fd, buf, bs) != (ssize_t)bs)
                die("read");
        if (close(fd) != 0)
            die("close");
        double t2 = now();
        printf("%.6f %.6f\n", t1 - t0, t2 - t1);
    } else if (strcmp(argv[1], "md") == 0) {
        if (mkdir(argv[2], 0755) != 0)
            die("mkdir");
        double t0 = now();
        for (long i = 0; i < n; i++) {
            snprintf(p, sizeof p, "%s/f%ld", argv[2], i);
            int fd = open(p, O_CREAT | O_WRONLY | O_EXCL, 0644);
            if (fd < 0 || close(fd) != 0)
                die("create");
        }
        double t1 = now();
        for (long i = 0; i < n; i++) {
            snprintf(p, sizeof p, "%s/f%ld", argv[2], i);
            if (stat(p, &st) != 0)
                die("stat");
        }
        double t2 = now();
        for (long i = 0; i < n; i++) {
            snprintf(p, sizeof p, "%s/f%ld", argv[2], i);
            if (unlink(p) != 0)
                die("unlink");
        }
        double t3 = now();
        printf("%.6f %.6f %.6f\n", t1 - t0, t2 - t1, t3 - t2);
    } else if (strcmp(argv[1], "openclose") == 0) {
        int fd = open(argv[2], O_CREAT | O_WRONLY, 0644);
        if (fd < 0 || close(fd) != 0)
            die("create");
        double t0 = now();
        for (long i = 0; i < n; i++) {
            fd = open(argv[2], O_RDONLY);
            if (fd < 0 || close(fd) != 0)
                die("open/close");
        }
        printf("%.6f\n", now() - t0);
    } else {
        return 2;
    }
    return 0;
}
