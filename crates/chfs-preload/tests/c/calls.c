/* The calls interposed last: statfs, link, mknod/mkfifo, the utime family,
   readdir_r, scandir, getdents64, sendfile, copy_file_range, splice,
   posix_spawnp, system, popen, a vfork child, _exit/_Exit.
   usage: calls DIR LOCALDIR   (DIR under the prefix, new; LOCALDIR local)
          calls --exit PATH    (writes 10,000 bytes to PATH, _exit(0))
          calls --Exit PATH    (the same with _Exit)
   Prints "ok" and exits 0, or names the first failed check. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>

extern char **environ;

#define CHFS_MAGIC 0x63686673
#define BIG 300000

static void fail(int line, const char *what)
{
    fprintf(stderr, "calls: line %d: %s (errno %d: %s)\n", line, what, errno, strerror(errno));
    exit(1);
}
#define CHECK(c) ((c) ? (void)0 : fail(__LINE__, #c))

static char *cat(const char *a, const char *b)
{
    char *s = malloc(strlen(a) + strlen(b) + 2);
    sprintf(s, "%s/%s", a, b);
    return s;
}

static char pat(long i) { return (char)('A' + i % 53); }

static void write_pattern(const char *path, long n, int do_close)
{
    char *buf = malloc(n);
    for (long i = 0; i < n; i++)
        buf[i] = pat(i);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(fd >= 0);
    CHECK(write(fd, buf, n) == n);
    if (do_close)
        CHECK(close(fd) == 0);
    free(buf);
}

/* The file holds pat(from + i) for i < n. */
static void check_pattern(const char *path, long from, long n)
{
    char *buf = malloc(n + 1);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    long got = 0, r;
    while ((r = read(fd, buf + got, n + 1 - got)) > 0)
        got += r;
    CHECK(r == 0);
    CHECK(got == n);
    for (long i = 0; i < n; i++)
        if (buf[i] != pat(from + i))
            fail(__LINE__, path);
    close(fd);
    free(buf);
}

static int starts_with_a(const struct dirent *d) { return d->d_name[0] == 'a'; }

