/*
 * streams.c - the streams this process has created and not destroyed, with
 * their context and blocking flag.
 *
 * Why: a plain cudaFree promises that no work on *any* stream still uses the
 * block. To fence that without synchronising the device, the shim records an
 * event on the legacy stream (which waits for every blocking stream) and on
 * every non-blocking stream; this registry is how it knows them. Streams are
 * registered by the create and destroy calls of both doors, so it is
 * complete from the moment the library is loaded (preloading guarantees it).
 *
 * A context that goes away (destroyed, reset, last primary release) takes
 * its streams with it: their handles are dead, and the real driver crashes
 * on a dead stream handle (seen on an H100 after cudaDeviceReset). A new
 * context may even get the old one's handle value, so the entries go the
 * moment the context does (streams_forget_context).
 *
 * A copy of the registry (streams_of_context) is used outside its lock: a
 * plain free's fence records an event on each stream. Another thread may
 * destroy one of those streams meanwhile, and an event recorded on a
 * destroyed stream is a call on a dead handle. So copies are used under a
 * read lock (streams_use_begin/end), and a stream leaving the registry waits
 * for the users of copies that may hold it before the real destroy goes on.
 * The same lock keeps a capture from beginning between a seal's question
 * "does this stream capture?" and its event on the stream, and between a
 * fence event query's choice of capture mode and the query (capture.c).
 */
#include <dlfcn.h>
#include <stdlib.h>

#include "array_room.h"
#include "shim.h"


