/*
 * out_file.c - see out_file.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "out_file.h"

int out_file_open(const char *path, int how)
{
    /* O_NOFOLLOW: the last component alone is what another user can plant
     * in a shared directory; the directories above are the user's choice. */
    return open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | how, 0644);
}

FILE *out_file_fopen(const char *path, const char *mode)
{
    int fd = out_file_open(path, mode[0] == 'a' ? O_APPEND : O_TRUNC);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, mode);
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

/* Six characters another user cannot guess ahead, so planting names in
 * advance cannot make every try fail. (O_EXCL is what keeps the file safe;
 * the randomness keeps the write from being refused.) */
static void random_tail(char *out)
{
    static const char set[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static atomic_uint_fast64_t counter;
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        r = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15u ^ (uint64_t)getpid() << 32 ^
            atomic_fetch_add(&counter, 1) * 0xff51afd7ed558ccdu;
    }
    for (int i = 0; i < 6; i++, r /= sizeof set - 1)
        out[i] = set[r % (sizeof set - 1)];
    out[6] = 0;
}

int out_file_temp(const char *path, const char *suffix, mode_t mode, char *name, size_t size)
{
    for (int tries = 0; tries < 100; tries++) {
        char tail[7];
        random_tail(tail);
        int n = snprintf(name, size, "%s%s%s", path, suffix, tail);
        if (n < 0 || (size_t)n >= size) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    return -1; /* errno EEXIST */
}

bool out_file_replace(const char *tmp, const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        errno = ELOOP;
        return false;
    }
    return rename(tmp, path) == 0;
}

void out_file_why(const char *path, int err, char *buf, size_t size)
{
    struct stat st;
    if (err == ELOOP && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
        snprintf(buf, size, "is a symbolic link");
    else
        snprintf(buf, size, "cannot be written (%s)", strerror(err));
}
