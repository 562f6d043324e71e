/*
 * fakenvml: a CPU stand-in for the few NVML calls OrbiTE makes, built by the
 * tests as `libnvidia-ml.so.1` in a directory of its own (tests add it to
 * the loader path only where they want NVML present). OrbiTE loads it as it
 * loads the real library (dlopen at run time), so `fabric_domain: "auto"`,
 * the engine's start checks and the doctor read the fabric of a simulated
 * NVL72 tray from it.
 *
 * Model
 * - NVML sees every GPU of the host (FAKENVML_GPUS, default 8), whatever a
 *   process's CUDA_VISIBLE_DEVICES, in physical order; each GPU's UUID is
 *   the one the CUDA stand-in gives the same physical device ("GPU-" and the
 *   16 bytes "FAKECUDA-GPU-00" + ('@' + p) in NVML's 8-4-4-4-12 hex form), so
 *   a caller must map CUDA ordinals to NVML devices by UUID, as on a GPU.
 * - nvmlDeviceGetGpuFabricInfoV answers the versioned structure
 *   (nvmlGpuFabricInfo_v2: 36 bytes, version 0x02000024; v3: 40 bytes,
 *   0x03000028) with the cluster UUID, clique, registration state and
 *   status below; another version is NVML_ERROR_ARGUMENT_VERSION_MISMATCH.
 *
 * Environment (read at nvmlInit_v2)
 *   FAKENVML_GPUS=N             GPUs NVML sees (default 8)
 *   FAKENVML_CLUSTER=32 hex     the fabric's cluster UUID (default
 *                               00112233445566778899aabbccddeeff)
 *   FAKENVML_CLIQUE=N[,M...]    each GPU's clique id, by physical device
 *                               (the last value repeats; default 1)
 *   FAKENVML_STATE=S            not_supported, not_started, in_progress or
 *                               completed (default): the GPUs' fabric
 *                               registration state
 *   FAKENVML_STATUS=code        the registration's nvmlReturn_t status
 *                               (default 0, NVML_SUCCESS)
 *   FAKENVML_INIT=code          what nvmlInit_v2 returns (default 0; e.g. 9,
 *                               NVML_ERROR_DRIVER_NOT_LOADED)
 * The CUDA stand-in reads FAKENVML_CLUSTER, FAKENVML_CLIQUE and
 * FAKENVML_STATE too: both describe one simulated fabric.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct fake_nvml_device *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 8
#define FABRIC_V2 0x02000024u
#define FABRIC_V3 0x03000028u

struct fake_nvml_device {
    unsigned index;
};

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} fabric_info_v3;
_Static_assert(sizeof(fabric_info_v3) == 40, "nvmlGpuFabricInfo_v3_t has 40 bytes");
_Static_assert(offsetof(fabric_info_v3, healthMask) == 32, "v2's 36 bytes end with healthMask");

static struct fake_nvml_device devices[MAX_GPUS];
static int initialized, n_gpus = MAX_GPUS, state = 3;
static nvmlReturn_t fabric_status;
static unsigned cliques[MAX_GPUS];
static unsigned char cluster[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                                    0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};

static int parse_state(const char *v) {
    static const char *const names[] = {"not_supported", "not_started", "in_progress", "completed"};
    for (int i = 0; i < 4; i++)
        if (strcmp(v, names[i]) == 0) return i;
    fprintf(stderr, "fakenvml: FAKENVML_STATE is not one of not_supported, not_started, in_progress, completed\n");
    abort();
}

static void parse_env(void) {
    const char *v;
    if ((v = getenv("FAKENVML_GPUS"))) n_gpus = atoi(v) < 0 ? 0 : atoi(v) > MAX_GPUS ? MAX_GPUS : atoi(v);
    if ((v = getenv("FAKENVML_STATE"))) state = parse_state(v);
    if ((v = getenv("FAKENVML_STATUS"))) fabric_status = atoi(v);
    if ((v = getenv("FAKENVML_CLUSTER"))) {
        for (int i = 0; i < 16; i++) {
            unsigned b;
            if (strlen(v) != 32 || sscanf(v + 2 * i, "%2x", &b) != 1) {
                fprintf(stderr, "fakenvml: FAKENVML_CLUSTER is not 32 hex digits\n");
                abort();
            }
            cluster[i] = (unsigned char)b;
        }
    }
    unsigned last = 1;
    const char *q = getenv("FAKENVML_CLIQUE");
    for (int i = 0; i < MAX_GPUS; i++) {
        if (q && *q) {
            last = (unsigned)strtoul(q, (char **)&q, 10);
            if (*q == ',') q++;
        }
        cliques[i] = last;
        devices[i].index = (unsigned)i;
    }
}

/* The UUID of physical GPU p, as the CUDA stand-in's cuDeviceGetUuid_v2. */
static void uuid_of(int p, char out[41]) {
    unsigned char b[16];
    memcpy(b, "FAKECUDA-GPU-00", 15);
    b[15] = (unsigned char)(0x40 + p);
    snprintf(out, 41, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static struct fake_nvml_device *valid(nvmlDevice_t d) {
    return d >= devices && d < devices + n_gpus ? d : NULL;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    const char *v = getenv("FAKENVML_INIT");
    if (v && atoi(v)) return atoi(v);
    parse_env();
    initialized = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized = 0;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < sizeof "580.00.00-fakenvml") return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, "580.00.00-fakenvml");
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)n_gpus;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int p = 0; p < n_gpus; p++) {
        char u[41];
        uuid_of(p, u);
        if (strcmp(u, uuid) == 0) {
            *device = &devices[p];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void *out) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    struct fake_nvml_device *d = valid(device);
    if (!d || !out) return NVML_ERROR_INVALID_ARGUMENT;
    fabric_info_v3 info;
    memcpy(&info.version, out, sizeof info.version);
    if (info.version != FABRIC_V2 && info.version != FABRIC_V3) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned version = info.version;
    memset(&info, 0, sizeof info);
    info.version = version;
    info.state = (unsigned char)state;
    if (state != 0) { /* a GPU without a fabric reports nothing else */
        memcpy(info.clusterUuid, cluster, 16);
        info.cliqueId = cliques[d->index];
        info.status = fabric_status;
    }
    memcpy(out, &info, info.version == FABRIC_V3 ? 40 : 36);
    return NVML_SUCCESS;
}