typedef struct entry {
    CUstream stream;
    CUcontext ctx;
    unsigned long long ctx_id; /* with the driver door closed (else 0: unknown) */
    bool non_blocking;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_rwlock_t use_lock = PTHREAD_RWLOCK_INITIALIZER;
static entry *all;
static size_t nall, capall;

/* The handles of the last GRAVES streams destroyed, until a new stream gets
 * the same handle: a stream-ordered call naming one is refused without the
 * dead handle reaching the driver (streams_dead). Only handles seen to die
 * are refused: a handle merely unknown may be a live stream made where the
 * library does not look, and refusing it would break a correct program (nor
 * is any refused with the driver door closed, where creations go unseen).
 * A stream is buried as it leaves the registry, before the real destroy:
 * once the driver has destroyed it, another thread's new stream may get its
 * handle at once, and that stream's registration must come after the
 * burial to undo it (buried after the destroy, a live stream was refused
 * for good: e2e_fences dead-stream-reborn-in-window). A destroy the driver
 * refuses unburies it (streams_destroy_refused). Streams that go with their
 * context are not buried: that destroy may be refused after they left the
 * registry (a green context's converted context, e2e_green green-async).
 * Written under the lock, read without it: a program that hands a new
 * stream to another thread orders its creation (and the unbury) before that
 * thread's use. Every stream-ordered call on an explicit stream asks, so a
 * 64-bit filter (a bit per hash of each buried handle) answers most live
 * handles with one load, the common case (no stream ever destroyed)
 * included; the slots are scanned only on a hit. */
#define GRAVES 64
static _Atomic(CUstream) graves[GRAVES];
static size_t next_grave;
static atomic_uint_fast64_t grave_bits;

/* The contexts of the last OBITUARIES streams destroyed (more than the
 * graves: only a stream-ordered free of the C interface on a handle the
 * registry does not know asks, rarely, and scans them), until a new stream
 * gets the same handle; under the lock. A free on a destroyed stream of its
 * block's context is covered by that context's plain fence (the stream's
 * stand-in is in the block's pool); one of another context is not
 * (streams_dead_context, api.c). */
#define OBITUARIES 1024
static struct obituary {
    CUstream s;
    CUcontext ctx;
} obituaries[OBITUARIES];
static size_t next_obituary;

static uint64_t grave_bit(CUstream s)
{
    uint64_t h = (uint64_t)(uintptr_t)s;
    h ^= h >> 29; /* handles are heap addresses: mix the high bits in */
    h *= 0x9e3779b97f4a7c15ull;
    return 1ull << (h >> 58);
}

/* Lock held: the filter again from the slots (after one changed). */
static void refilter(void)
{
    uint64_t bits = 0;
    for (size_t i = 0; i < GRAVES; i++) {
        CUstream g = atomic_load_explicit(&graves[i], memory_order_relaxed);
        if (g)
            bits |= grave_bit(g);
    }
    atomic_store_explicit(&grave_bits, bits, memory_order_release);
}

/* Lock held. ctx: its context, as registered (NULL: it was not). */
static void bury(CUstream s, CUcontext ctx)
{
    atomic_store_explicit(&graves[next_grave], s, memory_order_relaxed);
    next_grave = (next_grave + 1) % GRAVES;
    refilter();
    obituaries[next_obituary] = (struct obituary){s, ctx};
    next_obituary = (next_obituary + 1) % OBITUARIES;
}

/* Lock held: s names a live stream again. */
static void unbury(CUstream s)
{
    for (size_t i = 0; i < OBITUARIES; i++)
        if (obituaries[i].s == s)
            obituaries[i] = (struct obituary){NULL, NULL};
    if (!(atomic_load_explicit(&grave_bits, memory_order_relaxed) & grave_bit(s)))
        return;
    for (size_t i = 0; i < GRAVES; i++)
        if (atomic_load_explicit(&graves[i], memory_order_relaxed) == s)
            atomic_store_explicit(&graves[i], NULL, memory_order_relaxed);
    refilter();
}

/* How many times the calling thread holds use_lock (in either mode): a
 * thread that holds it never asks for it again (streams_use_enter). A read
 * lock asked for again may wait for good behind a waiting writer (POSIX
 * allows writer preference), and a read lock under one's own write lock
 * never comes. */
static _Thread_local unsigned held __attribute__((tls_model("initial-exec")));

/* Fork: the registry's mutex is held across it (a child that keeps the
 * shim inherits a whole registry), never the use lock. That one is held
 * around waits for the GPU (the immediate policy's cuCtxSynchronize before
 * memory goes back, a barrier's cuEventSynchronize), and queued work that
 * forks (a host function, on the driver's thread while this one waits, or
 * in the waiting thread itself) would wait in the fork handler for ever
 * (e2e_driver fork-in-sync). The mutex is never held across a driver call. */
void streams_lock_for_fork(bool hold)
{
    if (hold)
        pthread_mutex_lock(&lock);
    else
        pthread_mutex_unlock(&lock);
}

/* The child has none of the parent's other threads, so none of their
 * copies of the registry: the use lock starts free, but for the forking
 * thread's own hold (forked from inside a section), which it will end. */
void streams_use_after_fork_child(void)
{
    pthread_rwlock_init(&use_lock, NULL);
    if (held)
        pthread_rwlock_rdlock(&use_lock);
}

void streams_use_begin(void)
{
    pthread_rwlock_rdlock(&use_lock);
    held++;
}

void streams_use_end(void)
{
    held--;
    pthread_rwlock_unlock(&use_lock);
}

void streams_change_begin(void)
{
    pthread_rwlock_wrlock(&use_lock);
    held++;
}

void streams_change_end(void)
{
    held--;
    pthread_rwlock_unlock(&use_lock);
}

bool streams_use_enter(void)
{
    if (held)
        return false;
    streams_use_begin();
    return true;
}

void streams_use_leave(bool took)
{
    if (took)
        streams_use_end();
}

/* Waits until no copy taken before now is in use. */
static void wait_for_users(void)
{
    streams_change_begin();
    streams_change_end();
}

CUresult streams_add(CUstream s)
{
    const real_driver *R = real_driver_get();
    if (!R || !s)
        return CUDA_SUCCESS;
    CUcontext ctx = NULL;
    unsigned flags = 0;
    if (!R->StreamGetCtx || R->StreamGetCtx(s, &ctx) != CUDA_SUCCESS)
        R->CtxGetCurrent(&ctx);
    /* Flags unknown: counted as non-blocking, whose fences ask the most. */
    if (!R->StreamGetFlags || R->StreamGetFlags(s, &flags) != CUDA_SUCCESS)
        flags = CU_STREAM_NON_BLOCKING;
    /* With the driver door closed a context torn down through a driver
     * function found with dlsym goes unseen, and its streams would stay
     * registered under a handle a new context may have: the context's id
     * tells them apart when the replacement is noticed
     * (streams_forget_context_id). One driver call per stream made, and
     * only there. A stream whose context's id the driver refuses is
     * refused in turn (destroyed; nothing is queued on it yet): registered
     * with id 0, "unknown", no sweep by id could take it out, and after an
     * unseen reset the new context's pool would seal on the dead handle
     * (e2e_fences unseen-reset-streams-id-fails); not registered, nothing
     * would cover its work. */
    unsigned long long id = 0;
    if (!shim_driver_hooked() && ctx && R->CtxGetId) {
        CUresult r = R->CtxGetId(ctx, &id);
        if (r != CUDA_SUCCESS) {
            shim_log(LOG_WARN, "a new stream's context id could not be had (the driver "
                               "answered %d): the stream is destroyed and its creation "
                               "refused",
                     (int)r);
            /* (an entry a missed destroy left under this handle goes too,
             * and what remembers the handle: it names no stream now) */
            streams_remove(s);
            remembered_pools_stale();
            R->StreamDestroy(s);
            return r;
        }
    }
    const entry e = {s, ctx, id, (flags & CU_STREAM_NON_BLOCKING) != 0};
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < nall && all[i].stream != s) /* a handle reused after a missed destroy */
        i++;
    entry *t = i < nall ? all : array_room(all, nall, &capall, sizeof *all, 32);
    unbury(s);
    if (t) {
        all = t;
        all[i] = e;
        if (i == nall)
            nall++;
    }
    pthread_mutex_unlock(&lock);
    if (!t)
        shim_log(LOG_WARN, "out of host memory tracking streams: cudaFree may reuse "
                           "memory before a non-blocking stream is done with it");
    /* Registered first (when there was room): a pool made meanwhile either
     * sees it or is found here (fences_ordered_begin). Not registered, it
     * ends the ordered state all the same. */
    CUresult r = e.non_blocking ? fences_ordered_stream_made(ctx, s) : CUDA_SUCCESS;
    remembered_pools_stale(); /* its handle may be a destroyed stream's */
    if (r != CUDA_SUCCESS) { /* (nothing queued on it yet) */
        streams_remove(s);
        R->StreamDestroy(s);
    }
    return r;
}

