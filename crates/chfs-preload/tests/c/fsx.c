/* An fsx-style model test: random operations on argv[1] (a chfs-rs path
   under the preload) and the same operations on an in-memory model,
   comparing every read, every returned offset and every size.
   Usage: fsx PATH SEED NOPS MODEL_OUT
   At the end the model is written to MODEL_OUT (a local path) so the
   caller can compare it with what the pool holds. Any mismatch prints the
   seed, the operation number and a log of the last operations, and exits 1.
   No mmap. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAXLEN (192 * 1024) /* file sizes stay below this */
#define MAXIO (20 * 1024)   /* one transfer: up to 5 chunks of 4 KiB */
#define LOG 32

static unsigned long long seed, state;
static char model[MAXLEN + MAXIO];
static long long mlen;   /* model size */
static long long mpos;   /* model position of fd */
static char buf[MAXIO], want[MAXIO];
static char logbuf[LOG][128];
static long opno;
static const char *path;

static unsigned long long rnd(void)
{ /* xorshift64* */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 2685821657736338717ULL;
}

static long long pick(long long n) { return n ? (long long)(rnd() % (unsigned long long)n) : 0; }

static void note(const char *fmt, long long a, long long b)
{
    snprintf(logbuf[opno % LOG], sizeof logbuf[0], fmt, a, b);
}

static void fail(const char *what, long long got, long long exp)
{
    fprintf(stderr, "fsx: seed %llu: op %ld: %s: got %lld, want %lld (errno %d %s)\n",
            seed, opno, what, got, exp, errno, strerror(errno));
    fprintf(stderr, "fsx: last operations (model size %lld):\n", mlen);
    for (long i = opno - LOG + 1; i <= opno; i++)
        if (i >= 0)
            fprintf(stderr, "  %ld: %s\n", i, logbuf[i % LOG]);
    exit(1);
}

/* An offset or size that likes chunk (4 KiB) boundaries. */
static long long offset(long long limit)
{
    long long o;
    switch (pick(4)) {
    case 0: o = pick(limit / 4096 + 1) * 4096; break;             /* on one */
    case 1: o = pick(limit / 4096 + 1) * 4096 + 4096 - 1 - pick(64); break; /* just before */
    default: o = pick(limit + 1);
    }
    return o < 0 ? 0 : (o > limit ? limit : o);
}

static long long iosize(void)
{
    switch (pick(5)) {
    case 0: return 1 + pick(16);
    case 1: return 4096 * (1 + pick(4)) + pick(3) - 1;
    default: return 1 + pick(MAXIO);
    }
}

static void fill(char *p, long long n)
{
    for (long long i = 0; i < n; i++)
        p[i] = (char)(rnd() >> 56) | 1; /* never 0: a hole reads as 0 */
}

static void model_write(long long off, const char *p, long long n)
{
    if (off > mlen)
        memset(model + mlen, 0, off - mlen);
    memcpy(model + off, p, n);
    if (off + n > mlen)
        mlen = off + n;
}

static void check_read(const char *what, long long off, long long n, long long got)
{
    long long exp = off >= mlen ? 0 : (off + n > mlen ? mlen - off : n);
    if (got != exp)
        fail(what, got, exp);
    memcpy(want, model + off, exp);
    for (long long i = 0; i < exp; i++)
        if (buf[i] != want[i]) {
            fprintf(stderr, "fsx: byte %lld (file offset %lld): got 0x%02x, want 0x%02x\n", i,
                    off + i, buf[i] & 0xff, want[i] & 0xff);
            fail(what, off + i, off + i);
        }
}

