/*
 * e2e_nvml_probe.c - a program that asks NVML about the machine's GPUs the
 * way frameworks do before they use one (JAX opens libnvidia-ml.so.1 and
 * sees no GPU if nvmlInit_v2 fails): which NVML the loader gives a program
 * is what `bfcshim run --fake-gpu` must get right (tests/cli/test_run_ab.py).
 * Prints "nvml init R count R N" (NVML's return codes, the device count);
 * "nvml absent" when no libnvidia-ml.so.1 is found. Exits 0 either way.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("nvml absent\n");
        return 0;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    int (*shutdown)(void) = (int (*)(void))dlsym(h, "nvmlShutdown");
    if (!init || !count || !shutdown) {
        printf("nvml incomplete\n");
        return 0;
    }
    unsigned n = 0;
    int ri = init(), rc = ri == 0 ? count(&n) : -1;
    printf("nvml init %d count %d %u\n", ri, rc, n);
    if (ri == 0)
        shutdown();
    return 0;
}
