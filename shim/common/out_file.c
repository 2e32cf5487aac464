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

/* Is path a symbolic link that no other local user can have planted: it,
 * and every link it leads through, owned by us or by root? (The system's
 * own, such as /dev/stderr -> /proc/self/fd/2, and the user's own links are
 * followed; a link another user made in a shared directory is not.) A link
 * whose target cannot be looked at by name (/proc/self/fd's "pipe:[...]")
 * ends the chain. */
static bool trusted_link(const char *path)
{
    char cur[4096], next[4096];
    snprintf(cur, sizeof cur, "%s", path);
    struct stat st;
    if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode))
        return false;
    for (int hops = 0; hops < 16; hops++) {
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode))
            return true;
        if (st.st_uid != geteuid() && st.st_uid != 0)
            return false;
        ssize_t n = readlink(cur, next, sizeof next - 1);
        if (n < 0)
            return false;
        next[n] = 0;
        if (next[0] != '/') { /* relative to the link's directory */
            const char *slash = strrchr(cur, '/');
            int dir = slash ? (int)(slash - cur) : 0;
            char joined[4096];
            if (snprintf(joined, sizeof joined, "%.*s%s%s", dir, cur, slash ? "/" : "", next) >=
                (int)sizeof joined)
                return false;
            snprintf(cur, sizeof cur, "%s", joined);
        } else {
            snprintf(cur, sizeof cur, "%s", next);
        }
    }
    return false; /* a loop, or too long a chain */
}

int out_file_open(const char *path, int how)
{
    /* O_NOFOLLOW: the last component alone is what another user can plant
     * in a shared directory; the directories above are the user's choice.
     * A link of the user's own or the system's (BFCSHIM_LOG_FILE=/dev/stderr)
     * is followed. */
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | how, 0644);
    if (fd < 0 && errno == ELOOP && trusted_link(path))
        fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | how, 0644);
    return fd;
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
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && !trusted_link(path)) {
        errno = ELOOP;
        return false;
    }
    return rename(tmp, path) == 0;
}

bool out_file_in_place(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return false; /* a new file */
    if (S_ISLNK(st.st_mode))
        return trusted_link(path); /* another user's: refused by the rename */
    return !S_ISREG(st.st_mode);
}

void out_file_why(const char *path, int err, char *buf, size_t size)
{
    struct stat st;
    if (err == ELOOP && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
        snprintf(buf, size, "is a symbolic link");
    else
        snprintf(buf, size, "cannot be written (%s)", strerror(err));
}

bool out_file_folder_missing(const char *path, char *folder, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash || size == 0)
        return false; /* the working folder, which exists */
    size_t n = slash == path ? 1 : (size_t)(slash - path); /* "/x": the root */
    if (n >= size)
        return false; /* too long to name; the write will say */
    memcpy(folder, path, n);
    folder[n] = 0;
    struct stat st;
    if (stat(folder, &st) == 0)
        return !S_ISDIR(st.st_mode);
    return errno == ENOENT || errno == ENOTDIR;
}
