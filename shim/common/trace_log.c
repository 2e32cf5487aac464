/*
 * trace_log.c - see trace_log.h. Buffers pass through two queues:
 *
 *   allocating threads --(full)--> writer thread --(free)--> allocating threads
 *
 * A producer's current buffer is its own: the log's channel 0 is guarded
 * by a test-and-set lock (two atomic instructions when uncontended), the
 * other channels by their owners (the engine's pool lock). The queues are
 * guarded by a mutex that producers touch once per BUFFER_EVENTS events.
 * Buffers are written in the order they filled, and each channel's records
 * in the order they were made, so the file keeps every producer's order.
 *
 * Times are microseconds, read two ways (see set_tick): while events are
 * few, each event reads the clock itself; while they come fast, the writer
 * reads a coarse clock once a tick (4 ms) for everyone, so a busy allocator
 * pays nothing per event for the time. On the development VM reading a
 * fine clock costs 20 ns (rdtsc) to 31 ns (CLOCK_MONOTONIC) against 6 ns
 * for the coarse one and about 40 ns for a whole pooled allocation: per
 * event it would triple what recording costs. Below PRECISE_MAX_PER_TICK
 * events a tick (62,500 a second) the fine clock costs at most 0.2% of one
 * core, and a timeline lines up with a profiler's to the microsecond
 * (choose_timing says when each way is used).
 *
 * The writer wakes every tick and drains the queue; a producer rings
 * for it only when half the buffers wait. At the replay benchmark's pace
 * (20 M events/s, 16 bytes each) a tick fills about 20 buffers, so a burst
 * rings now and then; a real program's rate leaves the writer to its ticks.
 *
 * The writer appends the binary records to a spool file (an unlinked file
 * next to the trace, made under a random name) and the CSV is made from
 * the spool on flush (at exit, on OOM, on request). Why not format as we
 * go: formatting a line costs
 * about 100 ns, more than an allocation, so a writer formatting in the
 * background falls behind a busy allocator, and the allocator would then
 * wait for it (measured: replay went from 38 to over 350 ns/op). Writing
 * raw records costs a few ns each and keeps up. Why a fixed set of reused
 * buffers rather than growing ones: fresh memory costs a page fault per
 * hundred records on first touch, which measured 90 ns per event on this
 * project's VM.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bfc.h"
#include "lock.h"
#include "out_file.h"
#include "trace_log.h"

_Static_assert(REC_ALLOCATE == (int)BFC_EVENT_ALLOC && REC_FREE == (int)BFC_EVENT_FREE &&
                   REC_ALLOCATE_FAILURE == (int)BFC_EVENT_ALLOC_FAILED,
               "recorder actions are the engine's events");

/* Each channel holds one buffer while it fills, so channels must stay well
 * below the number of buffers. */
enum { BUFFER_EVENTS = 4096, NBUFFERS = 24, MAX_CHANNELS = 8 };

/*
 * 16 bytes per event: the spool's bandwidth is what recording costs a busy
 * allocator. An event is {pointer | action, size}; pointers are at least
 * 4-byte aligned, which frees the two low bits for the action. What rarely
 * changes (the thread, the stream, the time) is written as a marker
 * record {MARK | kind << 2, value} only when it differs from the previous
 * event's, and a pointer that is not 4-byte aligned travels in a marker of
 * its own. The CSV writer replays the markers to rebuild every line.
 */
typedef struct record {
    uint64_t word; /* pointer | action, or kind << 2 | MARK */
    uint64_t value; /* size, or the marker's value */
} record;

enum { MARK = 3 };
enum { MARK_THREAD, MARK_STREAM, MARK_TICK, MARK_POINTER, MARK_CHANNEL };

/* The CSV writer's view of the markers so far. */
typedef struct decode_state {
    uint64_t thread, stream, tick, pointer;
    bool have_pointer;
} decode_state;

typedef struct buffer {
    record *r;
    size_t n;
    uint32_t channel; /* whose records these are */
} buffer;

