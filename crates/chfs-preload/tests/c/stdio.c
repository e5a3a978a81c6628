/* stdio and a normal file under the preload: argv[1] is a chfs-rs path,
   argv[2] a local one. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s\n", __LINE__, #c); return 1; } } while (0)

int main(int argc, char **argv)
{
    char line[256];
    CHECK(argc == 3);
    FILE *f = fopen(argv[1], "w+");
    CHECK(f != NULL);
    CHECK(fprintf(f, "hello %d\nsecond line\n", 42) > 0);
    CHECK(fseek(f, 0, SEEK_SET) == 0);
    CHECK(fgets(line, sizeof line, f) != NULL);
    CHECK(strcmp(line, "hello 42\n") == 0);
    CHECK(ftell(f) == 9);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    CHECK(ftell(f) == 21);
    CHECK(fclose(f) == 0);

    int local = open(argv[2], O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(local >= 0);
    CHECK(write(local, "local\n", 6) == 6);
    CHECK(close(local) == 0);

    /* fork: the child reads on from the parent's position */
    int fd = open(argv[1], O_RDONLY);
    CHECK(fd >= 0);
    char b[16];
    CHECK(read(fd, b, 6) == 6 && memcmp(b, "hello ", 6) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (read(fd, b, 2) != 2 || memcmp(b, "42", 2) != 0)
            _exit(3);
        int d = dup(fd);
        if (d < 0 || lseek(d, 0, SEEK_SET) != 0 || read(fd, b, 5) != 5 || memcmp(b, "hello", 5) != 0)
            _exit(4);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(read(fd, b, 2) == 2 && memcmp(b, "42", 2) == 0);
    CHECK(close(fd) == 0);
    puts("ok");
    return 0;
}