/* Which entries of context ctx a sweep takes out (forget_where). */
typedef enum { ANY_ID, THIS_ID, OTHER_KNOWN_ID } id_match;

/* Takes out of the registry the entries of context ctx whose id matches;
 * the caller waits for the copies in use (wait_for_users) where it can. */
static void forget_where(CUcontext ctx, id_match how, unsigned long long id)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nall;) {
        const entry *e = &all[i];
        bool match = e->ctx == ctx && (how == ANY_ID || (how == THIS_ID && e->ctx_id == id) ||
                                       (how == OTHER_KNOWN_ID && e->ctx_id && e->ctx_id != id));
        if (match)
            all[i] = all[--nall];
        else
            i++;
    }
    pthread_mutex_unlock(&lock);
}

void streams_forget_context(CUcontext ctx)
{
    forget_where(ctx, ANY_ID, 0);
    wait_for_users();
}

/* The streams of context ctx registered under its id `id` (a context the
 * library saw go only now, by its id: pools_forget_if_replaced), as
 * streams_forget_context; a stream whose context's id is unknown stays (its
 * seals may then touch a dead handle, as before, but a live stream of the
 * new context under the same handle is never left out of a fence). */
void streams_forget_context_id(CUcontext ctx, unsigned long long id)
{
    if (!id)
        return;
    forget_where(ctx, THIS_ID, id);
    wait_for_users();
}

/* A pool is made for context ctx, whose id is `id`: a stream registered
 * under the same handle with another known id belongs to a context that
 * died unseen (the door closed) before any pool of its own could be noticed
 * replaced (pools_forget_if_replaced), and the new pool's seals must not
 * touch it (e2e_fences unseen-reset-streams-no-pool). Only the leaf lock:
 * no copy in use can hold such a stream for this pool, which has none yet,
 * and a pool is made where the caller may hold the use lock. */
