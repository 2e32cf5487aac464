/*
 * shim_step_calls - what the preloaded shim costs a training step that
 * makes no allocation: PyTorch's caching allocator in its steady state
 * (arm B of the GPU benchmarks: the shim under PyTorch's cache, which calls
 * cudaMalloc only while it warms up). Issue 53 asks for every interposed
 * call such a step makes, and what the shim does on each.
 *
 *   LD_PRELOAD=build/libbfcshim.so LD_LIBRARY_PATH=build/tests/fake_cuda \
 *     build/tests/shim_step_calls [--steps N] [--json]
 *
 * The step is a call mix of PyTorch's shape, not a recording: the kinds of
 * call a training step's host code makes through the runtime once its cache
 * holds every block (kernels, device guards, the cache's stream-use events,
 * one synchronous copy of the loss, the end-of-step synchronisation), in
 * counts of the order of a ResNet-50 step (mix[] below). Kernels go through
 * the fake's test control (the fake runtime has no cudaLaunchKernel); the
 * check below says whether the real names would reach the shim.
 *
 * It reports:
 *   - for each runtime function of a step, and each driver entry point the
 *     runtime reaches for them, whether the shim interposes it: the runtime
 *     name as the dynamic linker binds it (dlsym(RTLD_DEFAULT)), the driver
 *     name as cudart gets it (cuGetProcAddress_v2, which the shim also
 *     interposes), each looked up in the shim's file by dladdr;
 *   - the interposed calls a step makes (the mix's counts of the names
 *     interposed);
 *   - the driver calls a step makes by entry point, with the shim and
 *     without it (this program again, run with LD_PRELOAD removed), and
 *     their difference: the shim's own calls per step.
 * Exit status 0; 2 on bad use; 77 when the driver is not the fake.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <getopt.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "json_out.h"
#include "shim_calls.h"

extern char **environ;

/* One step's calls. Kernels: forward, backward and optimizer of a
 * ResNet-50-sized model; two device guards per operator; the cache's
 * stream-use events recorded and polled; the loss read back with a
 * synchronous copy; the step's end waits for the stream. */
enum {
    MIX_KERNELS = 800,
    MIX_GET_DEVICE = 1600,
    MIX_EVENTS = 16,
    MIX_CAPTURE_QUERIES = 4,
};

/* The runtime functions such a step calls, and the driver entry points
 * cudart reaches for them: the ones checked for interposition. */
static const char *const runtime_names[] = {
    "cudaLaunchKernel",       "cudaGetDevice",    "cudaSetDevice",
    "cudaEventRecord",        "cudaEventQuery",   "cudaStreamWaitEvent",
    "cudaStreamIsCapturing",  "cudaStreamGetCaptureInfo", "cudaMemcpyAsync",
    "cudaMemcpy",             "cudaStreamSynchronize",    "cudaStreamQuery",
    "cudaMalloc",             "cudaFree",
};
static const char *const driver_names[] = {
    "cuLaunchKernel",      "cuCtxGetCurrent",     "cuCtxSetCurrent",
    "cuCtxGetDevice",      "cuEventRecord",       "cuEventQuery",
    "cuStreamWaitEvent",   "cuStreamIsCapturing", "cuStreamGetCaptureInfo",
    "cuMemcpyDtoHAsync",   "cuMemcpy",            "cuStreamSynchronize",
    "cuStreamQuery",       "cuMemAlloc",          "cuMemFree",
};

static const char *shim_file;

static bool in_shim(const void *fn)
{
    Dl_info info;
    return fn && shim_file && dladdr(fn, &info) && info.dli_fname &&
           strcmp(info.dli_fname, shim_file) == 0;
}

static bool runtime_interposed(const char *name) { return in_shim(dlsym(RTLD_DEFAULT, name)); }

/* A driver entry point as cudart gets it: "yes" or "no"; one the fake does
 * not have is looked up in the shim's export list instead (whose driver
 * names are the ones cuGetProcAddress swaps for the shim's). */
static const char *driver_interposed(const char *name)
{
    typedef CUresult (*getproc)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);
    getproc get = (getproc)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    if (get && get(name, &fn, CUDA_VERSION, 0, &st) == CUDA_SUCCESS)
        return in_shim(fn) ? "yes" : "no";
    void *h = shim_file ? dlopen(shim_file, RTLD_NOW | RTLD_NOLOAD) : NULL;
    char v2[96];
    snprintf(v2, sizeof v2, "%s_v2", name);
    bool exported = h && (dlsym(h, name) || dlsym(h, v2));
    return exported ? "yes (export list; not in the fake)" : "no (export list; not in the fake)";
}

