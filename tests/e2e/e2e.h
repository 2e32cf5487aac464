/*
 * e2e.h - helpers for the end-to-end programs. The programs are ordinary
 * CUDA programs that never heard of the shim: the test runner preloads
 * libbfcshim.so and points the dynamic linker at the fake CUDA libraries.
 * What they check about the shim they learn from the fake driver's counters
 * and from the shim's log file (BFCSHIM_LOG_FILE, set by meson).
 */
#ifndef BFCSHIM_TESTS_E2E_H
#define BFCSHIM_TESTS_E2E_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "../shim_stats.h"

static int e2e_failures;
/* The program's name, for messages (set by e2e_main). */
static const char *e2e_program = "e2e";

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            e2e_failures++;                                                      \
        }                                                                        \
    } while (0)

#define CHECK_EQ(a, b)                                                           \
    do {                                                                         \
        long long a_ = (long long)(a), b_ = (long long)(b);                      \
        if (a_ != b_) {                                                          \
            fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, \
                    __LINE__, #a, a_, #b, b_);                                   \
            e2e_failures++;                                                      \
        }                                                                        \
    } while (0)

/* Is the shim's driver door closed (BFCSHIM_DRIVER_HOOKS=0)? Then only the
 * runtime door sees the program. */
static inline bool e2e_driver_door_closed(void)
{
    const char *v = getenv("BFCSHIM_DRIVER_HOOKS");
    return v && strcmp(v, "0") == 0;
}

static inline int e2e_done(const char *name)
{
    if (e2e_failures)
        fprintf(stderr, "%s: %d check(s) failed\n", name, e2e_failures);
    else
        printf("%s: ok\n", name);
    return e2e_failures ? 1 : 0;
}

/* Ends the program, failed: `call` could not allocate the n bytes a
 * scenario needs (code: what it returned), so nothing after it can run. */
static inline _Noreturn void e2e_alloc_failed(const char *call, size_t n, int code)
{
    fprintf(stderr, "%s(%zu) failed: %d\n", call, n, code);
    e2e_failures++;
    exit(e2e_done(e2e_program));
}

/* How far a test's second thread has come: one thread sets the phase it
 * reached, the other waits for it (CHECK is not thread-safe, so the
 * thread leaves its results for the main thread to check). */
typedef struct e2e_phase {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int phase;
} e2e_phase;
#define E2E_PHASE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}

static inline void e2e_phase_set(e2e_phase *p, int phase)
{
    pthread_mutex_lock(&p->lock);
    p->phase = phase;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

static inline void e2e_phase_wait(e2e_phase *p, int phase)
{
    pthread_mutex_lock(&p->lock);
    while (p->phase < phase)
        pthread_cond_wait(&p->cond, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

/* Runs fn in n threads at once (n <= 16) and counts, as a failed check,
 * each that returned non-NULL (CHECK is not thread-safe: a thread says what
 * went wrong by its result). */
static inline void e2e_run_threads(int n, void *(*fn)(void *))
{
    pthread_t t[16];
    int started = 0;
    for (; started < n && started < 16; started++)
        if (pthread_create(&t[started], NULL, fn, NULL) != 0)
            break;
    CHECK_EQ(started, n);
    for (int i = 0; i < started; i++) {
        void *why = NULL;
        pthread_join(t[i], &why);
        if (why) {
            fprintf(stderr, "thread %d of %d failed (%p)\n", i, n, why);
            e2e_failures++;
        }
    }
}

/* libcuda.so.1 opened the way XLA and Numba open it (dlopen, never linked),
 * or exit 1. */
static inline void *e2e_open_libcuda(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen(libcuda.so.1): %s\n", dlerror());
        exit(1);
    }
    return h;
}

/* A function the program looks up in a library it opened, or exit 1. */
static inline void *e2e_dlsym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "dlsym(%s) failed\n", name);
        exit(1);
    }
    return p;
}

/* Does a child process die writing one byte at `at`? (A fault kills it; under
 * ASan its handler exits non-zero instead.) For memory the fake maps or
 * protects as a GPU would. */
static inline bool e2e_touch_dies(uintptr_t at)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        *(volatile unsigned char *)at = 7;
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
}

static inline fakecuda_stats fake_stats(void)
{
    fakecuda_stats st;
    fakecuda()->stats(&st);
    return st;
}

/* How often the fake driver was called under this exported name, by
 * anyone (the shim's calls included). */
static inline uint64_t e2e_calls_of(const char *name)
{
    fakecuda_call_count c[256];
    size_t n = fakecuda()->calls(c, 256);
    for (size_t i = 0; i < n && i < 256; i++)
        if (strcmp(c[i].name, name) == 0)
            return c[i].calls;
    return 0;
}

/* Device memory taken as regions: cuMemAlloc calls (a pool of one region,
 * pass-through allocations) and address ranges reserved and kept (a pool
 * over virtual memory, the default when preallocated; the two-granule trial
 * it makes first reserves a range and gives it back). Compared between two
 * moments, it says how many regions pools and pass-through calls took,
 * whichever way the pool holds its memory. */
