/*
 * The trace recorder (shim/common/trace_log.c): what goes in comes out as
 * CSV, in each producer's order, with the right thread, stream and a time
 * that never runs backwards, across many more buffers than the recorder
 * owns (so producers outrun the writer and wait), odd pointers, changing
 * streams, threads sharing the locked channel, and a flush in the middle;
 * channels closed by one producer and opened again by the next; and the
 * microsecond of each event while events are few.
 *
 * Each event names its producer and its place in that producer's sequence:
 * pointer = producer << 40 | seq << 4 (| 1 for an odd pointer), size = seq.
 */
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "trace_log.h"

enum { CHANNELS = 3, THREADS = 2, PRODUCERS = CHANNELS + THREADS };
enum { CHANNEL_EVENTS = 150000, THREAD_EVENTS = 40000 };

static uint64_t pointer_of(unsigned producer, uint64_t seq)
{
    uint64_t p = (uint64_t)(producer + 1) << 40 | seq << 4;
    return seq % 97 == 5 ? p | 1 : p; /* now and then an odd one */
}

static uint64_t stream_of(uint64_t seq)
{
    return seq / 1000 % 3 * 0x1000; /* changes every thousand events */
}

static rec_action action_of(uint64_t seq)
{
    return seq % 2 ? REC_FREE : seq % 10 == 4 ? REC_ALLOCATE_FAILURE : REC_ALLOCATE;
}

typedef struct thread_arg {
    trace_log *log;
    unsigned producer;
    uint64_t tid;
} thread_arg;

static void *thread_main(void *p)
{
    thread_arg *a = p;
    a->tid = (uint64_t)syscall(SYS_gettid);
    for (uint64_t s = 0; s < THREAD_EVENTS; s++)
        trace_log_event(a->log, action_of(s), pointer_of(a->producer, s), s, stream_of(s));
    return NULL;
}

/* What the CSV says, producer by producer. */
typedef struct seen {
    uint64_t next_seq, thread, last_us;
    int bad_lines;
} seen;

static uint64_t read_csv(const char *path, seen *s, uint64_t main_tid, const uint64_t *tids)
{
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    char line[256];
    REQUIRE(fgets(line, sizeof line, f));
    CHECK(strcmp(line, "Thread,Time,Action,Pointer,Size,Stream\n") == 0);
    memset(s, 0, PRODUCERS * sizeof *s);
    uint64_t lines = 0;
    static const char *const names[] = {"allocate", "free", "allocate failure"};
    while (fgets(line, sizeof line, f)) {
        unsigned long long thread, ptr, size, stream;
        unsigned hh, mm, ss, us;
        char action[32];
        lines++;
        if (sscanf(line, "%llu,%u:%u:%u:%u,%31[a-z ],%llx,%llu,%llu", &thread, &hh, &mm, &ss,
                   &us, action, &ptr, &size, &stream) != 9) {
            CHECK(!"a line parses");
            continue;
        }
        unsigned producer = (unsigned)(ptr >> 40) - 1;
        if (producer >= PRODUCERS) {
            CHECK(!"a known producer");
            continue;
        }
        seen *p = &s[producer];
        uint64_t seq = size;
        uint64_t t = ((uint64_t)hh * 3600 + mm * 60 + ss) * 1000000 + us;
        /* in order, nothing lost, every field as it went in; time moves on
         * (a decrease of more than 12 hours is midnight) */
        bool ok = seq == p->next_seq && ptr == pointer_of(producer, seq) &&
                  strcmp(action, names[action_of(seq)]) == 0 && stream == stream_of(seq) &&
                  thread == (producer < CHANNELS ? main_tid : tids[producer - CHANNELS]) &&
                  (t >= p->last_us || p->last_us - t > 43200ull * 1000000);
        if (!ok && p->bad_lines++ < 3)
            fprintf(stderr, "producer %u, expected seq %llu: %s", producer,
                    (unsigned long long)p->next_seq, line);
        p->next_seq = seq + 1;
        p->last_us = t;
    }
    fclose(f);
    return lines;
}

/* A log writing DIR/trace.csv, DIR a fresh temporary folder named from
 * the template dir. */
static trace_log *open_in_temp_dir(char *dir, char *path, size_t len)
{
    REQUIRE(mkdtemp(dir));
    snprintf(path, len, "%s/trace.csv", dir);
    trace_log *log = trace_log_open(path);
    REQUIRE(log);
    return log;
}

