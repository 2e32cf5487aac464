/*
 * dlsym_hook.c - where the exported dlsym sends each lookup.
 *
 * XLA, TensorFlow, Numba and cudart itself find the driver with
 * dlsym(handle_of_libcuda, "cu...") (and cudart with "cuGetProcAddress_v2"),
 * which a preloaded symbol never sees. So we export dlsym. Lessons from
 * others' breakage (docs/design.md):
 *   - dlsym(RTLD_NEXT, ...) is relative to its *caller*: a C wrapper that
 *     calls the real dlsym becomes the caller and breaks it. The exported
 *     dlsym is an assembly trampoline (dlsym_*.S) that asks
 *     bfcshim_dlsym_target where to go and then *jumps* there, so the real
 *     dlsym sees the original return address.
 *   - only names of the form cu[A-Z]... are ours to look at (matching "cu"
 *     alone caught cudnnCreate elsewhere); everything else goes straight on;
 *   - only lookups on an explicit handle are ours (a libcuda handle searches
 *     only libcuda's tree, where our exports are not). RTLD_DEFAULT already
 *     finds our exported doors first (preloaded objects come first), and
 *     RTLD_NEXT must search after the *caller*: another interposer stacked
 *     after us asks it for the function it wraps, and answered from here it
 *     would get its own function back and recurse. Both go straight on;
 *   - lookups made by libcuda itself go straight on (its own internal dlsym
 *     once recursed through an interposer);
 *   - nothing heavy happens here: no locks beyond glibc's, no CUDA calls.
 *   - sanitizer runtimes look up the functions they intercept with dlsym
 *     while they start, before their shadow memory exists: this path is
 *     built without sanitizer instrumentation (UNINSTRUMENTED) and copies
 *     no memory through intercepted functions;
 *   - glibc 2.34 moved dlsym to GLIBC_2.34; the real one is found with
 *     dlvsym at that version, then at the architecture's base version. Our
 *     own definition is unversioned, which binds to references of either.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"
#include "hooks.h"

typedef void *(*dlsym_fn)(void *, const char *);

#if defined(__clang__) || __GNUC__ >= 8
#define UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined", "thread")))
#else
#define UNINSTRUMENTED
#endif

/* POSIX guarantees that a dlsym result converts to a function pointer. */
typedef union {
    void *data;
    dlsym_fn fn;
} dlsym_pun;
static _Atomic(dlsym_fn) real_fn;

UNINSTRUMENTED static dlsym_fn find_real_dlsym(void)
{
    dlsym_fn f = atomic_load_explicit(&real_fn, memory_order_acquire);
    if (f)
        return f;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !f; i++)
        f = ((dlsym_pun){.data = dlvsym(RTLD_NEXT, "dlsym", versions[i])}).fn;
    if (!f)
        abort(); /* no dlsym at all: nothing could work */
    atomic_store_explicit(&real_fn, f, memory_order_release);
    return f;
}

void *real_dlsym(void *handle, const char *symbol)
{
    return find_real_dlsym()(handle, symbol);
}

UNINSTRUMENTED static bool driver_symbol(const char *s)
{
    return s && s[0] == 'c' && s[1] == 'u' && s[2] >= 'A' && s[2] <= 'Z';
}

static bool called_from_libcuda(void *caller)
{
    Dl_info info;
    if (!caller || !dladdr(caller, &info) || !info.dli_fname)
        return false;
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    return strncmp(base, "libcuda.so", 10) == 0;
}

/* A driver symbol: the real one, or our door in its place. */
static void *dlsym_driver(void *handle, const char *symbol)
{
    void *real = real_dlsym(handle, symbol);
    if (!real || !shim_driver_hooked())
        return real;
    void *ours = hook_by_name(symbol);
    return ours ? ours : real;
}

/* Called by the trampoline with dlsym's arguments and its caller's return
 * address; returns the function the trampoline jumps to with the original
 * arguments. Hidden: only the trampoline calls it. */
__attribute__((visibility("hidden"))) void *bfcshim_dlsym_target(void *handle,
                                                                 const char *symbol,
                                                                 void *caller);
UNINSTRUMENTED void *bfcshim_dlsym_target(void *handle, const char *symbol, void *caller)
{
    dlsym_pun real = {.fn = find_real_dlsym()};
    if (!driver_symbol(symbol) || handle == RTLD_NEXT || handle == RTLD_DEFAULT ||
        called_from_libcuda(caller))
        return real.data;
    return (void *)dlsym_driver;
}