static void nothing(void *arg) { (void)arg; }

/* One step of the mix. */
static void step(const fakecuda_api *fake, cudaEvent_t *ev, cudaStream_t side, void *dev_loss)
{
    int dev = 0;
    enum cudaStreamCaptureStatus cs;
    for (int k = 0; k < MIX_KERNELS; k++) {
        cudaGetDevice(&dev);
        cudaGetDevice(&dev);
        fake->launch(NULL, nothing, NULL);
    }
    for (int k = 0; k < MIX_CAPTURE_QUERIES; k++)
        cudaStreamIsCapturing(NULL, &cs);
    for (int k = 0; k < MIX_EVENTS; k++) {
        cudaEventRecord(ev[k], NULL);
        cudaEventQuery(ev[k]);
    }
    cudaStreamWaitEvent(side, ev[0], 0);
    float loss;
    cudaMemcpy(&loss, dev_loss, sizeof loss, cudaMemcpyDeviceToHost);
    cudaStreamSynchronize(NULL);
}

/* The driver calls per step, by entry point: this process's (calls > 0). */
typedef struct per_step {
    char name[64];
    double calls;
} per_step;

static size_t measure(int steps, per_step *out, size_t cap)
{
    const fakecuda_api *fake = fakecuda();
    cudaFree(NULL);
    /* The cache warming up: the only allocations (and the shim's pool). */
    void *segment[4], *loss;
    for (int i = 0; i < 4; i++)
        cudaMalloc(&segment[i], (size_t)20 << 20);
    cudaMalloc(&loss, 512);
    cudaStream_t side;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEvent_t ev[MIX_EVENTS];
    for (int k = 0; k < MIX_EVENTS; k++)
        cudaEventCreateWithFlags(&ev[k], cudaEventDisableTiming);
    step(fake, ev, side, loss); /* one step unmeasured: everything made */
    static call_meter m;
    call_tally t = {{0}};
    call_meter_init(&m, fake);
    call_meter_start(&m);
    for (int s = 0; s < steps; s++)
        step(fake, ev, side, loss);
    call_meter_stop(&m);
    call_meter_add(&m, &t);
    size_t n = 0;
    for (size_t i = 0; i < m.nnames && n < cap; i++)
        if (t.n[i]) {
            snprintf(out[n].name, sizeof out[n].name, "%s", m.names[i]);
            out[n++].calls = (double)t.n[i] / steps;
        }
    return n;
}

/* This program again without the shim (LD_PRELOAD removed), its per-step
 * calls read back from its output ("name calls" lines). */
static size_t measure_bare(const char *self, int steps, per_step *out, size_t cap)
{
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **env = calloc(nenv + 1, sizeof *env);
    char nsteps[32];
    snprintf(nsteps, sizeof nsteps, "%d", steps);
    char *args[] = {(char *)self, "--bare", "--steps", nsteps, NULL};
    int fds[2];
    if (!env || pipe(fds) != 0) {
        fprintf(stderr, "shim_step_calls: out of resources\n");
        exit(1);
    }
    for (size_t i = 0, k = 0; i < nenv; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
            env[k++] = environ[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, env);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    free(env);
    FILE *f = fdopen(fds[0], "r");
    size_t n = 0;
    char name[64];
    double calls;
    while (rc == 0 && f && n < cap && fscanf(f, "%63s %lf", name, &calls) == 2) {
        snprintf(out[n].name, sizeof out[n].name, "%s", name);
        out[n++].calls = calls;
    }
    if (f)
        fclose(f);
    int status = 0;
    if (rc != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "shim_step_calls: the run without the shim failed\n");
        exit(1);
    }
    return n;
}

static double find(const per_step *v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].name, name) == 0)
            return v[i].calls;
    return 0;
}

/* How many calls of a runtime name one step makes. */
static int mix_count(const char *name)
{
    if (strcmp(name, "cudaLaunchKernel") == 0)
        return MIX_KERNELS;
    if (strcmp(name, "cudaGetDevice") == 0)
        return MIX_GET_DEVICE;
    if (strcmp(name, "cudaEventRecord") == 0 || strcmp(name, "cudaEventQuery") == 0)
        return MIX_EVENTS;
    if (strcmp(name, "cudaStreamIsCapturing") == 0)
        return MIX_CAPTURE_QUERIES;
    if (strcmp(name, "cudaStreamWaitEvent") == 0 || strcmp(name, "cudaMemcpy") == 0 ||
        strcmp(name, "cudaStreamSynchronize") == 0)
        return 1;
    return 0;
}

