/*
 * fake_nvml.c - a fake NVML (libnvidia-ml.so.1) for the fake CUDA driver:
 * what real JAX and TensorFlow need before they use a GPU (docs/frameworks.md).
 * XLA opens libnvidia-ml.so.1 at start and, if nvmlInit_v2 fails, sees no
 * GPU without a word; it then asks NVML for the driver's version and for
 * each device by the PCI bus id that cuDeviceGetPCIBusId gave it.
 *
 * Devices: FAKECUDA_DEVICES of them (2 when unset), as the fake driver reads
 * it. NVML sees every device of the machine: CUDA_VISIBLE_DEVICES does not
 * apply to it (NVML's documentation: "NVML enumerates all devices ...
 * regardless of CUDA_VISIBLE_DEVICES"), so device i is on the bus the fake
 * driver gives the machine's device i: 0x10 * (i + 1), domain 0, device 0,
 * function 0 (fake_contexts.c, cuDeviceGetPCIBusId).
 *
 * Rules kept from NVML's documentation (nvml.h): every call but nvmlInit*,
 * nvmlErrorString is NVML_ERROR_UNINITIALIZED until nvmlInit succeeds; init
 * and shutdown are counted ("nvmlShutdown ... once for each call to
 * nvmlInit"); a buffer too small for the string is
 * NVML_ERROR_INSUFFICIENT_SIZE; a bus id matching no device is
 * NVML_ERROR_NOT_FOUND, a null argument NVML_ERROR_INVALID_ARGUMENT.
 * The PCIe link is an H100 SXM5's (generation 5, 16 lanes: XLA derives a
 * host-to-device bandwidth from it, and logs an error per device without
 * it). NVLink is not modelled: asked for NVML_FI_DEV_NVLINK_LINK_COUNT
 * (nvmlDeviceGetFieldValues), a device answers 0 links, as a PCIe card
 * does; other fields are NVML_ERROR_NOT_SUPPORTED each, and so are a link's
 * state and capabilities (nvmlDeviceGetNvLinkState/Capability: "the device
 * doesn't support this feature"). No NVLink fabric either:
 * nvmlDeviceGetGpuFabricInfoV succeeds with NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
 * what XLA and TensorFlow read as "no multi-node NVLink". MIG is off
 * (nvmlDeviceGetMigMode: disabled, none pending). Everything else NVML has
 * is absent, as from an older NVML: callers
 * look functions up and do without (XLA: NVML_ERROR_FUNCTION_NOT_FOUND).
 *
 * No nvml.h is needed: the few types are declared here as NVML declares
 * them (nvmlReturn_t values, nvmlDevice_t an opaque pointer).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

/* nvmlFieldValue_t, as nvml.h lays it out (40 bytes). */
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec; /* microseconds since 1970; update latency */
    int valueType;                    /* nvmlValueType_t */
    nvmlReturn_t nvmlReturn;
    union {
        double dVal;
        unsigned int uiVal;
        unsigned long ulVal;
        unsigned long long ullVal;
        long long sllVal;
    } value;
} nvmlFieldValue_t;

/* nvmlGpuFabricInfo_v2_t / _v3_t, as nvml.h lays them out; the version
 * word is the struct's size | (version << 24) (NVML_STRUCT_VERSION). */
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state; /* nvmlGpuFabricState_t */
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfoV_t;
#define FABRIC_INFO_V2 (unsigned)(offsetof(nvmlGpuFabricInfoV_t, healthSummary) | 2u << 24)
#define FABRIC_INFO_V3 (unsigned)(sizeof(nvmlGpuFabricInfoV_t) | 3u << 24)
#define NVML_GPU_FABRIC_STATE_NOT_SUPPORTED 0

#define NVML_FI_DEV_NVLINK_LINK_COUNT 91
#define NVML_VALUE_TYPE_UNSIGNED_INT 1

typedef struct fake_nvml_device {
    unsigned index;
} *nvmlDevice_t;

