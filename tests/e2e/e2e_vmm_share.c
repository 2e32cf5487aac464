/*
 * e2e_vmm_share.c - virtual memory shared between processes as NCCL shares
 * its cuMem buffers (and PyTorch its expandable segments with another
 * process): the allocation made with cuMemCreate asking for a
 * file-descriptor handle, mapped and filled; a handle retained from the
 * buffer's address (NCCL's user-buffer registration) exported with
 * cuMemExportToShareableHandle; the descriptor passed to a second process
 * over a unix socket (SCM_RIGHTS); there cuMemImportFromShareableHandle,
 * cuMemAddressReserve, cuMemMap, cuMemSetAccess. Both processes must see
 * the same bytes, each the other's writes, and the importer keeps the
 * memory after the exporter has unmapped and released it. Under the shim the
 * allocation is still the driver's own, made with the handle type asked
 * for (docs/design.md, "The virtual memory door"): the export must keep
 * working, the exporter's memory is lent the pool's limit (bytes_lent; or
 * counted as passthrough_vmm_bytes under BFCSHIM_VMM_DOOR=count) while it
 * lives, and the importer counts nothing (the memory is the exporter's).
 * Scenarios:
 *
 *   export    the exporter and importer, each a process of this program
 *             (the importer is this program run again as `importer`, the
 *             socket's descriptor in E2E_SHARE_SOCKET); export-shim runs it
 *             under the shim, export-shim-count under BFCSHIM_VMM_DOOR=count
 *   rules     (no shim) the fake driver's shareable-handle rules from
 *             cuda.h: which types cuMemCreate accepts, what export and
 *             import refuse, an import in the same process mapping the same
 *             bytes and not counted as new device memory
 */
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "e2e_cu.h"

#define MiB ((size_t)1 << 20)

static size_t gran;

static bool under_shim(void) { return dlsym(RTLD_DEFAULT, "bfcshim_stats_json") != NULL; }

static CUmemAllocationProp prop_of(int dev, CUmemAllocationHandleType types)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = types;
    return p;
}