int main(int argc, char **argv)
{
    int steps = 20;
    bool json = false, bare = false;
    static const struct option longs[] = {
        {"steps", required_argument, 0, 's'},
        {"json", no_argument, 0, 'j'},
        {"bare", no_argument, 0, 'b'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        if (c == 's' && (steps = atoi(optarg)) > 0)
            continue;
        if (c == 'j' || c == 'b') {
            *(c == 'j' ? &json : &bare) = true;
            continue;
        }
        fprintf(stderr, "usage: shim_step_calls [--steps N] [--json]\n");
        return 2;
    }
    setenv("FAKECUDA_DEVICES", "1", 0);
    setenv("FAKECUDA_MEM", "40GiB", 0);
    static per_step with[CALLS_MAX], without[CALLS_MAX];
    if (bare) {
        size_t n = measure(steps, with, CALLS_MAX);
        for (size_t i = 0; i < n; i++)
            printf("%s %.6f\n", with[i].name, with[i].calls);
        return 0;
    }
    Dl_info info;
    void *api = dlsym(RTLD_DEFAULT, "bfcshim_stats_json");
    if (!api || !dladdr(api, &info)) {
        fprintf(stderr, "shim_step_calls: libbfcshim.so is not preloaded\n");
        return 2;
    }
    shim_file = info.dli_fname;
    size_t nwith = measure(steps, with, CALLS_MAX);
    size_t nwithout = measure_bare(argv[0], steps, without, CALLS_MAX);

    size_t nrt = sizeof runtime_names / sizeof *runtime_names;
    size_t ndrv = sizeof driver_names / sizeof *driver_names;
    long interposed_per_step = 0;
    for (size_t i = 0; i < nrt; i++)
        if (runtime_interposed(runtime_names[i]))
            interposed_per_step += mix_count(runtime_names[i]);
    double shim_total = 0, with_total = 0;
    for (size_t i = 0; i < nwith; i++) {
        with_total += with[i].calls;
        shim_total += with[i].calls - find(without, nwithout, with[i].name);
    }
    for (size_t i = 0; i < nwithout; i++)
        if (find(with, nwith, without[i].name) == 0)
            shim_total -= without[i].calls;

    if (json) {
        json_out j;
        json_begin(&j, stdout, false);
        json_object_open(&j, NULL);
        json_u64(&j, "steps", (uint64_t)steps);
        json_object_open(&j, "mix_per_step");
        for (size_t i = 0; i < nrt; i++)
            if (mix_count(runtime_names[i]))
                json_u64(&j, runtime_names[i], (uint64_t)mix_count(runtime_names[i]));
        json_object_close(&j);
        json_object_open(&j, "interposed");
        for (size_t i = 0; i < nrt; i++)
            json_bool(&j, runtime_names[i], runtime_interposed(runtime_names[i]));
        for (size_t i = 0; i < ndrv; i++)
            json_string(&j, driver_names[i], driver_interposed(driver_names[i]));
        json_object_close(&j);
        json_i64(&j, "interposed_calls_per_step", interposed_per_step);
        json_double(&j, "driver_calls_per_step", with_total);
        json_double(&j, "shim_driver_calls_per_step", shim_total);
        json_object_open(&j, "per_step_with_shim");
        for (size_t i = 0; i < nwith; i++)
            json_double(&j, with[i].name, with[i].calls);
        json_object_close(&j);
        json_object_open(&j, "per_step_without_shim");
        for (size_t i = 0; i < nwithout; i++)
            json_double(&j, without[i].name, without[i].calls);
        json_object_close(&j);
        json_object_close(&j);
        json_end(&j);
        return 0;
    }
    printf("shim_step_calls: %d steps of a PyTorch-shaped step with every block cached\n", steps);
    printf("interposed by the shim (runtime names as linked, driver names as cudart gets "
           "them):\n");
    for (size_t i = 0; i < nrt; i++)
        printf("  %-28s %-3s  %5d per step\n", runtime_names[i],
               runtime_interposed(runtime_names[i]) ? "yes" : "no", mix_count(runtime_names[i]));
    for (size_t i = 0; i < ndrv; i++)
        printf("  %-28s %s\n", driver_names[i], driver_interposed(driver_names[i]));
    printf("interposed calls per step: %ld\n", interposed_per_step);
    printf("driver calls per step, by entry point:    with the shim   without   the shim's\n");
    for (size_t i = 0; i < nwith; i++)
        printf("  %-40s %12.2f %9.2f %12.2f\n", with[i].name, with[i].calls,
               find(without, nwithout, with[i].name),
               with[i].calls - find(without, nwithout, with[i].name));
    printf("driver calls per step: %.2f; the shim's: %.2f\n", with_total, shim_total);
    return 0;
}