static void check_size(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        fail("fstat", -1, 0);
    if (st.st_size != mlen)
        fail("fstat size", st.st_size, mlen);
    if (!S_ISREG(st.st_mode))
        fail("fstat mode", st.st_mode, S_IFREG);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: fsx PATH SEED NOPS MODEL_OUT\n");
        return 2;
    }
    path = argv[1];
    seed = strtoull(argv[2], NULL, 10);
    long nops = atol(argv[3]);
    state = seed * 0x9E3779B97F4A7C15ULL + 1;
    if (!state)
        state = 1;

    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0)
        fail("open", fd, 0);
    int fd2 = -1; /* sometimes a second descriptor on the same file */
    long counts[12] = {0};
    for (opno = 0; opno < nops; opno++) {
        int op = (int)pick(12);
        counts[op]++;
        long long off, n, r;
        switch (op) {
        case 0: /* pwrite */
        case 1:
            off = offset(MAXLEN - MAXIO);
            n = iosize();
            note("pwrite off %lld len %lld", off, n);
            fill(buf, n);
            r = pwrite(fd, buf, n, off);
            if (r != n)
                fail("pwrite", r, n);
            model_write(off, buf, n);
            break;
        case 2: /* lseek + write */
            off = pick(3) || mlen > MAXLEN - MAXIO ? offset(MAXLEN - MAXIO) : mlen;
            n = iosize();
            note("lseek %lld; write len %lld", off, n);
            r = lseek(fd, off, SEEK_SET);
            if (r != off)
                fail("lseek SEEK_SET", r, off);
            fill(buf, n);
            r = write(fd, buf, n);
            if (r != n)
                fail("write", r, n);
            model_write(off, buf, n);
            mpos = off + n;
            break;
        case 3: /* pread */
        case 4:
            off = pick(3) ? offset(mlen + 100) : offset(MAXLEN);
            n = iosize();
            note("pread off %lld len %lld", off, n);
            memset(buf, 0x55, n);
            r = pread(fd, buf, n, off);
            check_read("pread", off, n, r);
            break;
        case 5: /* read at the position, sometimes twice in a row */
            n = iosize();
            note("read at %lld len %lld", mpos, n);
            memset(buf, 0x55, n);
            r = read(fd, buf, n);
            check_read("read", mpos, n, r);
            mpos += r;
            break;
        case 6: /* lseek: SEEK_CUR, SEEK_END, beyond the end */
            switch (pick(3)) {
            case 0:
                off = pick(2000) - 1000;
                if (mpos + off < 0)
                    off = -mpos;
                note("lseek SEEK_CUR %lld from %lld", off, mpos);
                r = lseek(fd, off, SEEK_CUR);
                mpos += off;
                if (r != mpos)
                    fail("lseek SEEK_CUR", r, mpos);
                break;
            case 1:
                off = -pick(mlen + 1);
                note("lseek SEEK_END %lld size %lld", off, mlen);
                r = lseek(fd, off, SEEK_END);
                mpos = mlen + off;
                if (r != mpos)
                    fail("lseek SEEK_END", r, mpos);
                break;
            default:
                off = mlen + pick(10000);
                note("lseek SEEK_SET %lld (size %lld)", off, mlen);
                r = lseek(fd, off, SEEK_SET);
                mpos = off;
                if (r != mpos)
                    fail("lseek SEEK_SET past end", r, mpos);
            }
            break;
        case 7: /* ftruncate up or down */
            off = pick(2) ? offset(mlen) : offset(MAXLEN);
            note("ftruncate %lld (size %lld)", off, mlen);
            r = ftruncate(fd, off);
            if (r != 0)
                fail("ftruncate", r, 0);
            if (off > mlen)
                memset(model + mlen, 0, off - mlen);
            mlen = off;
            break;
        case 8: /* close and reopen (position back to 0) */
            note("close; reopen (size %lld, pos %lld)", mlen, mpos);
            if (close(fd) != 0)
                fail("close", -1, 0);
            if (pick(8) == 0) {
                fd = open(path, O_RDWR | O_TRUNC);
                mlen = 0;
            } else {
                fd = open(path, O_RDWR);
            }
            if (fd < 0)
                fail("reopen", fd, 0);
            mpos = 0;
            break;
        case 9: /* fstat and stat sizes */
            note("fstat/stat, size %lld (pos %lld)", mlen, mpos);
            check_size(fd);
            {
                struct stat st;
                if (stat(path, &st) != 0)
                    fail("stat", -1, 0);
                if (st.st_size != mlen)
                    fail("stat size", st.st_size, mlen);
            }
            break;
        case 10: /* a second descriptor: open it, read through it, close it */
            if (fd2 < 0) {
                note("open second descriptor (size %lld, pos %lld)", mlen, mpos);
                fd2 = open(path, O_RDONLY);
                if (fd2 < 0)
                    fail("open second", fd2, 0);
            } else {
                off = offset(mlen + 10);
                n = iosize();
                note("pread second off %lld len %lld", off, n);
                memset(buf, 0x55, n);
                r = pread(fd2, buf, n, off);
                check_read("pread second descriptor", off, n, r);
                if (pick(4) == 0) {
                    close(fd2);
                    fd2 = -1;
                }
            }
            break;
        case 11: /* fsync, then the size */
            note("fsync (size %lld, pos %lld)", mlen, mpos);
            if (fsync(fd) != 0)
                fail("fsync", -1, 0);
            check_size(fd);
            break;
        }
    }
    check_size(fd);
    /* read the whole file back through the descriptor */
    for (long long off = 0;;) {
        memset(buf, 0x55, MAXIO);
        long long r = pread(fd, buf, MAXIO, off);
        check_read("final pread", off, MAXIO, r);
        if (r == 0)
            break;
        off += r;
    }
    if (fd2 >= 0)
        close(fd2);
    if (close(fd) != 0)
        fail("final close", -1, 0);
    int out = open(argv[4], O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (out < 0 || write(out, model, mlen) != mlen || close(out) != 0)
        fail("write model", -1, 0);
    printf("fsx: seed %llu: %ld operations, final size %lld; per kind:", seed, nops, mlen);
    for (int i = 0; i < 12; i++)
        printf(" %ld", counts[i]);
    printf("\n");
    return 0;
}
