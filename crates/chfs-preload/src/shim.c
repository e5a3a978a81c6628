/*
 * The entry points of libchfs_preload.so that stable Rust cannot define:
 * the variadic ones (open, openat, fcntl and their 64 variants) take their
 * optional argument here and call the Rust side with it; the fortified
 * ones (__open_2, ...) are here too so that every open lives in one
 * place. Also the fopencookie glue for stdio on chfs-rs descriptors.
 *
 * Nothing in this file decides anything: every decision is in lib.rs.
 * The exported names are listed in exports.map (rustc's own version script
 * would hide them).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/types.h>

int chfs_preload_open(const char *path, int flags, unsigned mode);
int chfs_preload_openat(int dirfd, const char *path, int flags, unsigned mode);
int chfs_preload_fcntl(int fd, int cmd, void *arg);

ssize_t chfs_preload_cookie_read(void *cookie, char *buf, size_t size);
ssize_t chfs_preload_cookie_write(void *cookie, const char *buf, size_t size);
int chfs_preload_cookie_seek(void *cookie, off64_t *off, int whence);
int chfs_preload_cookie_close(void *cookie);

#ifndef O_TMPFILE
#define O_TMPFILE 0
#endif

/* open(2)'s third argument exists only with O_CREAT or O_TMPFILE. */
static int wants_mode(int flags)
{
    return (flags & O_CREAT) != 0 || (O_TMPFILE != 0 && (flags & O_TMPFILE) == O_TMPFILE);
}

#define MODE_ARG(last)                                                   \
    unsigned mode = 0;                                                   \
    if (wants_mode(flags)) {                                             \
        va_list ap;                                                      \
        va_start(ap, last);                                              \
        mode = (unsigned)va_arg(ap, int);                                \
        va_end(ap);                                                      \
    }

int open(const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return chfs_preload_open(path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return chfs_preload_open(path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return chfs_preload_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...)
{
    MODE_ARG(flags);
    return chfs_preload_openat(dirfd, path, flags, mode);
}

int __open_2(const char *path, int flags) { return chfs_preload_open(path, flags, 0); }
int __open64_2(const char *path, int flags) { return chfs_preload_open(path, flags, 0); }
int __openat_2(int dirfd, const char *path, int flags)
{
    return chfs_preload_openat(dirfd, path, flags, 0);
}
int __openat64_2(int dirfd, const char *path, int flags)
{
    return chfs_preload_openat(dirfd, path, flags, 0);
}

/* fcntl's argument is an int or a pointer; both travel in one register. */
int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return chfs_preload_fcntl(fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return chfs_preload_fcntl(fd, cmd, arg);
}

/* A stdio stream over a chfs-rs descriptor (not exported). */
FILE *chfs_preload_cookie_file(void *cookie, const char *mode)
{
    cookie_io_functions_t io = {
        .read = chfs_preload_cookie_read,
        .write = chfs_preload_cookie_write,
        .seek = chfs_preload_cookie_seek,
        .close = chfs_preload_cookie_close,
    };
    return fopencookie(cookie, mode, io);
}

/* execl, execlp, execle: glibc's call its internal execve, so the
   interposed execv/execvp/execve (which publish open chfs-rs files first)
   are called with the argument list made into an argv. */
#include <errno.h>
#include <unistd.h>

#define ARGV_FROM_LIST(arg0, extra)                                      \
    va_list ap;                                                          \
    size_t n = 1;                                                        \
    va_start(ap, arg0);                                                  \
    while (va_arg(ap, const char *) != NULL)                             \
        n++;                                                             \
    va_end(ap);                                                          \
    if (n > 1u << 20) {                                                  \
        errno = E2BIG;                                                   \
        return -1;                                                       \
    }                                                                    \
    const char *argv[n + 1];                                             \
    argv[0] = arg0;                                                      \
    va_start(ap, arg0);                                                  \
    for (size_t i = 1; i <= n; i++)                                      \
        argv[i] = va_arg(ap, const char *);                              \
    extra;                                                               \
    va_end(ap)

int execl(const char *path, const char *arg, ...)
{
    ARGV_FROM_LIST(arg, (void)0);
    return execv(path, (char *const *)argv);
}

int execlp(const char *file, const char *arg, ...)
{
    ARGV_FROM_LIST(arg, (void)0);
    return execvp(file, (char *const *)argv);
}

int execle(const char *path, const char *arg, ...)
{
    char *const *envp;
    ARGV_FROM_LIST(arg, envp = va_arg(ap, char *const *));
    return execve(path, (char *const *)argv, envp);
}

/* vfork: the child shares the parent's memory, so the Rust side must not
   change the parent's descriptor table from it; whether that check (a
   getpid) is needed at all is known from whether the program ever called
   vfork. This entry point notes it and jumps to libc's vfork without a
   frame of its own (a function calling vfork would return twice through
   one frame). Elsewhere than x86-64 the check is always made. */
__attribute__((visibility("hidden"))) char chfs_preload_vforked;
__attribute__((visibility("hidden"))) void *chfs_preload_real_vfork;

__attribute__((constructor)) static void chfs_preload_find_vfork(void)
{
    chfs_preload_real_vfork = dlsym(RTLD_NEXT, "vfork");
    if (chfs_preload_real_vfork == NULL)
        chfs_preload_real_vfork = (void *)fork;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl vfork\n"
        ".type vfork, @function\n"
        "vfork:\n"
        "    movb $1, chfs_preload_vforked(%rip)\n"
        "    jmp *chfs_preload_real_vfork(%rip)\n"
        ".size vfork, .-vfork\n");

int chfs_preload_vfork_seen(void) { return __atomic_load_n(&chfs_preload_vforked, __ATOMIC_RELAXED); }
#else
int chfs_preload_vfork_seen(void) { return 1; }
#endif