static void producers_keep_order_across_buffers_and_flushes(void)
{
    char dir[] = "/tmp/test_trace_log.XXXXXX", path[128];
    trace_log *log = open_in_temp_dir(dir, path, sizeof path);
    trace_channel *ch[CHANNELS];
    for (int i = 0; i < CHANNELS; i++)
        REQUIRE((ch[i] = trace_log_channel_open(log)));
    uint64_t main_tid = (uint64_t)syscall(SYS_gettid);

    thread_arg args[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (thread_arg){.log = log, .producer = CHANNELS + (unsigned)i};
        REQUIRE(pthread_create(&threads[i], NULL, thread_main, &args[i]) == 0);
    }
    /* The channels, interleaved, in two halves with a flush and a pause of
     * a few ticks between them. */
    uint64_t half = CHANNEL_EVENTS / 2;
    for (uint64_t s = 0; s < half; s++)
        for (unsigned c = 0; c < CHANNELS; c++)
            trace_channel_event(ch[c], action_of(s), pointer_of(c, s), s, stream_of(s));
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < CHANNELS; i++)
        trace_channel_flush(ch[i]);
    trace_log_flush(log);
    uint64_t tids[THREADS] = {args[0].tid, args[1].tid};
    seen s[PRODUCERS];
    uint64_t lines = read_csv(path, s, main_tid, tids);
    CHECK_EQ(lines, CHANNELS * half + THREADS * THREAD_EVENTS);
    for (int p = 0; p < PRODUCERS; p++) {
        CHECK_EQ(s[p].bad_lines, 0);
        CHECK_EQ(s[p].next_seq, p < CHANNELS ? half : THREAD_EVENTS);
    }
    uint64_t before_pause = s[0].last_us;

    nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    for (uint64_t q = half; q < CHANNEL_EVENTS; q++)
        for (unsigned c = 0; c < CHANNELS; c++)
            trace_channel_event(ch[c], action_of(q), pointer_of(c, q), q, stream_of(q));
    for (int i = 0; i < CHANNELS; i++)
        trace_channel_flush(ch[i]);
    trace_log_close(log);
    lines = read_csv(path, s, main_tid, tids);
    CHECK_EQ(lines, CHANNELS * CHANNEL_EVENTS + THREADS * THREAD_EVENTS);
    for (int p = 0; p < PRODUCERS; p++) {
        CHECK_EQ(s[p].bad_lines, 0);
        CHECK_EQ(s[p].next_seq, p < CHANNELS ? CHANNEL_EVENTS : THREAD_EVENTS);
    }
    /* The pause shows in the times (ticks are 4 ms; it lasted 20). */
    uint64_t after = s[0].last_us;
    CHECK(after >= before_pause + 8000 || before_pause > after);
    unlink(path);
    rmdir(dir);
}

/* Times of the CSV's lines, in microseconds of the day, in order. */
static size_t read_times(const char *path, uint64_t *us, size_t max)
{
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    char line[256];
    size_t n = 0;
    while (fgets(line, sizeof line, f) && n < max) {
        unsigned hh, mm, ss, frac;
        if (sscanf(line, "%*[0-9],%u:%u:%u:%u,", &hh, &mm, &ss, &frac) == 4)
            us[n++] = ((uint64_t)hh * 3600 + mm * 60 + ss) * 1000000 + frac;
    }
    fclose(f);
    return n;
}

/* A program allocating now and then (a few events a millisecond or fewer)
 * gets the microsecond of each event, as RMM records it, to line up with a
 * profiler's timeline; a 4 ms tick would give most of these events the
 * same time (they failed so before). */
static void quiet_producers_get_microseconds(void)
{
    char dir[] = "/tmp/test_trace_log.XXXXXX", path[128];
    trace_log *log = open_in_temp_dir(dir, path, sizeof path);
    enum { N = 12 };
    for (uint64_t s = 0; s < N; s++) {
        trace_log_event(log, REC_ALLOCATE, 0x1000 * (s + 1), 256, 0);
        nanosleep(&(struct timespec){.tv_nsec = 1300 * 1000}, NULL);
    }
    trace_log_close(log);
    uint64_t us[N];
    REQUIRE(read_times(path, us, N) == N);
    int apart = 0;
    for (int i = 1; i < N; i++) /* (a decrease of 12 hours is midnight) */
        apart += us[i] >= us[i - 1] + 1300 || us[i - 1] > us[i] + 43200ull * 1000000;
    fprintf(stderr, "%d of %d gaps of at least 1.3 ms\n", apart, N - 1);
    CHECK_EQ(apart, N - 1);
    unlink(path);
    rmdir(dir);
}

/* A producer that is done closes its channel, and the next producer gets
 * it: more producers one after another than channels at once, each
 * recorded with its own stream. */
static void closed_channels_open_again(void)
{
    char dir[] = "/tmp/test_trace_log.XXXXXX", path[128];
    trace_log *log = open_in_temp_dir(dir, path, sizeof path);
    enum { OPEN_AT_ONCE = 8, ROUNDS = 20 };
    trace_channel *ch[OPEN_AT_ONCE];
    for (int i = 0; i < OPEN_AT_ONCE; i++)
        REQUIRE((ch[i] = trace_log_channel_open(log)));
    CHECK(trace_log_channel_open(log) == NULL);
    for (uint64_t r = 0; r < ROUNDS; r++) {
        trace_channel *c = ch[r % OPEN_AT_ONCE];
        trace_channel_event(c, REC_ALLOCATE, (r + 1) << 20, r, r % 3 * 0x100);
        trace_channel_close(c);
        trace_channel *again = trace_log_channel_open(log);
        CHECK(again == c);
        ch[r % OPEN_AT_ONCE] = again;
    }
    trace_log_close(log);
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    char line[256];
    REQUIRE(fgets(line, sizeof line, f));
    uint64_t n = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long thread, ptr, size, stream;
        char time[32];
        CHECK(sscanf(line, "%llu,%31[0-9:],allocate,%llx,%llu,%llu", &thread, time, &ptr, &size,
                     &stream) == 5);
        CHECK_EQ(ptr, (n + 1) << 20);
        CHECK_EQ(size, n);
        CHECK_EQ(stream, n % 3 * 0x100);
        n++;
    }
    CHECK_EQ(n, ROUNDS);
    fclose(f);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    RUN(producers_keep_order_across_buffers_and_flushes);
    RUN(closed_channels_open_again);
    RUN(quiet_producers_get_microseconds);
    return harness_result();
}