/* A producer's state: where its next record goes and what its markers say
 * now. Channel 0 belongs to the log and is guarded by its lock; the others
 * belong to callers that serialise their own events (trace_channel). */
typedef struct trace_channel {
    trace_log *log;
    record *next; /* in cur->r */
    /* The fast path runs while next < stop: stop is the buffer's last slot
     * (which only the slow path fills), or 0 when the writer wants the
     * next event to look at the clock (see set_tick). */
    _Atomic uintptr_t stop;
    buffer *cur;
    uint64_t last_thread, last_stream, last_tick; /* no thread is ~0: the first event marks it */
    /* while timing precisely: the writer's tick when this channel's count
     * of finely timed events began, and that count */
    uint64_t fine_since_tick, fine_events;
    uint32_t id;
    bool closed; /* under the log's m: free for trace_log_channel_open */
} channel;

struct trace_log {
    bfc_lock lock; /* guards main */
    channel main;
    pthread_mutex_t m; /* guards everything below */
    trace_channel *channels[MAX_CHANNELS];
    size_t nchannels; /* channel ids 1..nchannels */
    pthread_cond_t filled, emptied;
    buffer *full[NBUFFERS];
    size_t full_head, nfull;
    buffer *spare[NBUFFERS];
    size_t nspare;
    bool stop, writing;
    buffer bufs[NBUFFERS];
    int fd;    /* the CSV; raw descriptors: no stdio buffer a forked child could flush twice */
    int spool; /* binary records not yet made into CSV */
    off_t spooled, converted;
    pthread_t writer;
    decode_state dec[MAX_CHANNELS + 1]; /* under m: the CSV writer's, per channel */
    decode_state *decoding;             /* the channel being decoded */
    uint64_t start_us;           /* the clock when the log opened */
    _Atomic uint64_t tick;       /* microseconds since start, the coarse clock's last reading */
    /* Few events: each reads the fine clock. */
    atomic_bool precise;
    /* under m: buffers handed over so far, and the writer's view of the
     * rate: when it last looked, and the hand-overs it saw then */
    uint64_t handovers, handovers_seen, looked_us;
    /* The errno of the first write that failed (a full disk), or 0: the
     * trace is then incomplete, and trace_log_flush says so to a caller
     * who can tell the user (the writes themselves go on failing quietly:
     * the program must not). */
    atomic_int write_error;
};

/* How often the writer reads the clock for the allocating threads: the
 * coarse clock's own resolution, so nothing is lost by not asking it on
 * every event (which cost 6 ns, a sixth of an allocation). */
enum { TICK_US = 4000 };
/* The fine clock per event while fewer events than this come in a tick;
 * back to it once no buffer filled in QUIET_US (under 41,000 a second). */
enum { PRECISE_MAX_PER_TICK = 250, QUIET_US = 100000 };

/* CLOCK_REALTIME_COARSE (the writer's tick) or CLOCK_REALTIME (an event's
 * own time), in microseconds. */