#define MAX_DEVICES 8
/* The kernel driver's version: a 580 branch, as the GPU runs measured. */
#define DRIVER_VERSION "580.00.00"

static struct fake_nvml_device devices[MAX_DEVICES];
static unsigned ndevices;
static int inits; /* nvmlInit calls not yet matched by nvmlShutdown */

static unsigned device_count(void)
{
    const char *n = getenv("FAKECUDA_DEVICES");
    int v = n ? atoi(n) : 2;
    return v < 0 || v > MAX_DEVICES ? 2 : (unsigned)v;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    if (inits++ == 0) {
        ndevices = device_count();
        for (unsigned i = 0; i < ndevices; i++)
            devices[i].index = i;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    if (inits == 0)
        return NVML_ERROR_UNINITIALIZED;
    inits--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length < sizeof DRIVER_VERSION)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(version, DRIVER_VERSION, sizeof DRIVER_VERSION);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = ndevices;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= ndevices)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

/* "domain:bus:device.function in format %x:%x:%x.%x", "domain:bus:device
 * in format %x:%x:%x", "bus:device.function in format %x:%x.%x" (nvml.h,
 * nvmlDeviceGetHandleByPciBusId_v2): all hexadecimal. */
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    char end;
    if (sscanf(bus_id, "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &end) != 4 &&
        sscanf(bus_id, "%x:%x:%x%c", &domain, &bus, &dev, &end) != 3 &&
        (domain = 0, sscanf(bus_id, "%x:%x.%x%c", &bus, &dev, &fn, &end) != 3))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < ndevices; i++)
        if (domain == 0 && bus == 0x10 * (i + 1) && dev == 0 && fn == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t device_ok(nvmlDevice_t device)
{
    if (!inits)
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned i = 0; i < ndevices; i++)
        if (device == &devices[i])
            return NVML_SUCCESS;
    return NVML_ERROR_INVALID_ARGUMENT;
}

/* A device's fixed unsigned answer: the device checked, then the result
 * pointer. */
static nvmlReturn_t answer_uint(nvmlDevice_t device, unsigned int *out, unsigned int value)
{
    nvmlReturn_t r = device_ok(device);
    if (r == NVML_SUCCESS && !out)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *out = value;
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    return answer_uint(device, gen, 5);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
    return answer_uint(device, width, 16);
}

/* "NVML_SUCCESS if any values in values were populated. Note that you must
 * check the nvmlReturn field of each value for each individual status"
 * (nvml.h). */
EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count,
                                             nvmlFieldValue_t *values)
{
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS)
        return r;
    if (!values || count < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        v->latencyUsec = 0;
        if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = 0;
            v->nvmlReturn = NVML_SUCCESS;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

/* A PCIe card: no link has a state or a capability to report. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                             unsigned int *is_active)
{
    (void)link;
    nvmlReturn_t r = device_ok(device);
    if (r == NVML_SUCCESS)
        r = is_active ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                  unsigned int capability, unsigned int *result)
{
    (void)link, (void)capability;
    nvmlReturn_t r = device_ok(device);
    if (r == NVML_SUCCESS)
        r = result ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return r;
}

/* Not part of an NVLink fabric: success, with the state saying so. The
 * caller names its struct's version; an unknown one is refused. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info)
{
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS)
        return r;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != FABRIC_INFO_V2 && info->version != FABRIC_INFO_V3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memset(info->clusterUuid, 0, sizeof info->clusterUuid);
    info->status = NVML_SUCCESS;
    info->cliqueId = 0;
    info->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
    info->healthMask = 0;
    if (info->version == FABRIC_INFO_V3)
        info->healthSummary = 0;
    return NVML_SUCCESS;
}

/* NVML_DEVICE_MIG_DISABLE (0) now and pending. */
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                         unsigned int *pending)
{
    nvmlReturn_t r = device_ok(device);
    if (r == NVML_SUCCESS && (!current || !pending))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *current = *pending = 0;
    return r;
}
