/*
 * out_file.c - see out_file.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "out_file.h"

/* Resolves path as the kernel would, one link at a time, into `out`: every
 * link met on the way, in the last component or in a directory above it, at
 * any depth, must be ours or root's (the system's own, such as /dev/stderr
 * -> /proc/self/fd/2, and the user's own links are followed; a link another
 * user made in a shared directory is not, nor one of theirs that a link of
 * ours leads into: a directory link of theirs sent our writes wherever they
 * chose). false: a link of another user's, a loop, too long a chain. Where
 * a link's target cannot be looked at by name although the link leads
 * somewhere (/proc/self/fd's "pipe:[...]", a magic link), the resolution
 * ends at that link and *follow_last says so; else `out` holds no link as
 * of now, and is opened with O_NOFOLLOW, so a link planted at its end since
 * is refused. */
static bool resolve_trusted(const char *path, char *out, size_t size, bool *follow_last)
{
    char cur[4096], next[4096], joined[8192];
    *follow_last = false;
    if (snprintf(cur, sizeof cur, "%s", path) >= (int)sizeof cur)
        return false;
    int hops = 0;
    size_t at = 0; /* cur[0..at) is resolved, free of links */
    while (cur[at]) {
        /* the next component: cur[0..end) */
        size_t end = at;
        while (cur[end] == '/')
            end++;
        while (cur[end] && cur[end] != '/')
            end++;
        char prefix[4096];
        snprintf(prefix, sizeof prefix, "%.*s", (int)end, cur);
        struct stat st;
        if (lstat(prefix, &st) != 0 || !S_ISLNK(st.st_mode)) {
            /* not there (made by the open, or the open fails) or no link */
            at = end;
            continue;
        }
        if ((st.st_uid != geteuid() && st.st_uid != 0) || ++hops > 40)
            return false;
        ssize_t n = readlink(prefix, next, sizeof next - 1);
        if (n < 0)
            return false;
        next[n] = 0;
        struct stat target;
        if (next[0] != '/' && stat(prefix, &target) == 0) {
            /* Relative: it may still be a magic link ("pipe:[...]") that
             * leads somewhere no name does. Tried by name first. */
            const char *slash = strrchr(prefix, '/');
            int dir = slash ? (int)(slash - prefix) : 0;
            char tried[8192];
            snprintf(tried, sizeof tried, "%.*s%s%s", dir, prefix, slash ? "/" : "", next);
            if (lstat(tried, &st) != 0) {
                if (cur[end]) /* a directory reached by a magic link: not ours to judge */
                    return false;
                *follow_last = true;
                return snprintf(out, size, "%s", prefix) < (int)size;
            }
        }
        /* The link's target in its place, the rest after it; resolved
         * again from the start (an absolute target) or from the link's
         * directory. */
        int len;
        if (next[0] == '/') {
            len = snprintf(joined, sizeof joined, "%s%s", next, cur + end);
            at = 0;
        } else {
            const char *slash = memrchr(prefix, '/', end);
            int dir = slash ? (int)(slash - prefix) : 0;
            len = snprintf(joined, sizeof joined, "%.*s%s%s%s", dir, cur, slash ? "/" : "", next,
                           cur + end);
            at = slash ? (size_t)dir : 0;
        }
        if (len < 0 || (size_t)len >= sizeof cur)
            return false;
        memcpy(cur, joined, (size_t)len + 1);
    }
    return snprintf(out, size, "%s", cur) < (int)size;
}

/* Is path a symbolic link that no other local user can have planted (it,
 * and every link it leads through, ours or root's: resolve_trusted)? */
static bool trusted_link(const char *path)
{
    struct stat st;
    char resolved[4096];
    bool follow_last;
    return lstat(path, &st) == 0 && S_ISLNK(st.st_mode) &&
           resolve_trusted(path, resolved, sizeof resolved, &follow_last);
}

int out_file_open(const char *path, int how)
{
    /* O_NOFOLLOW: the last component alone is what another user can plant
     * in a shared directory; the directories above are the user's choice.
     * A link of the user's own or the system's (BFCSHIM_LOG_FILE=/dev/stderr)
     * is followed, to the end it was checked to have: the path resolved is
     * opened, again with O_NOFOLLOW (a link planted at its end between the
     * check and the open is refused), unless it ends at a magic link. */
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | how, 0644);
    char resolved[4096];
    bool follow_last = false;
    if (fd < 0 && errno == ELOOP) {
        if (!resolve_trusted(path, resolved, sizeof resolved, &follow_last)) {
            errno = ELOOP;
            return -1;
        }
        fd = open(resolved, O_WRONLY | O_CREAT | O_CLOEXEC | how | (follow_last ? 0 : O_NOFOLLOW),
                  0644);
    }
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

/* A write that cannot grow the buffer copies nothing and answers 0, which
 * sets the stream's error flag (fopencookie(3): "the number of bytes copied
 * from buf, or 0 on error"). */
static ssize_t out_mem_write(void *cookie, const char *p, size_t n)
{
    out_mem *m = cookie;
    if (n > m->cap - m->len) {
        size_t cap = m->cap ? m->cap : 4096;
        while (cap - m->len < n && cap <= SIZE_MAX / 2)
            cap *= 2;
        char *t = cap - m->len >= n ? realloc(m->text, cap) : NULL;
        if (!t) {
            errno = ENOMEM;
            return 0;
        }
        m->text = t;
        m->cap = cap;
    }
    memcpy(m->text + m->len, p, n);
    m->len += n;
    return (ssize_t)n;
}

FILE *out_mem_open(out_mem *m)
{
    return fopencookie(m, "w", (cookie_io_functions_t){.write = out_mem_write});
}

bool out_file_close(FILE *f)
{
    bool ok = !ferror(f);
    int err = ok ? 0 : errno;
    if ((f == stdout || f == stderr ? fflush(f) : fclose(f)) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok)
        errno = err ? err : EIO;
    return ok;
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

bool out_file_names_folder(const char *path)
{
    size_t n = strlen(path);
    struct stat st;
    return (n > 0 && path[n - 1] == '/') || (stat(path, &st) == 0 && S_ISDIR(st.st_mode));
}