static uint64_t clock_us(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Initial-exec: the preloaded library has static TLS, and the default model
 * would call __tls_get_addr on every event. */
static _Thread_local uint32_t my_tid __attribute__((tls_model("initial-exec")));
/* (the first event of a log always writes a thread marker: no thread is 0) */

static uint32_t thread_id(void)
{
    if (!my_tid)
        my_tid = (uint32_t)syscall(SYS_gettid);
    return my_tid;
}

/* Disk full or closed: the trace is lost, the program is not. The first
 * failure is kept in *error for trace_log_flush to report. */
static void write_all(int fd, const char *p, size_t n, atomic_int *error)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int expected = 0;
            atomic_compare_exchange_strong(error, &expected, w < 0 ? errno : EIO);
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static void write_csv(int fd, atomic_int *error, uint64_t start_us, decode_state *dec, decode_state **current,
                      const record *recs, size_t count)
{
    decode_state *d = *current;
    static const char *const names[] = {"allocate", "free", "allocate failure"};
    enum { CHUNK = 1 << 16, LINE = 128 };
    char *out = malloc(CHUNK);
    if (!out)
        return;
    size_t used = 0;
    for (size_t i = 0; i < count; i++) {
        const record *r = &recs[i];
        unsigned action = (unsigned)(r->word & 3);
        if (action == MARK) {
            switch (r->word >> 2) {
            case MARK_THREAD: d->thread = r->value; break;
            case MARK_STREAM: d->stream = r->value; break;
            case MARK_TICK: d->tick = r->value; break;
            case MARK_POINTER: d->pointer = r->value, d->have_pointer = true; break;
            case MARK_CHANNEL:
                if (r->value <= MAX_CHANNELS)
                    d = *current = &dec[r->value];
                break;
            }
            continue;
        }
        uint64_t ptr = d->have_pointer ? d->pointer : r->word & ~(uint64_t)3;
        d->have_pointer = false;
        uint64_t us = start_us + d->tick;
        uint32_t day = (uint32_t)(us / 1000000u % 86400u);
        int n = snprintf(out + used, CHUNK - used, "%llu,%02u:%02u:%02u:%06u,%s,0x%llx,%llu,%llu\n",
                         (unsigned long long)d->thread, day / 3600, day / 60 % 60, day % 60,
                         (unsigned)(us % 1000000u), names[action], (unsigned long long)ptr,
                         (unsigned long long)r->value, (unsigned long long)d->stream);
        if (n > 0)
            used += (size_t)n;
        if (used > CHUNK - LINE) {
            write_all(fd, out, used, error);
            used = 0;
        }
    }
    write_all(fd, out, used, error);
    free(out);
}

static record *last_slot(const channel *c)
{
    return c->cur->r + BUFFER_EVENTS - 1;
}

/* Makes b the channel's buffer to fill. */
static void channel_take(channel *c, buffer *b)
{
    b->channel = c->id;
    c->cur = b;
    c->next = b->r;
    atomic_store_explicit(&c->stop, (uintptr_t)last_slot(c), memory_order_relaxed);
}

/*
 * Back to precise timing (each event reads the fine clock) once a whole
 * QUIET_US passed without a buffer filling; a channel leaves it itself, at
 * its PRECISE_MAX_PER_TICK-th event within one of the writer's ticks (not
 * the writer: it may not run for a while, and every event would pay for
 * the clock meanwhile). t->m is held.
 */
static void choose_timing(trace_log *t, uint64_t now)
{
    if (atomic_load_explicit(&t->precise, memory_order_relaxed)) {
        t->handovers_seen = t->handovers;
        t->looked_us = now;
    } else if (now - t->looked_us >= QUIET_US) {
        if (t->handovers == t->handovers_seen)
            atomic_store_explicit(&t->precise, true, memory_order_relaxed);
        t->handovers_seen = t->handovers;
        t->looked_us = now;
    }
}

/*
 * Reads the coarse clock for everyone. When it moves on, every channel's
 * next event is sent down the slow path, which writes the new time: the
 * event path itself never looks at the clock (one load and compare fewer
 * per event). A channel's slow path racing this store can undo it; its
 * events then show the old time until the next tick, so times are at
 * worst one tick early. t->m is held (it guards the channel list).
 */
static void set_tick(trace_log *t)
{
    uint64_t now = clock_us(CLOCK_REALTIME_COARSE) - t->start_us;
    if (now == atomic_load_explicit(&t->tick, memory_order_relaxed))
        return;
    choose_timing(t, now);
    atomic_store_explicit(&t->tick, now, memory_order_relaxed);
    atomic_store_explicit(&t->main.stop, 0, memory_order_relaxed);
    for (size_t i = 0; i < t->nchannels; i++)
        atomic_store_explicit(&t->channels[i]->stop, 0, memory_order_relaxed);
}

static void *writer_main(void *arg)
{
    trace_log *t = arg;
    pthread_mutex_lock(&t->m);
    for (;;) {
        while (!t->nfull && !t->stop) {
            set_tick(t);
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += TICK_US * 1000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&t->filled, &t->m, &until);
        }
        set_tick(t);
        if (!t->nfull)
            break;
        buffer *b = t->full[t->full_head];
        t->full_head = (t->full_head + 1) % NBUFFERS;
        t->nfull--;
        t->writing = true;
        pthread_mutex_unlock(&t->m);
        record tag = {(uint64_t)MARK_CHANNEL << 2 | MARK, b->channel};
        write_all(t->spool, (const char *)&tag, sizeof tag, &t->write_error);
        write_all(t->spool, (const char *)b->r, b->n * sizeof(record), &t->write_error);
        pthread_mutex_lock(&t->m);
        t->spooled += (off_t)((b->n + 1) * sizeof(record));
        b->n = 0;
        t->spare[t->nspare++] = b;
        t->writing = false;
        pthread_cond_broadcast(&t->emptied);
    }
    pthread_mutex_unlock(&t->m);
    return NULL;
}