void streams_forget_other_ids(CUcontext ctx, unsigned long long id)
{
    if (!id)
        return;
    forget_where(ctx, OTHER_KNOWN_ID, id);
}

void streams_remove(CUstream s)
{
    CUcontext ctx = NULL;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nall; i++)
        if (all[i].stream == s) {
            ctx = all[i].ctx;
            all[i] = all[--nall];
            break;
        }
    bury(s, ctx);
    pthread_mutex_unlock(&lock);
    remembered_pools_stale();
    wait_for_users();
}

size_t streams_of_context(CUcontext ctx, known_stream *out, size_t n)
{
    size_t k = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nall; i++)
        if (all[i].ctx == ctx) {
            if (k < n)
                out[k] = (known_stream){all[i].stream, all[i].non_blocking};
            k++;
        }
    pthread_mutex_unlock(&lock);
    return k;
}

/* Does the global scope's `name` lie in this library? */
static bool ours_in_global_scope(const char *name)
{
    void *global = real_dlsym(RTLD_DEFAULT, name);
    Dl_info found, here;
    return global && dladdr(global, &found) && dladdr((void *)&ours_in_global_scope, &here) &&
           found.dli_fbase == here.dli_fbase;
}

/*
 * Does the registry see every stream the program makes? Only when this
 * library interposes the CUDA entry points: preloaded (LD_PRELOAD, or
 * linked ahead of libcuda). Loaded as a plug-in (ctypes.CDLL with
 * RTLD_LOCAL, the Python package's way without LD_PRELOAD) its exports are
 * not in the global scope, so the program's cuStreamCreate goes straight to
 * the driver and the registry stays empty. The global scope's cuStreamCreate
 * and dlsym say which: ours when they are defined in this very library.
 * Compared by the object that holds them (dladdr), since a reference to our
 * own exported function from inside the library may itself bind to another
 * definition.
 */
bool streams_all_seen(void)
{
    static atomic_int seen = -1;
    int v = atomic_load_explicit(&seen, memory_order_relaxed);
    if (v < 0) {
        /* Both: the program's linked calls reach our cuStreamCreate, and
         * its dlsym (how XLA, Numba and cudart find the driver) is ours. A
         * copy opened with RTLD_GLOBAL before libcuda was loaded has the
         * first, not the second: libc's dlsym comes before it. */
        v = ours_in_global_scope("cuStreamCreate") && ours_in_global_scope("dlsym");
        atomic_store_explicit(&seen, v, memory_order_relaxed);
        if (!v)
            shim_log(LOG_INFO, "loaded without LD_PRELOAD: the program's streams are not "
                               "seen, so a plain free (bfcshim_free, the Numba plug-in) is "
                               "reused only after a synchronisation of its context");
    }
    return v;
}

bool streams_known(CUstream s)
{
    bool found = false;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nall && !found; i++)
        found = all[i].stream == s;
    pthread_mutex_unlock(&lock);
    return found;
}

void streams_destroy_refused(CUstream s)
{
    pthread_mutex_lock(&lock);
    unbury(s);
    pthread_mutex_unlock(&lock);
}

CUcontext streams_dead_context(CUstream s)
{
    CUcontext ctx = NULL;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; s && i < OBITUARIES && !ctx; i++)
        if (obituaries[i].s == s)
            ctx = obituaries[i].ctx;
    pthread_mutex_unlock(&lock);
    return ctx;
}

bool streams_dead(CUstream s)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
        !(atomic_load_explicit(&grave_bits, memory_order_acquire) & grave_bit(s)))
        return false;
    /* "Not made again since" needs every creation seen: with the driver
     * door closed, a stream made through a driver function found by dlsym
     * may get a buried handle unseen, and is live. */
    if (!shim_driver_hooked() || !streams_all_seen())
        return false;
    for (size_t i = 0; i < GRAVES; i++)
        if (atomic_load_explicit(&graves[i], memory_order_relaxed) == s)
            return true;
    return false;
}