static inline uint64_t regions_taken(fakecuda_stats st)
{
    return st.mem_alloc_calls + st.vmm_reserve_calls - st.vmm_address_free_calls;
}

/* Until another thread, having said `ready`, waits inside a pool for the
 * GPU (the fake has seen an event synchronisation): up to 5 s, then a
 * little longer so that the wait is surely under way. */
static inline void e2e_wait_inside_pool(atomic_int *ready)
{
    for (int i = 0; i < 500; i++) {
        if (atomic_load(ready) && fake_stats().event_synchronize_calls > 0)
            break;
        usleep(10000);
    }
    CHECK(atomic_load(ready));
    CHECK(fake_stats().event_synchronize_calls > 0);
    usleep(50000);
}

static long e2e_log_offset;

static inline const char *e2e_log_path(void)
{
    const char *path = getenv("BFCSHIM_LOG_FILE");
    if (!path) {
        fprintf(stderr, "BFCSHIM_LOG_FILE is not set: cannot count log lines\n");
        exit(2);
    }
    return path;
}

/* Empties the shim's log file; call first thing in main. */
static inline void shim_log_reset(void)
{
    FILE *f = fopen(e2e_log_path(), "w");
    if (f)
        fclose(f);
    e2e_log_offset = 0;
}

/* Out-of-memory reports (multi-line blocks) seen by the last shim_log_lines. */
static int e2e_reports;

/* Lines the shim logged since the previous call, copied (up to len bytes)
 * into buf when it is not NULL. An out-of-memory report block is not a log
 * line: it is counted in e2e_reports instead. */
static inline int shim_log_lines(char *buf, size_t len)
{
    bool in_report = false;
    e2e_reports = 0;
    if (buf && len)
        buf[0] = 0;
    FILE *f = fopen(e2e_log_path(), "r");
    if (!f)
        return 0;
    fseek(f, e2e_log_offset, SEEK_SET);
    int lines = 0;
    size_t used = 0;
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (strncmp(line, "==== bfcshim out-of-memory report", 33) == 0) {
            in_report = true;
            e2e_reports++;
        }
        if (in_report) {
            in_report = strncmp(line, "==== end of report", 18) != 0;
            continue;
        }
        lines++;
        if (buf && used + n < len) {
            memcpy(buf + used, line, n + 1);
            used += n;
        }
    }
    e2e_log_offset = ftell(f);
    fclose(f);
    return lines;
}

/* Expects exactly one new log line that contains `word`. */
#define CHECK_ONE_LOG_LINE(word)                                                  \
    do {                                                                          \
        char log_[4096];                                                          \
        int n_ = shim_log_lines(log_, sizeof log_);                               \
        if (n_ != 1 || !strstr(log_, word)) {                                     \
            fprintf(stderr, "%s:%d: expected one log line with '%s', got %d:\n%s", \
                    __FILE__, __LINE__, word, n_, log_);                          \
            e2e_failures++;                                                       \
        }                                                                         \
    } while (0)

/* Fills and checks a block byte by byte ("device" memory is host memory in
 * the fake driver). */
/* Statistics on demand: the shim's exported bfcshim_write_stats writes
 * them to $STATS_NOW, read back into text (empty, with a failed check,
 * when anything is missing). */
static inline void e2e_stats_now(char *text, size_t cap)
{
    int (*write_stats)(const char *) =
        (int (*)(const char *))dlsym(RTLD_DEFAULT, "bfcshim_write_stats");
    const char *path = getenv("STATS_NOW");
    text[0] = 0;
    CHECK(write_stats != NULL && path != NULL);
    if (!write_stats || !path)
        return;
    remove(path);
    CHECK_EQ(write_stats(path), 0);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        text[fread(text, 1, cap - 1, f)] = 0;
        fclose(f);
    }
}

static inline void fill(void *p, size_t n, unsigned char v) { memset(p, v, n); }
static inline int holds(const void *p, size_t n, unsigned char v)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != v)
            return 0;
    return 1;
}

/* One scenario per invocation: `PROGRAM SCENARIO`. */
typedef struct e2e_scenario {
    const char *name;
    void (*fn)(void);
} e2e_scenario;

/* Runs the scenario argv[1] names, after emptying the shim's log and
 * checking that the fake driver is the one loaded (else skip, 77). */
static inline int e2e_main(const char *program, const e2e_scenario *scenarios, size_t n,
                           int argc, char **argv)
{
    e2e_program = program;
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCENARIO\n", program);
        return 2;
    }
    shim_log_reset();
    fakecuda();
    for (size_t i = 0; i < n; i++)
        if (strcmp(argv[1], scenarios[i].name) == 0) {
            scenarios[i].fn();
            return e2e_done(argv[1]);
        }
    fprintf(stderr, "%s: no scenario '%s'\n", program, argv[1]);
    return 2;
}

#endif