trace_log *trace_log_open(const char *path)
{
    trace_log *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->fd = t->spool = -1;
    /* Touched now, at open: a first touch on the allocation path costs a page
     * fault every hundred events (5 MB in all). */
    for (int i = 0; i < NBUFFERS; i++)
        if (!(t->bufs[i].r = calloc(BUFFER_EVENTS, sizeof(record))))
            goto fail;
        else
            memset(t->bufs[i].r, 0, BUFFER_EVENTS * sizeof(record));
    /* Neither file is opened through a link another user could have
     * planted (out_file.h): the CSV is refused if it is one, and the
     * spool is a new file of a random name (it was PATH.spool). */
    t->fd = out_file_open(path, O_TRUNC);
    if (t->fd < 0)
        goto fail;
    static const char header[] = "Thread,Time,Action,Pointer,Size,Stream\n";
    /* A file that cannot take the header (a full disk, /dev/full) is
     * refused now, while the caller can still say so, rather than left
     * holding a trace that is never written. */
    write_all(t->fd, header, sizeof header - 1, &t->write_error);
    if (atomic_load(&t->write_error)) {
        errno = atomic_load(&t->write_error);
        goto fail;
    }
    size_t plen = strlen(path) + 16;
    char *spool_path = malloc(plen);
    if (!spool_path)
        goto fail;
    t->spool = out_file_temp(path, ".spool", 0600, spool_path, plen);
    if (t->spool >= 0)
        unlink(spool_path); /* nothing to clean up, however the process ends */
    free(spool_path);
    if (t->spool < 0)
        goto fail;
    bfc_lock_init(&t->lock);
    pthread_mutex_init(&t->m, NULL);
    pthread_cond_init(&t->filled, NULL);
    pthread_cond_init(&t->emptied, NULL);
    t->main.log = t;
    t->main.last_thread = ~(uint64_t)0;
    channel_take(&t->main, &t->bufs[0]);
    t->decoding = &t->dec[0];
    t->start_us = clock_us(CLOCK_REALTIME_COARSE);
    atomic_init(&t->tick, 0);
    atomic_init(&t->precise, true); /* a program starts slowly */
    for (int i = 1; i < NBUFFERS; i++)
        t->spare[t->nspare++] = &t->bufs[i];
    if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
        errno = EAGAIN;
        goto fail;
    }
    return t;
fail:;
    int e = errno;
    if (t->fd >= 0)
        close(t->fd);
    if (t->spool >= 0)
        close(t->spool);
    for (int i = 0; i < NBUFFERS; i++)
        free(t->bufs[i].r);
    free(t);
    errno = e;
    return NULL;
}