static void start(void)
{
    e2e_cu_load();
    e2e_cu_primary_current(0);
    CUmemAllocationProp p = prop_of(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CHECK_EQ(D.MemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
             CUDA_SUCCESS);
}

/* h mapped at a new reservation, readable and writable by device 0. */
static CUdeviceptr map_new(CUmemGenericAllocationHandle h, size_t size)
{
    CUdeviceptr at = 0;
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK_EQ(D.MemAddressReserve(&at, size, gran, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemMap(at, size, 0, h, 0), CUDA_SUCCESS);
    CHECK_EQ(D.MemSetAccess(at, size, &a, 1), CUDA_SUCCESS);
    return at;
}

static void unmap_free(CUdeviceptr at, size_t size)
{
    CHECK_EQ(D.MemUnmap(at, size), CUDA_SUCCESS);
    CHECK_EQ(D.MemAddressFree(at, size), CUDA_SUCCESS);
}

static void *bytes(CUdeviceptr at) { return (void *)(uintptr_t)at; }

/* ---- the descriptor over a unix socket, as NCCL's proxy passes it ---------------- */

typedef struct share_msg {
    uint64_t size;
    unsigned char fill;
} share_msg;

static bool send_fd(int sock, int fd, const share_msg *m)
{
    char control[CMSG_SPACE(sizeof(int))];
    memset(control, 0, sizeof control);
    struct iovec iov = {(void *)m, sizeof *m};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(sock, &msg, 0) == (ssize_t)sizeof *m;
}

static int recv_fd(int sock, share_msg *m)
{
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {m, sizeof *m};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    if (recvmsg(sock, &msg, 0) != (ssize_t)sizeof *m)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        return -1;
    int fd = -1;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static void say(int sock, char what) { CHECK_EQ(write(sock, &what, 1), 1); }

static char heard(int sock)
{
    char what = 0;
    return read(sock, &what, 1) == 1 ? what : 0;
}

/* ---- the importer, a second process ------------------------------------------- */

/* Run as `importer`: the exporter's memory imported and mapped; its bytes
 * checked, half of them overwritten for the exporter to see, and checked
 * again after the exporter has released everything. Failed checks make the
 * exit status non-zero, which the exporter checks. */
static void importer(void)
{
    const char *s = getenv("E2E_SHARE_SOCKET");
    const int sock = s ? atoi(s) : -1;
    CHECK(sock >= 0);
    if (sock < 0)
        return;
    start();
    share_msg m = {0, 0};
    int fd = recv_fd(sock, &m);
    CHECK(fd >= 0 && m.size > 0);
    if (fd < 0)
        return;
    CUmemGenericAllocationHandle h = 0;
    CHECK_EQ(D.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             CUDA_SUCCESS);
    close(fd); /* as PyTorch and NCCL do: the imported handle keeps the memory */
    const size_t half = m.size / 2;
    CUdeviceptr at = map_new(h, m.size);
    CHECK(holds(bytes(at), m.size, m.fill));
    fill(bytes(at + half), half, 0x3c);
    if (under_shim()) /* the exporter's memory, not this process's */
        CHECK_EQ(shim_vmm_door_bytes(), 0);
    say(sock, 'w');
    CHECK_EQ(heard(sock), 'r'); /* the exporter has unmapped and released */
    CHECK(holds(bytes(at), half, m.fill) && holds(bytes(at + half), half, 0x3c));
    unmap_free(at, m.size);
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    say(sock, 'd');
}

/* ---- the exporter --------------------------------------------------------------- */

static pid_t start_importer(int sock)
{
    char fdtext[16], log[1024];
    snprintf(fdtext, sizeof fdtext, "%d", sock);
    /* its own log: the program empties its log file when it starts */
    snprintf(log, sizeof log, "%s.importer", e2e_log_path());
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("E2E_SHARE_SOCKET", fdtext, 1);
        setenv("BFCSHIM_LOG_FILE", log, 1);
        execl("/proc/self/exe", "e2e_vmm_share", "importer", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void export_to_another_process(void)
{
    start();
    const size_t size = 4 * gran;
    const bool shim = under_shim();
    CUmemAllocationProp p = prop_of(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemGenericAllocationHandle h = 0;
    CHECK_EQ(D.MemCreate(&h, size, &p, 0), CUDA_SUCCESS);
    CUdeviceptr at = map_new(h, size);
    fill(bytes(at), size, 0xa5);
    if (shim)
        CHECK_EQ(shim_vmm_door_bytes(), (long long)size);

    /* NCCL registers a user buffer by its address: retain the handle,
     * export it, release the extra reference. */
    CUmemGenericAllocationHandle again = 0;
    int fd = -1;
    CHECK_EQ(D.MemRetainAllocationHandle(&again, bytes(at + gran)), CUDA_SUCCESS);
    CHECK_EQ(D.MemExportToShareableHandle(&fd, again, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             CUDA_SUCCESS);
    CHECK_EQ(D.MemRelease(again), CUDA_SUCCESS);
    CHECK(fd >= 0);

    int pair[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
    pid_t pid = start_importer(pair[1]);
    close(pair[1]);
    share_msg m = {size, 0xa5};
    CHECK(send_fd(pair[0], fd, &m));
    close(fd); /* sent: the importer has its own */

    CHECK_EQ(heard(pair[0]), 'w');
    const size_t half = size / 2;
    CHECK(holds(bytes(at), half, 0xa5) && holds(bytes(at + half), half, 0x3c));

    unmap_free(at, size);
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    if (shim) {
        CHECK_EQ(shim_vmm_door_bytes(), 0);
        CHECK_EQ(shim_vmm_door_peak(), (long long)size);
        CHECK_EQ(shim_vmm_door_creates(), 1);
    }
    say(pair[0], 'r');
    CHECK_EQ(heard(pair[0]), 'd');
    close(pair[0]);
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "the importer failed (status %d); its log: %s.importer\n", status,
                e2e_log_path());
}

/* ---- the fake's rules --------------------------------------------------------------- */

static void rules(void)
{
    start();
    int supported = -1;
    CHECK_EQ(D.DeviceGetAttribute(&supported,
                                  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK_EQ(supported, 1);
    CHECK_EQ(D.DeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK_EQ(supported, 0);

    /* cuMemCreate's handle types: a descriptor or none; no fabric, no
     * Win32 here (not supported); bits naming no type are invalid */
    CUmemGenericAllocationHandle h = 0, plain = 0;
    CUmemAllocationProp p = prop_of(0, CU_MEM_HANDLE_TYPE_FABRIC);
    CHECK_EQ(D.MemCreate(&h, gran, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p = prop_of(0, CU_MEM_HANDLE_TYPE_WIN32);
    CHECK_EQ(D.MemCreate(&h, gran, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p = prop_of(0, (CUmemAllocationHandleType)0x100);
    CHECK_EQ(D.MemCreate(&h, gran, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = prop_of(0, CU_MEM_HANDLE_TYPE_NONE);
    CHECK_EQ(D.MemCreate(&plain, gran, &p, 0), CUDA_SUCCESS);
    p = prop_of(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CHECK_EQ(D.MemCreate(&h, 2 * gran, &p, 0), CUDA_SUCCESS);

    /* export: only a type asked for at creation, flags zero, somewhere to
     * put it, a live handle; fabric is refused */
    int fd = -1;
    CHECK_EQ(D.MemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemExportToShareableHandle(NULL, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             CUDA_ERROR_INVALID_VALUE);
    CUmemFabricHandle fabric;
    CHECK_EQ(D.MemExportToShareableHandle(&fabric, h, CU_MEM_HANDLE_TYPE_FABRIC, 0),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(D.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             CUDA_SUCCESS);
    CHECK(fd >= 0);

    /* import: a descriptor that is no exported allocation is invalid,
     * a fabric handle not supported */
    CUmemGenericAllocationHandle in = 0;
    int pipefd[2];
    CHECK_EQ(pipe(pipefd), 0);
    CHECK_EQ(D.MemImportFromShareableHandle(&in, (void *)(uintptr_t)pipefd[0],
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             CUDA_ERROR_INVALID_VALUE);
    close(pipefd[0]);
    close(pipefd[1]);
    CHECK_EQ(D.MemImportFromShareableHandle(&in, &fabric, CU_MEM_HANDLE_TYPE_FABRIC),
             CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ(D.MemImportFromShareableHandle(NULL, (void *)(uintptr_t)fd,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             CUDA_ERROR_INVALID_VALUE);

    /* imported in the same process: the same bytes at a second address,
     * no new device memory, and the memory outlives the exporting handle */
    const uint64_t used = fake_stats().bytes_in_use[0];
    CHECK_EQ(D.MemImportFromShareableHandle(&in, (void *)(uintptr_t)fd,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             CUDA_SUCCESS);
    close(fd);
    CHECK_EQ(fake_stats().bytes_in_use[0], used);
    CUdeviceptr a = map_new(h, 2 * gran), b = map_new(in, 2 * gran);
    fill(bytes(a), 2 * gran, 0x11);
    CHECK(holds(bytes(b), 2 * gran, 0x11));
    /* the import is exportable again, as a descriptor */
    CHECK_EQ(D.MemExportToShareableHandle(&fd, in, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             CUDA_SUCCESS);
    close(fd);
    unmap_free(a, 2 * gran);
    CHECK_EQ(D.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], used - 2 * gran);
    CHECK(holds(bytes(b), 2 * gran, 0x11));
    CHECK_EQ(D.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             CUDA_ERROR_INVALID_VALUE); /* released: no handle any more */
    unmap_free(b, 2 * gran);
    CHECK_EQ(D.MemRelease(in), CUDA_SUCCESS);
    CHECK_EQ(fake_stats().bytes_in_use[0], used - 2 * gran);
    CHECK_EQ(D.MemRelease(plain), CUDA_SUCCESS);
}

int main(int argc, char **argv)
{
    static const e2e_scenario scenarios[] = {
        {"export", export_to_another_process},
        {"importer", importer},
        {"rules", rules}};
    return e2e_main("e2e_vmm_share", scenarios, sizeof scenarios / sizeof scenarios[0], argc,
                    argv);
}
