/*
 * log.c - one-line messages: "bfcshim[PID]: LEVEL: text", to stderr or to
 * BFCSHIM_LOG_FILE (appended to; stderr, with a line that says why, when
 * it cannot be opened or is a symbolic link). Each message is formatted first and written with one
 * write(2), so lines from several threads do not interleave.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "env_vars.h"
#include "out_file.h"
#include "shim.h"

int shim_log_fd(void)
{
    static atomic_int fd = -2;
    int f = atomic_load(&fd);
    if (f != -2)
        return f;
    /* The config is not consulted here: config.c logs while it parses. */
    const char *path = getenv("BFCSHIM_LOG_FILE");
    /* Never appended to through a link another user could have planted
     * (out_file.h). */
    int opened = path && *path ? out_file_open(path, O_APPEND) : -1;
    int err = errno;
    bool refused = path && *path && opened < 0;
    if (opened < 0)
        opened = STDERR_FILENO;
    int expected = -2;
    if (!atomic_compare_exchange_strong(&fd, &expected, opened)) {
        if (opened != STDERR_FILENO)
            close(opened);
    } else if (refused) { /* the first thread here says why, once, where the log now goes */
        char why[160];
        out_file_why(path, err, why, sizeof why);
        shim_log(LOG_ERROR, "BFCSHIM_LOG_FILE: %s %s; logging to stderr", path, why);
    }
    return atomic_load(&fd);
}

static int threshold(void)
{
    /* Read here, not from the config: config.c logs while it parses. The
     * table's choices are in LOG_* order. */
    const char *v = getenv("BFCSHIM_LOG_LEVEL");
    int level = v ? env_var_choice(env_var_find("BFCSHIM_LOG_LEVEL"), v) : -1;
    return level >= 0 ? level : LOG_WARN;
}

void shim_vlog(int level, const char *fmt, va_list ap)
{
    if (level > threshold())
        return;
    static const char *const tag[] = {"error", "warning", "info", "debug"};
    char line[1024];
    int n = snprintf(line, sizeof line, "bfcshim[%d]: %s: ", (int)getpid(), tag[level]);
    if (n < 0)
        return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    int saved = errno;
    ssize_t w = write(shim_log_fd(), line, len);
    (void)w;
    errno = saved;
}

void shim_log(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    shim_vlog(level, fmt, ap);
    va_end(ap);
}

void shim_log_once(atomic_bool *flag, int level, const char *fmt, ...)
{
    if (atomic_exchange(flag, true))
        return;
    va_list ap;
    va_start(ap, fmt);
    shim_vlog(level, fmt, ap);
    va_end(ap);
}