/*
 * Hands the channel's (full or partial) buffer to the writer and gives the
 * channel a spare one. The writer is woken only when half the buffers wait
 * (or none is spare): it drains the queue every tick anyway, and waking it
 * per buffer cost the allocating thread a futex call and an inter-processor
 * interrupt each time (+7% per operation in the replay benchmark). The
 * channel's owner serialises the call.
 */
static __attribute__((noinline)) void hand_over(channel *c)
{
    trace_log *t = c->log;
    buffer *b = c->cur;
    b->n = (size_t)(c->next - b->r);
    pthread_mutex_lock(&t->m);
    t->full[(t->full_head + t->nfull) % NBUFFERS] = b;
    t->nfull++;
    t->handovers++;
    if (t->nfull >= NBUFFERS / 2 || !t->nspare)
        pthread_cond_signal(&t->filled);
    while (!t->nspare)
        pthread_cond_wait(&t->emptied, &t->m);
    channel_take(c, t->spare[--t->nspare]);
    pthread_mutex_unlock(&t->m);
}

/* Appends one record, handing the buffer over when that fills it. */
static void put(channel *c, uint64_t word, uint64_t value)
{
    *c->next++ = (record){word, value};
    if (c->next > last_slot(c))
        hand_over(c);
}

static void mark(channel *c, uint64_t *last, unsigned kind, uint64_t value)
{
    if (*last != value) {
        put(c, (uint64_t)kind << 2 | MARK, value);
        *last = value;
    }
}

/* Whatever the fast path does not: markers, odd pointers, a full buffer. */
static __attribute__((noinline, cold)) void channel_event_slow(channel *c, rec_action action,
                                                               uint64_t ptr, uint64_t size,
                                                               uint64_t stream)
{
    trace_log *t = c->log;
    const bool precise = atomic_load_explicit(&t->precise, memory_order_relaxed);
    uint64_t now;
    if (precise) {
        now = clock_us(CLOCK_REALTIME) - t->start_us;
        const uint64_t tick = atomic_load_explicit(&t->tick, memory_order_relaxed);
        if (tick != c->fine_since_tick) {
            c->fine_since_tick = tick;
            c->fine_events = 0;
        }
        if (++c->fine_events > PRECISE_MAX_PER_TICK)
            atomic_store_explicit(&t->precise, false, memory_order_relaxed);
    } else {
        /* Re-armed before the clock is read, so that a tick after the read
         * sends the next event here again. */
        atomic_store_explicit(&c->stop, (uintptr_t)last_slot(c), memory_order_relaxed);
        now = atomic_load_explicit(&t->tick, memory_order_relaxed);
    }
    if (now < c->last_tick)
        now = c->last_tick; /* the coarse clock lags the fine one: never backwards */
    mark(c, &c->last_thread, MARK_THREAD, thread_id());
    mark(c, &c->last_stream, MARK_STREAM, stream);
    mark(c, &c->last_tick, MARK_TICK, now);
    if (ptr & 3) { /* its own marker, just before its event */
        put(c, (uint64_t)MARK_POINTER << 2 | MARK, ptr);
        ptr = 0;
    }
    put(c, ptr | (uint64_t)action, size);
    if (precise) /* every event here, to read the clock (after put: a new buffer re-arms) */
        atomic_store_explicit(&c->stop, 0, memory_order_relaxed);
}

/*
 * The allocating thread's whole cost when nothing changed since the
 * previous event (same thread and stream, no new tick, an aligned pointer,
 * room in the buffer): four compares and one 16-byte store. Everything
 * else is out of line, so this inlines into the caller without spilling
 * registers (inlined whole, the old path cost 48 instructions, a dozen of
 * them saves and restores).
 */
static inline void channel_event(channel *c, rec_action action, uint64_t ptr, uint64_t size,
                                 uint64_t stream)
{
    record *r = c->next;
    if (__builtin_expect(my_tid == c->last_thread && stream == c->last_stream && !(ptr & 3) &&
                             (uintptr_t)r < atomic_load_explicit(&c->stop, memory_order_relaxed),
                         1)) {
        *r = (record){ptr | (uint64_t)action, size};
        c->next = r + 1;
        return;
    }
    channel_event_slow(c, action, ptr, size, stream);
}

