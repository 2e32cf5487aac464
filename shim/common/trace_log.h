/*
 * trace_log.h - records allocation events as RMM logging CSV
 * (Thread,Time,Action,Pointer,Size,Stream), the format `bfcshim replay`
 * reads, without slowing the allocation path.
 *
 * The caller's side only appends a 16-byte binary record to its buffer
 * (four compares and a store when its thread and stream are the previous
 * event's and no 4 ms tick has passed). Full buffers go to a writer thread, which spools them
 * to disk; the CSV is made from the spool when the log is flushed (at exit,
 * on OOM, on request), so formatting never runs on the allocating thread.
 * Times are to the microsecond while events are few (under 250 in a 4 ms
 * tick: each reads the clock itself), and to the coarse clock's 4 ms while
 * they come faster (the writer thread reads it once a tick for everyone;
 * an event racing the tick may show the one before), so a recording costs a
 * busy allocator no clock read per event; replay uses the order of events,
 * not their times.
 */
#ifndef BFCSHIM_COMMON_TRACE_LOG_H
#define BFCSHIM_COMMON_TRACE_LOG_H

#include <stdbool.h>
#include <stdint.h>

typedef struct trace_log trace_log;

/* The engine's bfc_event values, so that an on_event hook passes its event
 * on as it is (trace_log.c asserts that they agree). */
typedef enum rec_action {
    REC_ALLOCATE,
    REC_FREE,
    REC_ALLOCATE_FAILURE,
} rec_action;

/* Opens (truncates) path and writes the header; NULL with errno on failure,
 * ELOOP when path is a symbolic link (never followed: out_file.h), ENOSPC
 * (or another write's errno) when the header cannot be written. */
trace_log *trace_log_open(const char *path);
/* Appends one event. Thread-safe. */
void trace_log_event(trace_log *t, rec_action action, uint64_t ptr, uint64_t size,
                     uint64_t stream);
/* Writes everything recorded so far to the file, as CSV. Not for the hot
 * path: it formats every event since the last flush. Returns 0, or the
 * errno of the first write since the log opened that failed (a full disk):
 * the file then misses events, and the caller should say so. */
int trace_log_flush(trace_log *t);
/* Flushes, stops the writer and closes the file; returns as
 * trace_log_flush (a failed close too). */
int trace_log_close(trace_log *t);
/*
 * A channel records without the log's lock, for a producer that already
 * serialises its own events (the engine calls its on_event hook under its
 * pool's lock): no second atomic instruction per event, and the events keep
 * exactly the producer's order. Up to 8 channels open at once per log; NULL
 * when no more can be had. Flushing a channel (handing its partial buffer to the writer)
 * must also happen under the producer's serialisation, before
 * trace_log_flush. Channels are freed with the log.
 */
typedef struct trace_channel trace_channel;
trace_channel *trace_log_channel_open(trace_log *t);
void trace_channel_event(trace_channel *c, rec_action action, uint64_t ptr, uint64_t size,
                         uint64_t stream);
void trace_channel_flush(trace_channel *c);
/* The producer is done (a pool that died with its context): its events go
 * to the writer and the channel may be opened again for another producer,
 * so a program that makes and destroys contexts one after another is
 * recorded whole. Under the producer's serialisation, as its events were. */
void trace_channel_close(trace_channel *c);

#endif