static void statfs_link_mknod(const char *dir, const char *local)
{
    struct statfs sf;
    CHECK(statfs(dir, &sf) == 0);
    CHECK(sf.f_type == CHFS_MAGIC && sf.f_bsize == 4096 && sf.f_blocks > 0);
    CHECK(sf.f_files >= sf.f_ffree && sf.f_ffree == sf.f_bfree && sf.f_namelen == 255);
    struct statfs64 sf64;
    CHECK(statfs64(dir, &sf64) == 0 && sf64.f_type == CHFS_MAGIC);
    char *f = cat(dir, "f");
    write_pattern(f, 10, 1);
    int fd = open(f, O_RDONLY);
    CHECK(fd >= 0);
    CHECK(fstatfs(fd, &sf) == 0 && sf.f_type == CHFS_MAGIC);
    close(fd);
    struct statfs lsf;
    CHECK(statfs(local, &lsf) == 0 && lsf.f_type != CHFS_MAGIC);

    /* Hard links: EPERM in the pool, EXDEV across, libc's elsewhere. */
    char *g = cat(dir, "g");
    CHECK(link(f, g) == -1 && errno == EPERM);
    CHECK(linkat(AT_FDCWD, f, AT_FDCWD, g, 0) == -1 && errno == EPERM);
    char *missing = cat(dir, "missing");
    CHECK(link(missing, g) == -1 && errno == ENOENT);
    CHECK(link(f, f) == -1 && errno == EEXIST);
    char *lx = cat(local, "x"), *ly = cat(local, "y");
    CHECK(link(f, lx) == -1 && errno == EXDEV);
    write_pattern(lx, 10, 1);
    CHECK(link(lx, ly) == 0);
    struct stat st;
    CHECK(stat(ly, &st) == 0 && st.st_nlink == 2);
    CHECK(access(g, F_OK) == -1 && errno == ENOENT);

    /* mknod: regular files; other types EPERM. */
    char *n = cat(dir, "n");
    CHECK(mknod(n, S_IFREG | 0640, 0) == 0);
    CHECK(stat(n, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0);
    CHECK((st.st_mode & 0777) == 0640);
    CHECK(mknod(n, S_IFREG | 0640, 0) == -1 && errno == EEXIST);
    char *n2 = cat(dir, "n2");
    CHECK(mknodat(AT_FDCWD, n2, 0600, 0) == 0);
    CHECK(stat(n2, &st) == 0 && S_ISREG(st.st_mode));
    char *p = cat(dir, "p");
    CHECK(mknod(p, S_IFIFO | 0644, 0) == -1 && errno == EPERM);
    CHECK(mkfifo(p, 0644) == -1 && errno == EPERM);
    CHECK(access(p, F_OK) == -1 && errno == ENOENT);
}

static void set_times(const char *dir)
{
    char *f = cat(dir, "f");
    struct stat st;
    struct utimbuf ub = {.actime = 1000, .modtime = 2000};
    CHECK(utime(f, &ub) == 0);
    CHECK(stat(f, &st) == 0 && st.st_atime == 1000 && st.st_mtime == 2000);
    struct timeval tv[2] = {{3000, 5}, {4000, 7}};
    CHECK(utimes(f, tv) == 0);
    CHECK(stat(f, &st) == 0 && st.st_mtim.tv_sec == 4000 && st.st_mtim.tv_nsec == 7000);
    CHECK(st.st_atim.tv_sec == 3000 && st.st_atim.tv_nsec == 5000);
    tv[1].tv_sec = 5000;
    CHECK(lutimes(f, tv) == 0);
    CHECK(stat(f, &st) == 0 && st.st_mtime == 5000);
    int fd = open(f, O_RDONLY);
    CHECK(fd >= 0);
    tv[1].tv_sec = 6000;
    CHECK(futimes(fd, tv) == 0);
    CHECK(fstat(fd, &st) == 0 && st.st_mtime == 6000);
    close(fd);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    CHECK(dfd >= 0);
    tv[1].tv_sec = 7000;
    CHECK(futimesat(dfd, "f", tv) == 0);
    CHECK(stat(f, &st) == 0 && st.st_mtime == 7000);
    close(dfd);
    tv[1].tv_usec = 1000000;
    CHECK(utimes(f, tv) == -1 && errno == EINVAL);
    time_t now = time(NULL);
    CHECK(utime(f, NULL) == 0);
    CHECK(stat(f, &st) == 0 && st.st_mtime >= now - 5 && st.st_mtime <= now + 5);
}

static void listings(const char *dir)
{
    char *d = cat(dir, "d");
    CHECK(mkdir(d, 0755) == 0);
    const char *names[] = {"a3", "a1", "b9", "a5", "a2", "a4"};
    for (int i = 0; i < 6; i++) {
        char *x = cat(d, names[i]);
        write_pattern(x, 1, 1);
        free(x);
    }

    /* readdir_r */
    DIR *dp = opendir(d);
    CHECK(dp != NULL);
    struct dirent ent, *res;
    int count = 0, dots = 0;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    while (readdir_r(dp, &ent, &res) == 0 && res != NULL) {
#pragma GCC diagnostic pop
        CHECK(res == &ent);
        if (strcmp(ent.d_name, ".") == 0 || strcmp(ent.d_name, "..") == 0)
            dots++;
        else
            count++;
    }
    CHECK(res == NULL && count == 6 && dots == 2);
    closedir(dp);

    /* scandir with a filter and a sort */
    struct dirent **list;
    int n = scandir(d, &list, starts_with_a, alphasort);
    CHECK(n == 5);
    for (int i = 0; i < n; i++) {
        char want[8];
        snprintf(want, sizeof want, "a%d", i + 1);
        CHECK(strcmp(list[i]->d_name, want) == 0);
        CHECK(list[i]->d_type == DT_REG);
        free(list[i]);
    }
    free(list);
    struct dirent64 **list64;
    n = scandir64(d, &list64, NULL, NULL);
    CHECK(n == 8);
    for (int i = 0; i < n; i++)
        free(list64[i]);
    free(list64);
    char *nodir = cat(dir, "f");
    CHECK(scandir(nodir, &list, NULL, NULL) == -1 && errno == ENOTDIR);

    /* getdents64 with a small buffer, then again after lseek to 0 */
    int fd = open(d, O_RDONLY | O_DIRECTORY);
    CHECK(fd >= 0);
    for (int pass = 0; pass < 2; pass++) {
        char buf[80];
        int seen = 0, as = 0;
        ssize_t r;
        while ((r = getdents64(fd, buf, sizeof buf)) > 0) {
            for (ssize_t at = 0; at < r;) {
                struct dirent64 *e = (struct dirent64 *)(buf + at);
                seen++;
                as += e->d_name[0] == 'a';
                CHECK(e->d_reclen % 8 == 0 && e->d_reclen > 0);
                at += e->d_reclen;
            }
        }
        CHECK(r == 0 && seen == 8 && as == 5);
        CHECK(lseek(fd, 0, SEEK_SET) == 0);
    }
    char tiny[8];
    CHECK(getdents64(fd, tiny, sizeof tiny) == -1 && errno == EINVAL);
    close(fd);
}

static void copies(const char *dir, const char *local)
{
    char *big = cat(dir, "big");
    write_pattern(big, BIG, 1);

    /* sendfile chfs -> local, from the position */
    char *lout = cat(local, "sent");
    int in = open(big, O_RDONLY);
    int out = open(lout, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(in >= 0 && out >= 0);
    long total = 0;
    ssize_t r;
    while ((r = sendfile(out, in, NULL, BIG - total)) > 0)
        total += r;
    CHECK(r >= 0 && total == BIG);
    CHECK(lseek(in, 0, SEEK_CUR) == BIG);
    close(out);
    check_pattern(lout, 0, BIG);
    /* ... with an offset: the position does not move */
    CHECK(lseek(in, 10, SEEK_SET) == 10);
    off_t off = 1000;
    char *lout2 = cat(local, "sent2");
    out = open(lout2, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(sendfile(out, in, &off, 5000) == 5000 && off == 6000);
    CHECK(lseek(in, 0, SEEK_CUR) == 10);
    close(out);
    check_pattern(lout2, 1000, 5000);
    close(in);

    /* sendfile local -> chfs */
    char *back = cat(dir, "back");
    in = open(lout, O_RDONLY);
    out = open(back, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(in >= 0 && out >= 0);
    total = 0;
    while ((r = sendfile64(out, in, NULL, BIG)) > 0)
        total += r;
    CHECK(total == BIG);
    close(in);
    close(out);
    check_pattern(back, 0, BIG);

    /* copy_file_range chfs -> chfs with offsets */
    char *cfr = cat(dir, "cfr");
    in = open(big, O_RDONLY);
    out = open(cfr, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    loff_t oi = 100, oo = 0;
    CHECK(copy_file_range(in, &oi, out, &oo, 70000, 0) == 70000);
    CHECK(oi == 70100 && oo == 70000);
    CHECK(lseek(in, 0, SEEK_CUR) == 0 && lseek(out, 0, SEEK_CUR) == 0);
    CHECK(copy_file_range(in, &oi, out, &oo, 10, 1) == -1 && errno == EINVAL);
    close(out);
    check_pattern(cfr, 100, 70000);
    /* ... from the positions */
    char *cfr2 = cat(dir, "cfr2");
    out = open(cfr2, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    total = 0;
    while ((r = copy_file_range(in, NULL, out, NULL, 1 << 30, 0)) > 0)
        total += r;
    CHECK(r == 0 && total == BIG);
    close(in);
    close(out);
    check_pattern(cfr2, 0, BIG);

    /* splice chfs -> pipe -> chfs */
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    char *spl = cat(dir, "spliced");
    in = open(big, O_RDONLY);
    out = open(spl, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    loff_t so = 4;
    ssize_t n = splice(in, &so, pfd[1], NULL, 4096, 0);
    CHECK(n == 4096 && so == 4100);
    CHECK(splice(pfd[0], NULL, out, NULL, (size_t)n, 0) == n);
    close(in);
    close(out);
    close(pfd[0]);
    close(pfd[1]);
    check_pattern(spl, 4, 4096);
}

/* A child spawned while a file is open and unflushed (CHFS_BUF_SIZE)
   reads all of it: the file is published before the spawn. */
static void spawn(const char *dir, const char *local)
{
    char *f = cat(dir, "spawned");
    char *outp = cat(local, "spawn.out");
    char *buf = malloc(10000);
    for (int i = 0; i < 10000; i++)
        buf[i] = pat(i);
    int fd = open(f, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(fd >= 0);
    CHECK(write(fd, buf, 10000) == 10000);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outp, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    char *argv[] = {"cat", f, NULL};
    pid_t pid;
    CHECK(posix_spawnp(&pid, "cat", &fa, NULL, argv, environ) == 0);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    check_pattern(outp, 0, 10000);
    close(fd);

    /* system and popen (glibc's spawn /bin/sh internally) */
    char *f2 = cat(dir, "systemed");
    fd = open(f2, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(fd >= 0);
    CHECK(write(fd, buf, 7000) == 7000);
    char *sout = cat(local, "system.out");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cat '%s' > '%s'", f2, sout);
    CHECK(system(cmd) == 0);
    check_pattern(sout, 0, 7000);
    CHECK(write(fd, buf + 7000, 3000) == 3000);
    snprintf(cmd, sizeof cmd, "cat '%s'", f2);
    FILE *pp = popen(cmd, "r");
    CHECK(pp != NULL);
    long got = 0;
    char rb[4096];
    size_t k;
    while ((k = fread(rb, 1, sizeof rb, pp)) > 0) {
        for (size_t i = 0; i < k; i++)
            CHECK(rb[i] == pat(got + (long)i));
        got += (long)k;
    }
    CHECK(pclose(pp) == 0 && got == 10000);
    close(fd);
    free(buf);
}

/* A vfork child (Python's subprocess uses vfork) shares the parent's
   memory: its close, close_range, dup2 and chdir must not change the
   parent's descriptor table or current directory. */
static void vfork_child(const char *dir)
{
    char *f = cat(dir, "vforked");
    int fd = open(f, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    int fd2 = open(f, O_RDONLY);
    CHECK(fd >= 0 && fd2 >= 0);
    CHECK(write(fd, "0123456789", 10) == 10);
    CHECK(chdir(dir) == 0);
    pid_t pid = vfork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        close(fd);
        dup2(null, fd2);
        close_range(3, ~0U, 0);
        (void)chdir("/");
        _exit(0);
    }
    CHECK(pid > 0);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent's descriptors and directory are as they were. */
    CHECK(write(fd, "abcdefghij", 10) == 10);
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && st.st_size == 20);
    CHECK(close(fd) == 0);
    char buf[32];
    CHECK(pread(fd2, buf, sizeof buf, 0) == 20);
    CHECK(memcmp(buf, "0123456789abcdefghij", 20) == 0);
    CHECK(close(fd2) == 0);
    CHECK(stat("vforked", &st) == 0 && st.st_size == 20);
    char cwd[4096];
    CHECK(getcwd(cwd, sizeof cwd) != NULL && strcmp(cwd, dir) == 0);
    CHECK(chdir("/") == 0);
}

int main(int argc, char **argv)
{
    if (argc == 3 && (strcmp(argv[1], "--exit") == 0 || strcmp(argv[1], "--Exit") == 0)) {
        write_pattern(argv[2], 10000, 0);
        if (argv[1][2] == 'e')
            _exit(0);
        _Exit(0);
    }
    if (argc != 3)
        return 2;
    umask(022);
    CHECK(mkdir(argv[1], 0755) == 0);
    statfs_link_mknod(argv[1], argv[2]);
    set_times(argv[1]);
    listings(argv[1]);
    copies(argv[1], argv[2]);
    spawn(argv[1], argv[2]);
    vfork_child(argv[1]);
    printf("ok\n");
    return 0;
}