void trace_log_event(trace_log *t, rec_action action, uint64_t ptr, uint64_t size,
                     uint64_t stream)
{
    bfc_lock_acquire(&t->lock);
    channel_event(&t->main, action, ptr, size, stream);
    bfc_lock_release(&t->lock);
}

trace_channel *trace_log_channel_open(trace_log *t)
{
    pthread_mutex_lock(&t->m);
    for (size_t i = 0; i < t->nchannels; i++) {
        channel *old = t->channels[i];
        if (old->closed) { /* its markers still match what its decoder holds */
            old->closed = false;
            pthread_mutex_unlock(&t->m);
            return old;
        }
    }
    trace_channel *c = t->nchannels < MAX_CHANNELS && t->nspare ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        pthread_mutex_unlock(&t->m);
        return NULL;
    }
    c->log = t;
    c->id = (uint32_t)++t->nchannels;
    c->last_thread = ~(uint64_t)0;
    channel_take(c, t->spare[--t->nspare]);
    t->channels[c->id - 1] = c;
    pthread_mutex_unlock(&t->m);
    return c;
}

void trace_channel_event(trace_channel *c, rec_action action, uint64_t ptr, uint64_t size,
                         uint64_t stream)
{
    channel_event(c, action, ptr, size, stream);
}

void trace_channel_flush(trace_channel *c)
{
    if (c->next != c->cur->r)
        hand_over(c);
}

void trace_channel_close(trace_channel *c)
{
    trace_channel_flush(c);
    pthread_mutex_lock(&c->log->m);
    c->closed = true;
    pthread_mutex_unlock(&c->log->m);
}

int trace_log_flush(trace_log *t)
{
    bfc_lock_acquire(&t->lock);
    if (t->main.next != t->main.cur->r)
        hand_over(&t->main);
    pthread_mutex_lock(&t->m);
    pthread_cond_signal(&t->filled); /* drain now, not at the next tick */
    while (t->nfull || t->writing)
        pthread_cond_wait(&t->emptied, &t->m);
    /* Everything recorded is in the spool: make it CSV. */
    enum { BATCH = 4096 };
    record *batch = malloc(BATCH * sizeof *batch);
    while (batch && t->converted < t->spooled) {
        size_t want = (size_t)(t->spooled - t->converted);
        if (want > BATCH * sizeof *batch)
            want = BATCH * sizeof *batch;
        ssize_t got = pread(t->spool, batch, want, t->converted);
        if (got <= 0) {
            int expected = 0;
            atomic_compare_exchange_strong(&t->write_error, &expected, got < 0 ? errno : EIO);
            break;
        }
        write_csv(t->fd, &t->write_error, t->start_us, t->dec, &t->decoding, batch,
                  (size_t)got / sizeof *batch);
        t->converted += got;
    }
    free(batch);
    pthread_mutex_unlock(&t->m);
    bfc_lock_release(&t->lock);
    return atomic_load(&t->write_error);
}

int trace_log_close(trace_log *t)
{
    if (!t)
        return 0;
    int error = trace_log_flush(t);
    pthread_mutex_lock(&t->m);
    t->stop = true;
    pthread_cond_signal(&t->filled);
    pthread_mutex_unlock(&t->m);
    pthread_join(t->writer, NULL);
    if (close(t->fd) != 0 && !error && errno != EINTR)
        error = errno; /* a file system that writes at close (NFS) */
    close(t->spool);
    for (size_t i = 0; i < t->nchannels; i++)
        free(t->channels[i]);
    for (int i = 0; i < NBUFFERS; i++)
        free(t->bufs[i].r);
    pthread_mutex_destroy(&t->m);
    pthread_cond_destroy(&t->filled);
    pthread_cond_destroy(&t->emptied);
    free(t);
    return error;
}
