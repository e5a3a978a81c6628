/* An MPI program under the preload: argv[1] is a chfs-rs directory.
   Rank 0 creates the directory and DIR/shared; then every rank writes
   DIR/rank.R (its own file) and its block of DIR/shared (disjoint, not
   chunk-aligned offsets, in several writes), closes, and after a barrier
   reads back the next rank's file and block (close-to-open). */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BLOCK 50001
#define OWN(r) (100000 + (r) * 1000)

static char pat(int rank, long i) { return (char)((rank * 31 + i * 7) % 251); }

static int check(int ok, int line, int rank)
{
    if (!ok)
        fprintf(stderr, "rank %d: line %d failed\n", rank, line);
    return !ok;
}
#define CHECK(c) (bad += check((c), __LINE__, rank))

int main(int argc, char **argv)
{
    int rank, size, bad = 0;
    static char buf[200000], back[200000];
    char p[4096];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    snprintf(p, sizeof p, "%s/shared", argv[1]);
    if (rank == 0) {
        CHECK(mkdir(argv[1], 0755) == 0);
        int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        CHECK(fd >= 0 && close(fd) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* the shared file: this rank's block in three writes */
    int fd = open(p, O_WRONLY);
    CHECK(fd >= 0);
    for (long i = 0; i < BLOCK; i++)
        buf[i] = pat(rank, i);
    long off = (long)rank * BLOCK;
    CHECK(pwrite(fd, buf, 1000, off) == 1000);
    CHECK(lseek(fd, off + 1000, SEEK_SET) == off + 1000);
    CHECK(write(fd, buf + 1000, 20000) == 20000);
    CHECK(pwrite(fd, buf + 21000, BLOCK - 21000, off + 21000) == BLOCK - 21000);
    CHECK(close(fd) == 0);

    /* one file per rank */
    snprintf(p, sizeof p, "%s/rank.%d", argv[1], rank);
    fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(fd >= 0);
    for (long i = 0; i < OWN(rank); i++)
        buf[i] = pat(rank + 100, i);
    CHECK(write(fd, buf, OWN(rank)) == OWN(rank));
    CHECK(close(fd) == 0);
    MPI_Barrier(MPI_COMM_WORLD);

    /* read the next rank's file and block */
    int next = (rank + 1) % size;
    snprintf(p, sizeof p, "%s/rank.%d", argv[1], next);
    fd = open(p, O_RDONLY);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && st.st_size == OWN(next));
    CHECK(read(fd, back, sizeof back) == OWN(next));
    for (long i = 0; i < OWN(next); i++)
        if (back[i] != pat(next + 100, i)) {
            CHECK(0);
            break;
        }
    CHECK(close(fd) == 0);
    snprintf(p, sizeof p, "%s/shared", argv[1]);
    fd = open(p, O_RDONLY);
    CHECK(fd >= 0);
    CHECK(fstat(fd, &st) == 0 && st.st_size == (long)size * BLOCK);
    CHECK(pread(fd, back, BLOCK, (long)next * BLOCK) == BLOCK);
    for (long i = 0; i < BLOCK; i++)
        if (back[i] != pat(next, i)) {
            CHECK(0);
            break;
        }
    CHECK(close(fd) == 0);

    int total = 0;
    MPI_Reduce(&bad, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf(total == 0 ? "ok %d\n" : "FAILED %d\n", size);
    MPI_Finalize();
    return total != 0;
}
