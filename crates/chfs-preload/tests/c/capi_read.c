/* Reads files through libchfs (the C API), for the preload test: each
   argument is a chfs-rs path; prints "PATH SIZE FNV1A64" per file. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <chfs.h>

int main(int argc, char **argv)
{
    if (chfs_init(NULL) != 0) {
        fprintf(stderr, "chfs_init: %s\n", chfs_last_error());
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (chfs_stat(argv[i], &st) != 0) {
            fprintf(stderr, "chfs_stat %s: %s\n", argv[i], chfs_last_error());
            return 1;
        }
        int fd = chfs_open(argv[i], O_RDONLY);
        if (fd < 0) {
            fprintf(stderr, "chfs_open %s: %s\n", argv[i], chfs_last_error());
            return 1;
        }
        uint64_t h = 0xcbf29ce484222325ULL;
        long long total = 0;
        char buf[7000];
        ssize_t n;
        while ((n = chfs_read(fd, buf, sizeof buf)) > 0) {
            for (ssize_t k = 0; k < n; k++)
                h = (h ^ (unsigned char)buf[k]) * 0x100000001b3ULL;
            total += n;
        }
        if (n < 0 || chfs_close(fd) != 0 || total != (long long)st.st_size) {
            fprintf(stderr, "read %s: %s\n", argv[i], chfs_last_error());
            return 1;
        }
        printf("%s %lld %llu\n", argv[i], total, (unsigned long long)h);
    }
    return chfs_term();
}
