/*
 * fakecuda: a CPU stand-in for the subset of the CUDA driver API that
 * OrbiTE calls, built by the tests as `libcuda.so.1` and put on the loader
 * path of test processes. It is never installed and never linked into
 * liborbite; the code under test loads it exactly as it loads the real
 * driver (dlopen through cudarc), so the real NVLink and MNNVL transports
 * run end to end across real processes without a GPU.
 *
 * Model
 * - "Device memory" is memfd-backed host memory. Its device address is a
 *   PROT_NONE reservation (touching it from the CPU faults, as a GPU
 *   pointer would); the driver copies through a private shadow mapping.
 *   Pinned and registered host memory is ordinary CPU-accessible memory.
 * - Legacy IPC handles name the exporter's pid, the memfd's fd number and a
 *   per-process token; the importer opens /proc/PID/fd/N and checks the
 *   memfd's name before mapping it. Opening in the exporting process fails
 *   as the driver does; reopening in one process is reference counted.
 * - New device, VMM and pinned host allocations hold a garbage pattern
 *   (0xdb), as the driver promises no zeroing: whoever needs zeros must
 *   write them.
 * - VMM: cuMemCreate makes a memfd per allocation; reservations are
 *   PROT_NONE ranges; cuMemMap maps a shadow only; cuMemSetAccess grants
 *   devices (a copy through a mapping needs access for the stream's device)
 *   and, with a HOST or HOST_NUMA descriptor, the CPU: only then is HOST_NUMA
 *   (EGM) memory CPU-accessible at its address (a CPU grant on device memory
 *   is INVALID_VALUE). POSIX fd and 64-byte fabric handles are exported and
 *   imported.
 * - Streams run their work on a worker thread each, so copies are truly
 *   asynchronous: an event query can say NOT_READY and ordering bugs show.
 *   A device-to-device cuMemcpy returns before the copy completes (as the
 *   driver may); cuMemcpyBatchAsync_v2 performs its copies last to first
 *   (a batch promises no order between its copies).
 * - cuStreamWaitValue32_v2 holds a stream until a word of device memory
 *   meets its condition (the worker polls it): a gate a test opens.
 * - Arguments are validated the way the driver does: unknown handles,
 *   wrong contexts, out-of-range or unmapped copies return errors.
 * - Every GPU is its own: device memory (cuMemAlloc) and a legacy IPC
 *   import belong to the device whose context made them. A copy run by
 *   another device's context (its stream, or cuMemcpy while it is current)
 *   fails with INVALID_VALUE unless that context enabled peer access to the
 *   owner (cuCtxEnablePeerAccess), and is counted ("cross_device_refused" in
 *   the trace). A handle opened again in the same context is reference
 *   counted; opened in another device's context it is a separate mapping
 *   of that device. VMM mappings follow their cuMemSetAccess grants; pinned
 *   and registered host memory serves every context.
 * - Paths between devices (FAKECUDA_NO_PEER, FAKECUDA_NO_P2P) are physical
 *   and the same in every process. cuMemSetAccess granting a device with no
 *   path to a mapped allocation's device fails INVALID_DEVICE and grants
 *   nothing (counted "access_refused"); cuIpcOpenMemHandle in a context of
 *   a device with no path to the exporter's fails INVALID_DEVICE. Every
 *   allocation's memfd is named after its physical device, so a POSIX fd
 *   import knows the exporter's true location, and an fd that is not an
 *   allocation of this driver is refused INVALID_VALUE.
 * - Pointer queries (cuPointerGetAttribute) answer memory type, device,
 *   managed (cuMemAllocManaged) and legacy-IPC capability;
 *   cuMemRetainAllocationHandle returns a VMM mapping's handle with one
 *   more reference (cuMemRelease gives it back); cuDeviceGetUuid_v2 names
 *   each physical device the same in every process.
 * - Injected failures behave as the driver's: a sticky error (700
 *   ILLEGAL_ADDRESS, 714-719) poisons the whole process, every context
 *   (every later call, and every call on any stream and event, returns
 *   that error; context switching and device queries still work); a failed
 *   cuMemcpyBatchAsync_v2 has enqueued the first half of its descriptors.
 *
 * Environment (read once, at the first call)
 *   FAKECUDA_DEVICES=N            visible devices (default 1)
 *   FAKECUDA_DRIVER_VERSION=V     cuDriverGetVersion (default 13000)
 *   FAKECUDA_NO_FABRIC=create|export  fabric handles fail with
 *                                 NOT_PERMITTED at cuMemCreate or export
 *                                 (no IMEX channel)
 *   FAKECUDA_COPY_DELAY_US=U      each asynchronous copy waits U us first
 *   FAKECUDA_DEAD_EXPORTER=stale  a copy through a legacy IPC import whose
 *                                 exporter exited moves its stale bytes
 *                                 instead of faulting (the undefined case)
 *   FAKECUDA_FAIL=name:N:code[,..] the Nth call (1-based) of `name` returns
 *                                 `code`; `name:N+:code` every call from N;
 *                                 `name@after:code` the first call of `name`
 *                                 after the first call of `after`
 *   FAKECUDA_VISIBLE_DEVICES=a,b  this process sees physical devices a, b
 *                                 (ordinal 0 is a), as CUDA_VISIBLE_DEVICES
 *                                 would; only their UUIDs differ by it
 *   FAKECUDA_NO_PEER=1            no peer access between distinct devices
 *                                 (cuDeviceCanAccessPeer says 0)
 *   FAKECUDA_NO_P2P=a:b[,c:d]     no path between physical devices a and b
 *                                 (both ways): a P2P matrix missing pairs
 *   FAKECUDA_DEVICE_NAME=name     cuDeviceGetName's answer (default
 *                                 "fakecuda device N"), to pose as a GPU
 *   FAKECUDA_TRACE=path           at exit, appends "pid name calls" lines
 *                                 for every function called, copies per
 *                                 device and the live-resource report
 *   FAKECUDA_IMEX_DIR=path        the directory standing for
 *                                 /dev/nvidia-caps-imex-channels: fabric
 *                                 handles then need an IMEX channel file
 *                                 there that this process may open read-write
 *                                 (the lowest-numbered one is used); without
 *                                 one cuMemCreate, export and import of
 *                                 fabric handles are NOT_PERMITTED; a fabric
 *                                 handle of another channel does not import
 *                                 (INVALID_HANDLE). Unset: channels are not
 *                                 modelled (fabric handles just work)
 *   FAKENVML_CLUSTER, FAKENVML_CLIQUE, FAKENVML_STATE  the simulated fabric
 *                                 the NVML stand-in (fakenvml.c) reports:
 *                                 a fabric handle carries its exporter's
 *                                 cluster, clique and state; an import
 *                                 across clusters or cliques, or with either
 *                                 side's registration not completed, is
 *                                 refused with the driver's opaque
 *                                 INVALID_HANDLE ("invalid resource
 *                                 handle"); state not_supported (a GPU with
 *                                 no NVLink fabric) makes the fabric
 *                                 attribute 0 and cuMemCreate with fabric
 *                                 handles NOT_SUPPORTED
 * Compile with -DFAKECUDA_OMIT_BATCH to leave cuMemcpyBatchAsync_v2 out.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct fc_ctx *CUcontext;
typedef struct fc_stream *CUstream;
typedef struct fc_event *CUevent;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
};

typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct { int srcAccessOrder; CUmemLocation srcLocHint; CUmemLocation dstLocHint; unsigned int flags; } CUmemcpyAttributes;

#define LOC_DEVICE 1
#define LOC_HOST 2
#define LOC_HOST_NUMA 3
#define HANDLE_POSIX_FD 1
#define HANDLE_FABRIC 8
#define GRANULARITY (2ull << 20)
#define GARBAGE 0xdb /* what new allocations hold */
#define IPC_MAGIC 0x50494346u    /* "FCIP" */
#define FABRIC_MAGIC 0x42464346u /* "FCFB" */

/* ------------------------------------------------------------------ */
/* Calls, fault injection and the trace                               */

#define FC_FUNCS(X)                                                                                  \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute)      \
    X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuCtxSetCurrent) \
    X(cuCtxGetCurrent) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxGetDevice)                \
    X(cuCtxSynchronize) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemsetD8_v2) X(cuMemsetD8Async) X(cuMemHostAlloc) \
    X(cuMemFreeHost) X(cuMemHostRegister_v2) X(cuMemHostUnregister) X(cuPointerGetAttribute)         \
    X(cuMemGetAddressRange_v2) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle)  \
    X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemAddressReserve)                 \
    X(cuMemAddressFree) X(cuMemSetAccess) X(cuMemGetAllocationGranularity)                          \
    X(cuMemGetAllocationPropertiesFromHandle) X(cuMemExportToShareableHandle)                       \
    X(cuMemImportFromShareableHandle) X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamSynchronize) \
    X(cuStreamQuery) X(cuStreamWaitEvent) X(cuStreamWaitValue32_v2) X(cuEventCreate) X(cuEventDestroy_v2) X(cuEventRecord)    \
    X(cuEventQuery) X(cuEventSynchronize) X(cuMemcpy) X(cuMemcpyAsync) X(cuMemcpyDtoD_v2)            \
    X(cuMemcpyDtoH_v2) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoDAsync_v2) X(cuMemcpyDtoHAsync_v2)            \
    X(cuMemcpyHtoDAsync_v2) X(cuMemcpyBatchAsync_v2) X(cuDeviceCanAccessPeer) X(cuDeviceGetP2PAttribute)    \
    X(cuCtxEnablePeerAccess) X(cuDeviceGetUuid_v2) X(cuMemAllocManaged) X(cuMemRetainAllocationHandle)

#define FC_ENUM(n) F_##n,
enum { FC_FUNCS(FC_ENUM) F_COUNT };
#define FC_NAME(n) #n,
static const char *const fc_names[] = {FC_FUNCS(FC_NAME)};

struct rule {
    int func;
    unsigned long nth;
    int from_on;
    CUresult code;
    int after; /* name@after:code: -1, or the call that arms the rule (it fires once, at the next call of func) */
    int armed;
};
static struct rule rules[32];
static int nrules;
static unsigned long calls[F_COUNT];
static int n_devices = 1, driver_version = 13000, no_fabric; /* 1 create, 2 export */
static int no_peer;
static unsigned char no_p2p[8][8]; /* FAKECUDA_NO_P2P, physical devices */
static unsigned long access_refused;
static const char *device_name; /* FAKECUDA_DEVICE_NAME */
static int physical_of[8] = {0, 1, 2, 3, 4, 5, 6, 7}; /* FAKECUDA_VISIBLE_DEVICES */
static unsigned long cross_device_refused;
static unsigned copy_delay_us;
static int dead_exporter_stale; /* FAKECUDA_DEAD_EXPORTER=stale: no fault, the stale bytes move */
/* The simulated fabric (FAKECUDA_IMEX_DIR; FAKENVML_CLUSTER, _CLIQUE, _STATE). */
static char imex_dir[512];
static uint32_t fabric_cluster = 0x5eed; /* a hash of FAKENVML_CLUSTER */
static uint32_t fabric_clique[8] = {1, 1, 1, 1, 1, 1, 1, 1}; /* by physical device */
static int fabric_state = 3;             /* NVML's: 0 not supported, 1 not started, 2 in progress, 3 completed */
static char trace_path[512];
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t calls_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t token;

#define MAX_DEVICES 8
/* Copies enqueued by streams of each device's context. */
static unsigned long copies_on[MAX_DEVICES];

/* What is still allocated at exit (the baseline a clean run returns to). */
#define N_LIVE 8
static const char *const live_names[N_LIVE] = {"device_allocs", "pinned_host",  "host_registrations",
                                               "ipc_imports",   "vmm_handles",  "reservations",
                                               "streams",       "events"};
static int count_live(unsigned long live[N_LIVE]);

/* The trace always carries the live-resource report: every live:NAME line,
 * or, if the driver's lock could not be taken within 10 s, one
 * "live:incomplete 1" line (never a silent omission). */
static void write_trace(void) {
    FILE *f = fopen(trace_path, "a");
    if (!f) return;
    for (int i = 0; i < F_COUNT; i++)
        if (calls[i]) fprintf(f, "%d %s %lu\n", (int)getpid(), fc_names[i], calls[i]);
    for (int d = 0; d < MAX_DEVICES; d++)
        if (copies_on[d]) fprintf(f, "%d copies@device%d %lu\n", (int)getpid(), d, copies_on[d]);
    if (cross_device_refused) fprintf(f, "%d cross_device_refused %lu\n", (int)getpid(), cross_device_refused);
    if (access_refused) fprintf(f, "%d access_refused %lu\n", (int)getpid(), access_refused);
    unsigned long live[N_LIVE];
    if (count_live(live))
        for (int i = 0; i < N_LIVE; i++) fprintf(f, "%d live:%s %lu\n", (int)getpid(), live_names[i], live[i]);
    else
        fprintf(f, "%d live:incomplete 1\n", (int)getpid());
    fclose(f);
}

static uint64_t checksum(const void *p, size_t n);

static void parse_env(void) {
    const char *v;
    if ((v = getenv("FAKECUDA_DEVICES"))) n_devices = atoi(v);
    if ((v = getenv("FAKECUDA_DRIVER_VERSION"))) driver_version = atoi(v);
    if ((v = getenv("FAKECUDA_COPY_DELAY_US"))) copy_delay_us = (unsigned)atoi(v);
    if ((v = getenv("FAKECUDA_DEAD_EXPORTER"))) dead_exporter_stale = strcmp(v, "stale") == 0;
    if ((v = getenv("FAKECUDA_NO_FABRIC"))) no_fabric = strcmp(v, "export") == 0 ? 2 : 1;
    if ((v = getenv("FAKECUDA_NO_PEER"))) no_peer = atoi(v) != 0;
    if ((v = getenv("FAKECUDA_NO_P2P"))) {
        for (const char *q = v; *q;) {
            int a, b, used = 0;
            if (sscanf(q, "%d:%d%n", &a, &b, &used) != 2 || a < 0 || a > 7 || b < 0 || b > 7) {
                fprintf(stderr, "fakecuda: FAKECUDA_NO_P2P is not a:b[,c:d] of devices 0-7: '%s'\n", v);
                abort();
            }
            no_p2p[a][b] = no_p2p[b][a] = 1;
            q += used;
            if (*q == ',') q++;
        }
    }
    device_name = getenv("FAKECUDA_DEVICE_NAME");
    if ((v = getenv("FAKECUDA_VISIBLE_DEVICES"))) {
        int n = 0;
        for (const char *q = v; *q && n < 8; n++) {
            physical_of[n] = atoi(q);
            while (*q && *q != ',') q++;
            if (*q == ',') q++;
        }
        n_devices = n;
    }
    if ((v = getenv("FAKECUDA_TRACE")) && strlen(v) < sizeof trace_path) {
        strcpy(trace_path, v);
        atexit(write_trace);
    }
    if ((v = getenv("FAKECUDA_IMEX_DIR")) && strlen(v) < sizeof imex_dir) strcpy(imex_dir, v);
    if ((v = getenv("FAKENVML_CLUSTER"))) fabric_cluster = (uint32_t)checksum(v, strlen(v));
    if ((v = getenv("FAKENVML_CLIQUE"))) {
        uint32_t last = 1;
        for (int i = 0; i < 8; i++) {
            if (*v) {
                last = (uint32_t)strtoul(v, (char **)&v, 10);
                if (*v == ',') v++;
            }
            fabric_clique[i] = last;
        }
    }
    if ((v = getenv("FAKENVML_STATE"))) {
        static const char *const names[] = {"not_supported", "not_started", "in_progress", "completed"};
        fabric_state = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(v, names[i]) == 0) fabric_state = i;
        if (fabric_state < 0) {
            fprintf(stderr, "fakecuda: FAKENVML_STATE is not one of not_supported, not_started, in_progress, completed\n");
            abort();
        }
    }
    if ((v = getenv("FAKECUDA_FAIL"))) {
        char *s = strdup(v), *save = NULL;
        for (char *item = strtok_r(s, ",", &save); item && nrules < 32; item = strtok_r(NULL, ",", &save)) {
            char name[96], after[96] = {0};
            unsigned long nth = 0;
            char plus[2] = {0};
            int code, f = -1, a = -1;
            if (sscanf(item, "%95[^:@]@%95[^:]:%d", name, after, &code) != 3 &&
                (after[0] = 0, sscanf(item, "%95[^:]:%lu%1[+]:%d", name, &nth, plus, &code) != 4) &&
                (plus[0] = 0, sscanf(item, "%95[^:]:%lu:%d", name, &nth, &code) != 3)) {
                fprintf(stderr, "fakecuda: FAKECUDA_FAIL item '%s' is not name:N:code, name:N+:code or name@after:code\n",
                        item);
                abort();
            }
            for (int i = 0; i < F_COUNT; i++) {
                if (strcmp(fc_names[i], name) == 0) f = i;
                if (after[0] && strcmp(fc_names[i], after) == 0) a = i;
            }
            if (f < 0 || (after[0] && a < 0)) {
                fprintf(stderr, "fakecuda: FAKECUDA_FAIL names an unknown function in '%s'\n", item);
                abort();
            }
            rules[nrules++] = (struct rule){f, nth, plus[0] == '+', code, a, 0};
        }
        free(s);
    }
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &token, sizeof token) != sizeof token) token = (uint64_t)getpid() * 2654435761u ^ (uint64_t)time(NULL);
    if (fd >= 0) close(fd);
}

/* Errors after which the driver refuses all later work in the context. */
static int is_sticky(CUresult r) { return r == CUDA_ERROR_ILLEGAL_ADDRESS || (r >= 714 && r <= 719); }

/* Calls a poisoned context does not refuse: device queries and context
 * switching (a caller must still be able to restore its own context). */
static int context_free(int func) {
    switch (func) {
    case F_cuInit: case F_cuDriverGetVersion: case F_cuDeviceGetCount: case F_cuDeviceGet:
    case F_cuDeviceGetAttribute: case F_cuDeviceGetName: case F_cuDevicePrimaryCtxRetain:
    case F_cuDevicePrimaryCtxRelease_v2: case F_cuCtxSetCurrent: case F_cuCtxGetCurrent:
    case F_cuCtxPushCurrent_v2: case F_cuCtxPopCurrent_v2: case F_cuDeviceCanAccessPeer:
    case F_cuDeviceGetP2PAttribute:
        return 1;
    default:
        return 0;
    }
}

static CUresult current_poison(void);
static void poison_current(CUresult code);

/* Counts the call; returns the current context's sticky error, else the
 * injected result (*injected = 1; a sticky one poisons the current
 * context), else CUDA_SUCCESS. */
static CUresult enter_rule(int func, int *injected) {
    pthread_once(&env_once, parse_env);
    pthread_mutex_lock(&calls_mu);
    unsigned long n = ++calls[func];
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < nrules; i++) {
        struct rule *x = &rules[i];
        if (x->after >= 0) {
            if (x->func == func && x->armed == 1) {
                x->armed = 2; /* fired: never again */
                r = x->code;
            }
            if (x->after == func && x->armed == 0) x->armed = 1;
        } else if (x->func == func && (n == x->nth || (x->from_on && n >= x->nth))) {
            r = x->code;
        }
    }
    pthread_mutex_unlock(&calls_mu);
    *injected = 0;
    CUresult p = context_free(func) ? CUDA_SUCCESS : current_poison();
    if (p) return p;
    if (r) {
        *injected = 1;
        if (is_sticky(r)) poison_current(r);
    }
    return r;
}

static CUresult enter(int func) {
    int injected;
    return enter_rule(func, &injected);
}

#define ENTER(name)                                \
    do {                                           \
        CUresult inj_ = enter(F_##name);           \
        if (inj_ != CUDA_SUCCESS) return inj_;     \
    } while (0)

static int initialized;
#define NEED_INIT()                                              \
    do {                                                         \
        if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))    \
            return CUDA_ERROR_NOT_INITIALIZED;                   \
    } while (0)

/* ------------------------------------------------------------------ */
/* Global state                                                        */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER; /* any stream advanced */

struct fc_stream;
struct fc_ctx {
    uint32_t magic;
    int device;
    int retained;
    struct fc_stream *legacy;
    CUresult poisoned; /* a sticky error: every later call in the context fails with it */
    unsigned peers;    /* bit d: peer access to device d's context enabled */
};
#define CTX_MAGIC 0xc7c7c7c7u
static struct fc_ctx contexts[MAX_DEVICES];
static __thread struct fc_ctx *ctx_stack[16];
static __thread int ctx_depth; /* ctx_stack[ctx_depth-1] is current; 0 = none */

static struct fc_ctx *current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

/* The first sticky error of the process. The runtime's reference for
 * cudaErrorIllegalAddress (and 714-719 alike): "This leaves the process in
 * an inconsistent state and any further CUDA work will return the same
 * error. To continue using CUDA, the process must be terminated and
 * relaunched." So it poisons every context, not only the one it hit. */
static CUresult process_poisoned;

static CUresult poison_of(struct fc_ctx *c) {
    CUresult p = __atomic_load_n(&process_poisoned, __ATOMIC_ACQUIRE);
    if (p) return p;
    return c ? __atomic_load_n(&c->poisoned, __ATOMIC_ACQUIRE) : 0;
}
static CUresult current_poison(void) { return poison_of(current()); }
static void poison(struct fc_ctx *c, CUresult code) {
    if (c) __atomic_store_n(&c->poisoned, code, __ATOMIC_RELEASE);
    CUresult none = CUDA_SUCCESS;
    __atomic_compare_exchange_n(&process_poisoned, &none, code, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static void poison_current(CUresult code) { poison(current(), code); }

static int valid_ctx(struct fc_ctx *c) {
    return c >= contexts && c < contexts + MAX_DEVICES && c->magic == CTX_MAGIC;
}

/* Memory ranges the driver knows. */
enum kind { K_DEVICE, K_HOST, K_REGISTERED, K_IPC_IMPORT, K_RESERVED, K_MANAGED };
struct piece; /* a VMM mapping inside a reservation */
struct range {
    enum kind kind;
    uint64_t va;
    size_t len;
    char *shadow; /* where the driver reads/writes; NULL for K_RESERVED */
    int fd;       /* memfd of K_DEVICE; K_IPC_IMPORT: a pidfd of the exporter (-1: none) */
    int device;
    uint64_t id;  /* K_DEVICE allocation id; K_IPC_IMPORT exporter's id */
    uint64_t peer_token;
    int refs;     /* K_IPC_IMPORT open count */
    struct piece *pieces;
    struct range *next;
    int portable; /* K_HOST / K_REGISTERED: pinned for every context (PORTABLE), else only `device`'s */
};
struct vmm {
    uint32_t magic;
    int fd;
    size_t size;
    int handle_types;
    CUmemLocation loc;
    int released;
    int retains; /* references from cuMemRetainAllocationHandle */
    int maps;
    uint64_t id;
    struct vmm *next;
    int phys; /* the physical device holding it; -1: host memory */
};
#define VMM_MAGIC 0x564d4d31u
struct piece {
    uint64_t va;
    size_t len;
    size_t offset; /* into the allocation */
    char *shadow;
    struct vmm *h;
    unsigned access; /* bit d: device d may read/write */
    int cpu;         /* CPU access granted (HOST / HOST_NUMA descriptor): 0, 1 read, 3 read/write */
    struct piece *next;
};
static struct range *ranges;
static struct vmm *vmms;
static uint64_t next_id = 1;

static struct range *range_of(uint64_t addr) {
    for (struct range *r = ranges; r; r = r->next)
        if (addr >= r->va && addr - r->va < r->len) return r;
    return NULL;
}

static struct vmm *valid_vmm(CUmemGenericAllocationHandle h) {
    for (struct vmm *v = vmms; v; v = v->next)
        if ((uint64_t)(uintptr_t)v == h && v->magic == VMM_MAGIC) return v;
    return NULL;
}

static void drop_vmm_if_unused(struct vmm *v) {
    if (!v->released || v->maps || v->retains) return;
    for (struct vmm **p = &vmms; *p; p = &(*p)->next)
        if (*p == v) {
            *p = v->next;
            break;
        }
    close(v->fd);
    v->magic = 0;
    free(v);
}

/* A memfd for allocation `id` on physical device `phys` (-1: host memory),
 * named "fakecuda-TOKEN-ID pPHYS". */
static int memfd_for(size_t len, uint64_t id, int phys) {
    char name[64];
    snprintf(name, sizeof name, "fakecuda-%016llx-%llu p%d", (unsigned long long)token, (unsigned long long)id, phys);
    int fd = (int)syscall(SYS_memfd_create, name, 1u /* MFD_CLOEXEC */);
    if (fd < 0) return -1;
    if (ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A PROT_NONE reservation of `len` bytes aligned to the granularity. */
static char *reserve(size_t len) {
    size_t span = len + GRANULARITY;
    char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uintptr_t a = ((uintptr_t)p + GRANULARITY - 1) & ~(uintptr_t)(GRANULARITY - 1);
    if (a > (uintptr_t)p) munmap(p, a - (uintptr_t)p);
    size_t tail = (uintptr_t)p + span - (a + len);
    if (tail) munmap((char *)(a + len), tail);
    return (char *)a;
}

static size_t round_up(size_t n, size_t g) { return (n + g - 1) / g * g; }

/* Whether [p, p+n) is mapped host memory (for pointers the driver does not know). */
static int host_mapped(uint64_t p, size_t n) {
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t start = p & ~(uint64_t)(pg - 1);
    size_t span = (size_t)(p + n - start);
    unsigned char vec[256];
    for (size_t off = 0; off < span; off += 256 * (size_t)pg) {
        size_t chunk = span - off < 256 * (size_t)pg ? span - off : 256 * (size_t)pg;
        if (mincore((void *)(uintptr_t)(start + off), chunk, vec) != 0) return 0;
    }
    return 1;
}

/* Where the driver touches [addr, addr+n) for a copy run by `dev`;
 * *device_side says whether it is device memory. Caller holds mu. */
static CUresult resolve(uint64_t addr, size_t n, int dev, char **out, int *device_side) {
    struct range *r = range_of(addr);
    if (!r) {
        if (n && !host_mapped(addr, n)) return CUDA_ERROR_INVALID_VALUE;
        *out = (char *)(uintptr_t)addr;
        *device_side = 0;
        return CUDA_SUCCESS;
    }
    if (n > r->len - (addr - r->va)) return CUDA_ERROR_INVALID_VALUE;
    if ((r->kind == K_DEVICE || r->kind == K_IPC_IMPORT) && r->device != dev &&
        !(contexts[dev].peers & (1u << r->device))) {
        cross_device_refused++; /* another GPU's memory, no peer access */
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (r->kind != K_RESERVED) {
        *out = r->shadow + (addr - r->va);
        *device_side = r->kind == K_DEVICE || r->kind == K_IPC_IMPORT;
        return CUDA_SUCCESS;
    }
    for (struct piece *p = r->pieces; p; p = p->next)
        if (addr >= p->va && addr - p->va < p->len) {
            if (n > p->len - (addr - p->va)) return CUDA_ERROR_INVALID_VALUE; /* spans mappings */
            if (!(p->access & (1u << dev))) return CUDA_ERROR_ILLEGAL_ADDRESS; /* no cuMemSetAccess */
            *out = p->shadow + (addr - p->va);
            *device_side = p->h->loc.type == LOC_DEVICE;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_ILLEGAL_ADDRESS; /* reserved but unmapped */
}

/* ------------------------------------------------------------------ */
/* Streams and events                                                  */

/* OP_FAULT: a copy that touches memory its device may not (no access
 * grant, reserved but unmapped). Its enqueue succeeded, as the driver's
 * does (the DMA faults later); running it poisons the process with 700. */
/* OP_AFTER: waits until stream `after` has done `gen` operations: the
 * legacy default stream's implicit synchronisation with blocking streams. */
enum op_kind { OP_COPY, OP_SET, OP_RECORD, OP_WAIT, OP_WAIT_VALUE, OP_FAULT, OP_AFTER };
struct op {
    enum op_kind kind;
    char *dst, *src;
    size_t n;
    unsigned char value;
    struct fc_event *ev;
    uint64_t gen;
    unsigned flags; /* OP_WAIT_VALUE: the condition */
    int exporter;   /* OP_COPY: a pidfd of the exporter of an imported side (-1: none) */
    char *staged;   /* OP_COPY from pageable memory: the staging copy it reads (freed with it) */
    struct fc_stream *after; /* OP_AFTER: the stream waited for */
    struct op *next;
};
struct fc_stream {
    uint32_t magic;
    struct fc_ctx *ctx;
    struct op *head, *tail;
    uint64_t enqueued, done;
    int destroyed;
    int nonblocking; /* CU_STREAM_NON_BLOCKING: no implicit synchronisation with the legacy stream */
    pthread_cond_t work;
    struct fc_stream *next;
};
#define STREAM_MAGIC 0x5354524du
struct fc_event {
    uint32_t magic;
    struct fc_ctx *ctx;
    uint64_t recorded, completed;
    struct fc_event *next;
};
#define EVENT_MAGIC 0x45564e54u
static struct fc_stream *streams;
static struct fc_event *events;

static int valid_stream(struct fc_stream *s) {
    for (struct fc_stream *x = streams; x; x = x->next)
        if (x == s && s->magic == STREAM_MAGIC && !s->destroyed) return 1;
    return 0;
}

static int valid_event(struct fc_event *e) {
    for (struct fc_event *x = events; x; x = x->next)
        if (x == e && e->magic == EVENT_MAGIC) return 1;
    return 0;
}

/* cuStreamWaitValue32's conditions (CUstreamWaitValue_flags): GEQ is a
 * wrapping comparison, (int32_t)(*addr - value) >= 0. */
#define WAIT_VALUE_GEQ 0x0
#define WAIT_VALUE_EQ 0x1
#define WAIT_VALUE_AND 0x2
#define WAIT_VALUE_NOR 0x3
static int value_reached(volatile uint32_t *addr, uint32_t value, unsigned flags) {
    uint32_t v = *addr;
    switch (flags) {
    case WAIT_VALUE_EQ: return v == value;
    case WAIT_VALUE_AND: return (v & value) != 0;
    case WAIT_VALUE_NOR: return ~(v | value) != 0;
    default: return (int32_t)(v - value) >= 0;
    }
}

/* Whether the process behind a pidfd has exited (a zombie included). On a
 * GPU an imported allocation whose exporter died is freed under its
 * importers: a copy through it is undefined and in practice faults. */
static int exporter_exited(int pidfd) {
    if (pidfd < 0) return 0;
    struct pollfd p = {pidfd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

static void *worker(void *arg) {
    struct fc_stream *s = arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!s->head && !s->destroyed) pthread_cond_wait(&s->work, &mu);
        if (!s->head) break; /* destroyed and drained */
        struct op *o = s->head;
        if (o->kind == OP_WAIT) {
            while (o->ev->completed < o->gen) pthread_cond_wait(&progress, &mu);
        } else if (o->kind == OP_AFTER) {
            while (o->after->done < o->gen) pthread_cond_wait(&progress, &mu);
        } else if (o->kind == OP_FAULT) {
            poison(s->ctx, CUDA_ERROR_ILLEGAL_ADDRESS);
        } else if ((o->kind == OP_COPY || o->kind == OP_SET) && poison_of(s->ctx)) {
            /* A faulted process runs no more work. */
        } else if (o->kind == OP_COPY || o->kind == OP_SET) {
            pthread_mutex_unlock(&mu);
            if (copy_delay_us) usleep(copy_delay_us);
            if (o->kind == OP_COPY && !dead_exporter_stale && exporter_exited(o->exporter))
                poison(s->ctx, CUDA_ERROR_ILLEGAL_ADDRESS); /* its memory went with it */
            else if (o->kind == OP_COPY)
                memmove(o->dst, o->src, o->n);
            else
                memset(o->dst, o->value, o->n);
            pthread_mutex_lock(&mu);
        } else if (o->kind == OP_WAIT_VALUE) {
            /* The word changes under no lock of ours: poll it. */
            while (!value_reached((volatile uint32_t *)o->dst, (uint32_t)o->gen, o->flags)) {
                pthread_mutex_unlock(&mu);
                usleep(200);
                pthread_mutex_lock(&mu);
            }
        } else if (o->kind == OP_RECORD) {
            if (o->ev->completed < o->gen) o->ev->completed = o->gen;
        }
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->done++;
        if (o->kind == OP_COPY && o->exporter >= 0) close(o->exporter);
        if (o->kind == OP_COPY) free(o->staged);
        free(o);
        pthread_cond_broadcast(&progress);
    }
    /* The stream stays in the list, marked destroyed: handles are never reused. */
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Caller holds mu. */
static struct fc_stream *new_stream(struct fc_ctx *c) {
    struct fc_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->magic = STREAM_MAGIC;
    s->ctx = c;
    pthread_cond_init(&s->work, NULL);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, worker, s) != 0) {
        pthread_attr_destroy(&at);
        free(s);
        return NULL;
    }
    pthread_attr_destroy(&at);
    s->next = streams;
    streams = s;
    return s;
}

/* Caller holds mu. */
static void link_op(struct fc_stream *s, struct op *o) {
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    s->enqueued++;
    pthread_cond_signal(&s->work);
}

/* Makes `s` wait, before what is pushed next, for what `other` has queued
 * so far (nothing when it has caught up). Caller holds mu. */
static void wait_for(struct fc_stream *s, struct fc_stream *other) {
    if (other->done >= other->enqueued) return;
    struct op *w = calloc(1, sizeof *w);
    if (!w) abort(); /* the stand-in cannot keep its ordering promise */
    *w = (struct op){.kind = OP_AFTER, .after = other, .gen = other->enqueued};
    link_op(s, w);
}

/* Queues `o` on `s` behind the implicit synchronisation of the legacy
 * default stream, as the driver's "Stream synchronization behavior"
 * describes it: the legacy stream "synchronizes with all other blocking
 * streams in the same CUcontext except for non-blocking streams" - work on
 * it waits for the work queued before it on every blocking stream of its
 * context, and work on a blocking stream waits for the work queued before
 * it on the legacy stream. Streams created CU_STREAM_NON_BLOCKING do
 * neither. Caller holds mu. */
static void push(struct fc_stream *s, struct op *o) {
    struct fc_stream *legacy = s->ctx->legacy;
    if (s == legacy) {
        for (struct fc_stream *b = streams; b; b = b->next)
            if (b != s && b->ctx == s->ctx && !b->nonblocking) wait_for(s, b);
    } else if (legacy && !s->nonblocking) {
        wait_for(s, legacy);
    }
    link_op(s, o);
}

/* Caller holds mu: waits until `s` has done everything enqueued so far. */
static void drain(struct fc_stream *s) {
    uint64_t target = s->enqueued;
    while (s->done < target) pthread_cond_wait(&progress, &mu);
}

/* The stream work goes to: NULL means the current context's legacy stream.
 * Caller holds mu. */
static CUresult pick_stream(CUstream h, struct fc_stream **out) {
    struct fc_ctx *c = current();
    if (!h) {
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        if (!c->legacy && !(c->legacy = new_stream(c))) return CUDA_ERROR_OUT_OF_MEMORY;
        *out = c->legacy;
        return CUDA_SUCCESS;
    }
    if (!valid_stream(h)) return CUDA_ERROR_INVALID_HANDLE;
    if (h->ctx != c) return CUDA_ERROR_INVALID_CONTEXT; /* a stream of another context */
    *out = h;
    return CUDA_SUCCESS;
}

/* A stream handle as the synchronisation calls take it: a live stream of
 * any context, or NULL for the current context's legacy stream. Caller
 * holds mu. */
static CUresult stream_or_legacy(CUstream h, struct fc_stream **out) {
    if (!h) return pick_stream(NULL, out);
    if (!valid_stream(h)) return CUDA_ERROR_INVALID_HANDLE;
    *out = h;
    return CUDA_SUCCESS;
}

/* Whether host memory at `addr` is pageable for a copy in context `c`:
 * memory the driver never pinned, or pinned for another context without
 * PORTABLE ("considered as pinned memory by all CUDA contexts, not just
 * the one that performed the allocation" is what PORTABLE adds).
 * Caller holds mu. */
static int pageable_for(uint64_t addr, struct fc_ctx *c) {
    struct range *r = range_of(addr);
    if (!r) return 1;
    if (r->kind != K_HOST && r->kind != K_REGISTERED) return 0;
    return !r->portable && r->device != c->device;
}

/* Validates and enqueues one copy; *host_side says whether host memory is
 * involved (the synchronous cuMemcpy then waits). A copy that breaks an
 * access rule (ILLEGAL_ADDRESS) enqueues fine and faults when it runs.
 * Caller holds mu. */
static CUresult enqueue_copy(struct fc_stream *s, CUdeviceptr dst, CUdeviceptr src, size_t n, int *host_side) {
    char *d = NULL, *sp = NULL;
    int dd = 1, sd = 1;
    CUresult r;
    if ((r = resolve(dst, n, s->ctx->device, &d, &dd)) == CUDA_SUCCESS) r = resolve(src, n, s->ctx->device, &sp, &sd);
    int fault = r == CUDA_ERROR_ILLEGAL_ADDRESS;
    if (r && !fault) return r;
    if (host_side) *host_side = !dd || !sd || fault;
    if (!n) return CUDA_SUCCESS;
    struct op *o = calloc(1, sizeof *o);
    if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
    o->kind = fault ? OP_FAULT : OP_COPY;
    o->exporter = -1;
    /* Pageable memory, as the driver's "API synchronization behavior"
     * describes it: from pageable host memory the stream is synchronised
     * first and the bytes are staged at the call (later changes of the
     * buffer do not reach the copy); to pageable host memory the call
     * returns once the copy completed. */
    int from_pageable = !fault && !sd && pageable_for(src, s->ctx);
    int to_pageable = !fault && !dd && pageable_for(dst, s->ctx);
    if (from_pageable) {
        drain(s);
        if (!(o->staged = malloc(n))) {
            free(o);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(o->staged, sp, n);
    }
    struct range *imp = range_of(src);
    if (!imp || imp->kind != K_IPC_IMPORT) imp = range_of(dst);
    if (!fault && imp && imp->kind == K_IPC_IMPORT && imp->fd >= 0) o->exporter = fcntl(imp->fd, F_DUPFD_CLOEXEC, 0);
    o->dst = d;
    o->src = o->staged ? o->staged : sp;
    o->n = n;
    push(s, o);
    copies_on[s->ctx->device]++;
    if (to_pageable) drain(s);
    return CUDA_SUCCESS;
}

/* Live resources: device allocations, pinned host, host registrations, IPC
 * imports, VMM handles, reservations, streams not destroyed (legacy streams
 * excluded), events not destroyed. 0 when the lock could not be taken. */
static int count_live(unsigned long live[N_LIVE]) {
    memset(live, 0, N_LIVE * sizeof live[0]);
    /* At exit another thread may be inside the driver: wait for it, boundedly
     * (no driver call holds the lock while blocking). */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    if (pthread_mutex_timedlock(&mu, &until) != 0) return 0;
    for (struct range *r = ranges; r; r = r->next) {
        switch (r->kind) {
        case K_DEVICE: live[0]++; break;
        case K_HOST: live[1]++; break;
        case K_REGISTERED: live[2]++; break;
        case K_IPC_IMPORT: live[3]++; break;
        case K_RESERVED: live[5]++; break;
        case K_MANAGED: live[0]++; break;
        }
    }
    for (struct vmm *v = vmms; v; v = v->next) live[4]++;
    for (struct fc_stream *s = streams; s; s = s->next)
        if (!s->destroyed && s != s->ctx->legacy) live[6]++;
    for (struct fc_event *e = events; e; e = e->next) live[7]++;
    pthread_mutex_unlock(&mu);
    return 1;
}

/* ------------------------------------------------------------------ */
/* Initialization, devices, contexts                                   */

EXPORT CUresult cuInit(unsigned int flags) {
    ENTER(cuInit);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (n_devices <= 0) return CUDA_ERROR_NO_DEVICE;
    if (n_devices > MAX_DEVICES) n_devices = MAX_DEVICES;
    pthread_mutex_lock(&mu);
    for (int d = 0; d < n_devices; d++)
        if (contexts[d].magic != CTX_MAGIC) contexts[d] = (struct fc_ctx){.magic = CTX_MAGIC, .device = d};
    pthread_mutex_unlock(&mu);
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    ENTER(cuDriverGetVersion);
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = driver_version;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    ENTER(cuDeviceGetCount);
    NEED_INIT();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = n_devices;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    ENTER(cuDeviceGet);
    NEED_INIT();
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev) {
    ENTER(cuDeviceGetAttribute);
    NEED_INIT();
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case 41: *pi = 1; break;                        /* UNIFIED_ADDRESSING */
    case 75: *pi = 9; break;                        /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *pi = 0; break;                        /* COMPUTE_CAPABILITY_MINOR */
    case 102: *pi = 1; break;                       /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    case 103: *pi = 1; break;                       /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
    case 128: *pi = no_fabric || !fabric_state ? 0 : 1; break; /* HANDLE_TYPE_FABRIC_SUPPORTED */
    case 134: *pi = dev; break;                     /* HOST_NUMA_ID: device d sits on node d */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    ENTER(cuDeviceGetName);
    NEED_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
    if (device_name)
        snprintf(name, (size_t)len, "%s", device_name);
    else
        snprintf(name, (size_t)len, "fakecuda device %d", dev);
    return CUDA_SUCCESS;
}

typedef struct { char bytes[16]; } CUuuid;

/* Each physical device has one UUID, whatever ordinal a process sees it at. */
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    ENTER(cuDeviceGetUuid_v2);
    NEED_INIT();
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
    memcpy(uuid->bytes, "FAKECUDA-GPU-00", 15);
    uuid->bytes[15] = (char)(0x40 + physical_of[dev]);
    return CUDA_SUCCESS;
}

/* Whether physical devices p and q have a path (a device reaches itself). */
static int phys_reach(int p, int q) { return p == q || (!no_peer && !no_p2p[p & 7][q & 7]); }

static int peer_capable(CUdevice a, CUdevice b) { return a != b && phys_reach(physical_of[a], physical_of[b]); }

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    ENTER(cuDeviceCanAccessPeer);
    NEED_INIT();
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= n_devices || peer < 0 || peer >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
    *can = peer_capable(dev, peer);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetP2PAttribute(int *value, int attrib, CUdevice src, CUdevice dst) {
    ENTER(cuDeviceGetP2PAttribute);
    NEED_INIT();
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (src < 0 || src >= n_devices || dst < 0 || dst >= n_devices || src == dst) return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case 1: *value = 0; break;                         /* PERFORMANCE_RANK */
    case 2:                                            /* ACCESS_SUPPORTED */
    case 3:                                            /* NATIVE_ATOMIC_SUPPORTED */
    case 4: *value = peer_capable(src, dst); break;    /* CUDA_ARRAY_ACCESS_SUPPORTED */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    ENTER(cuDevicePrimaryCtxRetain);
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    contexts[dev].retained++;
    pthread_mutex_unlock(&mu);
    *pctx = &contexts[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    ENTER(cuDevicePrimaryCtxRelease_v2);
    NEED_INIT();
    if (dev < 0 || dev >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult r = contexts[dev].retained > 0 ? (contexts[dev].retained--, CUDA_SUCCESS) : CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    ENTER(cuCtxSetCurrent);
    NEED_INIT();
    if (c && (!valid_ctx(c) || !c->retained)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!c) {
        if (ctx_depth) ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (ctx_depth)
        ctx_stack[ctx_depth - 1] = c;
    else
        ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pc) {
    ENTER(cuCtxGetCurrent);
    NEED_INIT();
    if (!pc) return CUDA_ERROR_INVALID_VALUE;
    *pc = current();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
    ENTER(cuCtxPushCurrent_v2);
    NEED_INIT();
    if (!valid_ctx(c) || !c->retained) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 16) return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pc) {
    ENTER(cuCtxPopCurrent_v2);
    NEED_INIT();
    if (!ctx_depth) return CUDA_ERROR_INVALID_CONTEXT;
    struct fc_ctx *c = ctx_stack[--ctx_depth];
    if (pc) *pc = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev) {
    ENTER(cuCtxGetDevice);
    NEED_INIT();
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = current()->device;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
    ENTER(cuCtxEnablePeerAccess);
    NEED_INIT();
    struct fc_ctx *c = current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (flags || !valid_ctx(peer) || !peer->retained || peer == c) return CUDA_ERROR_INVALID_VALUE;
    if (!peer_capable(c->device, peer->device)) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    pthread_mutex_lock(&mu);
    CUresult r = c->peers & (1u << peer->device) ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
    c->peers |= 1u << peer->device;
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuCtxSynchronize(void) {
    ENTER(cuCtxSynchronize);
    NEED_INIT();
    struct fc_ctx *c = current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&mu);
    for (struct fc_stream *s = streams; s; s = s->next)
        if (s->ctx == c) drain(s);
    CUresult r = poison_of(c); /* a fault in what it waited for */
    pthread_mutex_unlock(&mu);
    return r;
}

/* ------------------------------------------------------------------ */
/* Device, pinned and registered memory                                */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    ENTER(cuMemAlloc_v2);
    NEED_INIT();
    if (!dptr || !size) return CUDA_ERROR_INVALID_VALUE;
    struct fc_ctx *c = current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    size_t len = round_up(size, GRANULARITY);
    pthread_mutex_lock(&mu);
    uint64_t id = next_id++;
    pthread_mutex_unlock(&mu);
    int fd = memfd_for(len, id, physical_of[c->device]);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    char *va = reserve(len);
    char *shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    struct range *r = calloc(1, sizeof *r);
    if (!va || shadow == MAP_FAILED || !r) {
        if (va) munmap(va, len);
        if (shadow != MAP_FAILED) munmap(shadow, len);
        free(r);
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(shadow, GARBAGE, len); /* the driver does not zero device memory */
    *r = (struct range){K_DEVICE, (uint64_t)(uintptr_t)va, size, shadow, fd, c->device, id, token, 0, NULL, NULL, 0};
    pthread_mutex_lock(&mu);
    r->next = ranges;
    ranges = r;
    pthread_mutex_unlock(&mu);
    *dptr = r->va;
    return CUDA_SUCCESS;
}

/* Unlinks and returns the range starting exactly at `va` of `kind`. Caller holds mu. */
static struct range *unlink_range(uint64_t va, enum kind kind) {
    for (struct range **p = &ranges; *p; p = &(*p)->next)
        if ((*p)->va == va && (*p)->kind == kind) {
            struct range *r = *p;
            *p = r->next;
            return r;
        }
    return NULL;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    ENTER(cuMemFree_v2);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct range *r = unlink_range(dptr, K_DEVICE);
    struct range *m = r ? NULL : unlink_range(dptr, K_MANAGED);
    pthread_mutex_unlock(&mu);
    if (m) {
        munmap((void *)(uintptr_t)m->va, m->len);
        free(m);
        return CUDA_SUCCESS;
    }
    if (!r) return CUDA_ERROR_INVALID_VALUE;
    size_t len = round_up(r->len, GRANULARITY);
    munmap((void *)(uintptr_t)r->va, len);
    munmap(r->shadow, len);
    close(r->fd);
    free(r);
    return CUDA_SUCCESS;
}

/* A memset of device memory queued on stream `h` (NULL: the legacy one),
 * asynchronous like the driver's. */
static CUresult memset_on(CUstream h, CUdeviceptr dptr, unsigned char value, size_t n) {
    pthread_mutex_lock(&mu);
    struct fc_stream *s;
    char *d;
    int dev_side;
    CUresult r = pick_stream(h, &s);
    if (!r) r = resolve(dptr, n, s->ctx->device, &d, &dev_side);
    if (!r && n) {
        struct op *o = calloc(1, sizeof *o);
        if (!o) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *o = (struct op){.kind = OP_SET, .dst = d, .n = n, .value = value};
            push(s, o);
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dptr, unsigned char value, size_t n) {
    ENTER(cuMemsetD8_v2);
    NEED_INIT();
    return memset_on(NULL, dptr, value, n);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dptr, unsigned char value, size_t n, CUstream h) {
    ENTER(cuMemsetD8Async);
    NEED_INIT();
    return memset_on(h, dptr, value, n);
}

static CUresult add_host_range(enum kind kind, void *p, size_t len, int portable) {
    struct range *r = calloc(1, sizeof *r);
    if (!r) return CUDA_ERROR_OUT_OF_MEMORY;
    int dev = current() ? current()->device : 0;
    *r = (struct range){kind, (uint64_t)(uintptr_t)p, len, p, -1, dev, 0, 0, 0, NULL, NULL, portable};
    pthread_mutex_lock(&mu);
    CUresult res = CUDA_SUCCESS;
    for (struct range *x = ranges; x; x = x->next)
        if (x->va < r->va + len && r->va < x->va + x->len) res = CUDA_ERROR_INVALID_VALUE; /* already known */
    if (res == CUDA_SUCCESS) {
        r->next = ranges;
        ranges = r;
    } else {
        free(r);
    }
    pthread_mutex_unlock(&mu);
    return res;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    ENTER(cuMemHostAlloc);
    NEED_INIT();
    if (!pp || !size) return CUDA_ERROR_INVALID_VALUE;
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, GARBAGE, size); /* nor pinned host memory */
    CUresult r = add_host_range(K_HOST, p, size, flags & 0x1 /* CU_MEMHOSTALLOC_PORTABLE */);
    if (r) {
        munmap(p, size);
        return r;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

/* Managed memory: CPU-accessible at its address, belonging to the current
 * context's device (the stand-in migrates nothing). */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    ENTER(cuMemAllocManaged);
    NEED_INIT();
    (void)flags;
    if (!dptr || !size) return CUDA_ERROR_INVALID_VALUE;
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = add_host_range(K_MANAGED, p, size, 1);
    if (r) {
        munmap(p, size);
        return r;
    }
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p) {
    ENTER(cuMemFreeHost);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct range *r = unlink_range((uint64_t)(uintptr_t)p, K_HOST);
    pthread_mutex_unlock(&mu);
    if (!r) return CUDA_ERROR_INVALID_VALUE;
    munmap(p, r->len);
    free(r);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
    ENTER(cuMemHostRegister_v2);
    NEED_INIT();
    if (!p || !size || !host_mapped((uint64_t)(uintptr_t)p, size)) return CUDA_ERROR_INVALID_VALUE;
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = add_host_range(K_REGISTERED, p, size, flags & 0x1 /* CU_MEMHOSTREGISTER_PORTABLE */);
    return r == CUDA_ERROR_INVALID_VALUE ? 712 /* CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED */ : r;
}

#ifndef FAKECUDA_OMIT_HOST_UNREGISTER
EXPORT CUresult cuMemHostUnregister(void *p) {
    ENTER(cuMemHostUnregister);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct range *r = unlink_range((uint64_t)(uintptr_t)p, K_REGISTERED);
    pthread_mutex_unlock(&mu);
    if (!r) return 713; /* CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED */
    free(r);
    return CUDA_SUCCESS;
}
#endif

EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
    ENTER(cuPointerGetAttribute);
    NEED_INIT();
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct range *r = range_of(ptr);
    struct piece *pc = NULL;
    if (r && r->kind == K_RESERVED)
        for (struct piece *p = r->pieces; p; p = p->next)
            if (ptr >= p->va && ptr - p->va < p->len) pc = p;
    CUresult res = CUDA_SUCCESS;
    if (!r || (r->kind == K_RESERVED && !pc)) {
        res = CUDA_ERROR_INVALID_VALUE; /* not memory the driver knows */
    } else if (attribute == 2) {        /* MEMORY_TYPE: 1 host, 2 device */
        int dev = pc ? pc->h->loc.type == LOC_DEVICE
                     : r->kind == K_DEVICE || r->kind == K_IPC_IMPORT || r->kind == K_MANAGED;
        *(unsigned int *)data = dev ? 2 : 1;
    } else if (attribute == 9) { /* DEVICE_ORDINAL */
        *(int *)data = pc && pc->h->loc.type == LOC_DEVICE ? pc->h->loc.id : r->device;
    } else if (attribute == 8) { /* IS_MANAGED */
        *(unsigned int *)data = r->kind == K_MANAGED;
    } else if (attribute == 10) { /* IS_LEGACY_CUDA_IPC_CAPABLE */
        *(unsigned int *)data = r->kind == K_DEVICE;
    } else if (attribute == 11) { /* RANGE_START_ADDR */
        *(CUdeviceptr *)data = r->va;
    } else if (attribute == 12) { /* RANGE_SIZE */
        *(size_t *)data = r->len;
    } else {
        res = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&mu);
    return res;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    ENTER(cuMemGetAddressRange_v2);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct range *r = range_of(dptr);
    CUresult res = CUDA_ERROR_NOT_FOUND;
    uint64_t base = 0;
    size_t size = 0;
    if (r && r->kind != K_RESERVED && r->kind != K_REGISTERED) {
        base = r->va;
        size = r->len;
        res = CUDA_SUCCESS;
    } else if (r && r->kind == K_RESERVED) {
        for (struct piece *p = r->pieces; p; p = p->next)
            if (dptr >= p->va && dptr - p->va < p->len) {
                base = p->va;
                size = p->len;
                res = CUDA_SUCCESS;
            }
    }
    pthread_mutex_unlock(&mu);
    if (res) return res;
    if (pbase) *pbase = base;
    if (psize) *psize = size;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Legacy IPC                                                          */

struct ipc_wire {
    uint32_t magic;
    uint32_t pid;
    int32_t fd;
    uint32_t device;
    uint64_t size;
    uint64_t id;
    uint64_t token;
    uint64_t check;
    int32_t phys; /* the exporter's physical device */
    char pad[12];
};
_Static_assert(sizeof(struct ipc_wire) == 64, "an IPC handle has 64 bytes");

static uint64_t checksum(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr) {
    ENTER(cuIpcGetMemHandle);
    NEED_INIT();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct range *r = range_of(dptr);
    CUresult res = CUDA_SUCCESS;
    struct ipc_wire w = {0};
    if (!r || r->kind != K_DEVICE) {
        res = CUDA_ERROR_INVALID_VALUE; /* only cuMemAlloc memory of this process */
    } else {
        w = (struct ipc_wire){IPC_MAGIC, (uint32_t)getpid(), r->fd, (uint32_t)r->device, r->len, r->id, token, 0, 0, {0}};
        w.phys = physical_of[r->device];
        w.check = checksum(&w, offsetof(struct ipc_wire, check));
    }
    pthread_mutex_unlock(&mu);
    if (res) return res;
    memcpy(handle->reserved, &w, sizeof w);
    return CUDA_SUCCESS;
}

/* Opens the memfd `fd` of process `pid` and checks it is the allocation
 * (`peer_token`, `id`) of at least `size` bytes. */
static int open_peer_memfd(uint32_t pid, int fd, uint64_t peer_token, uint64_t id, uint64_t size) {
    char path[64], link[128], want[96];
    snprintf(path, sizeof path, "/proc/%u/fd/%d", pid, fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0) return -1;
    link[n] = 0;
    snprintf(want, sizeof want, "/memfd:fakecuda-%016llx-%llu p", (unsigned long long)peer_token, (unsigned long long)id);
    if (strncmp(link, want, strlen(want)) != 0) return -1; /* a different file now */
    int f = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (f >= 0 && (fstat(f, &st) != 0 || (uint64_t)st.st_size < size)) {
        close(f);
        return -1;
    }
    return f;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
    ENTER(cuIpcOpenMemHandle_v2);
    NEED_INIT();
    if (!pdptr || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    struct fc_ctx *c = current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    struct ipc_wire w;
    memcpy(&w, handle.reserved, sizeof w);
    if (w.magic != IPC_MAGIC || w.check != checksum(&w, offsetof(struct ipc_wire, check))) return CUDA_ERROR_INVALID_VALUE;
    if (w.token == token) return CUDA_ERROR_INVALID_CONTEXT; /* opened in the exporting process */
    if (!phys_reach(physical_of[c->device], w.phys)) return CUDA_ERROR_INVALID_DEVICE; /* no path to the exporter's GPU */
    pthread_mutex_lock(&mu);
    for (struct range *r = ranges; r; r = r->next)
        if (r->kind == K_IPC_IMPORT && r->peer_token == w.token && r->id == w.id && r->device == c->device) {
            r->refs++;
            *pdptr = r->va;
            pthread_mutex_unlock(&mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&mu);
    int fd = open_peer_memfd(w.pid, w.fd, w.token, w.id, w.size);
    if (fd < 0) return CUDA_ERROR_INVALID_VALUE; /* the exporter or its allocation is gone */
    size_t len = round_up(w.size, GRANULARITY);
    char *va = reserve(len);
    char *shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    struct range *r = calloc(1, sizeof *r);
    if (!va || shadow == MAP_FAILED || !r) {
        if (va) munmap(va, len);
        if (shadow != MAP_FAILED) munmap(shadow, len);
        free(r);
        return 205; /* CUDA_ERROR_MAP_FAILED */
    }
    int exporter = (int)syscall(SYS_pidfd_open, (pid_t)w.pid, 0); /* -1 where the kernel has none */
    *r = (struct range){K_IPC_IMPORT, (uint64_t)(uintptr_t)va, w.size, shadow, exporter, c->device, w.id, w.token, 1, NULL, NULL, 0};
    pthread_mutex_lock(&mu);
    r->next = ranges;
    ranges = r;
    pthread_mutex_unlock(&mu);
    *pdptr = r->va;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    ENTER(cuIpcCloseMemHandle);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct range *r = NULL;
    for (struct range *x = ranges; x; x = x->next)
        if (x->kind == K_IPC_IMPORT && x->va == dptr) r = x;
    if (!r) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (--r->refs > 0) {
        pthread_mutex_unlock(&mu);
        return CUDA_SUCCESS;
    }
    unlink_range(dptr, K_IPC_IMPORT);
    pthread_mutex_unlock(&mu);
    if (r->fd >= 0) close(r->fd);
    size_t len = round_up(r->len, GRANULARITY);
    munmap((void *)(uintptr_t)r->va, len);
    munmap(r->shadow, len);
    free(r);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Virtual memory management                                           */

/* The IMEX channel this process uses: the lowest-numbered channelN file
 * of FAKECUDA_IMEX_DIR it may open read-write (the kernel decides, so a
 * channel another user owns is refused to this one); -1 without one. When
 * channels are not modelled every process uses channel 0. */
static int imex_channel(void) {
    if (!imex_dir[0]) return 0;
    DIR *d = opendir(imex_dir);
    if (!d) return -1;
    int best = -1;
    for (struct dirent *e; (e = readdir(d));) {
        int n, used = 0;
        if (sscanf(e->d_name, "channel%d%n", &n, &used) != 1 || e->d_name[used] || n < 0) continue;
        if (best >= 0 && n >= best) continue;
        int f = openat(dirfd(d), e->d_name, O_RDWR | O_CLOEXEC);
        if (f < 0) continue;
        close(f);
        best = n;
    }
    closedir(d);
    return best;
}

static CUresult check_prop(const CUmemAllocationProp *p) {
    if (!p || p->type != 1 /* PINNED */) return CUDA_ERROR_INVALID_VALUE;
    if (p->location.type == LOC_DEVICE) {
        if (p->location.id < 0 || p->location.id >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
    } else if (p->location.type == LOC_HOST_NUMA) {
        /* Nodes 0..7 exist; node d is attached to device d (when visible). */
        if (p->location.id < 0 || p->location.id >= MAX_DEVICES) return CUDA_ERROR_INVALID_VALUE;
    } else {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (p->requestedHandleTypes & ~(HANDLE_POSIX_FD | HANDLE_FABRIC)) return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    ENTER(cuMemGetAllocationGranularity);
    NEED_INIT();
    if (!g || (option != 0 && option != 1)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop);
    if (r) return r;
    *g = GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    ENTER(cuMemCreate);
    NEED_INIT();
    if (!handle || !size || size % GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop);
    if (r) return r;
    if ((prop->requestedHandleTypes & HANDLE_FABRIC) && !fabric_state) return CUDA_ERROR_NOT_SUPPORTED; /* no fabric */
    if ((prop->requestedHandleTypes & HANDLE_FABRIC) && (no_fabric == 1 || imex_channel() < 0))
        return CUDA_ERROR_NOT_PERMITTED; /* no IMEX channel this process may use */
    struct vmm *v = calloc(1, sizeof *v);
    if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    v->id = next_id++;
    pthread_mutex_unlock(&mu);
    v->phys = prop->location.type == LOC_DEVICE ? physical_of[prop->location.id] : -1;
    v->fd = memfd_for(size, v->id, v->phys);
    char *fill = v->fd < 0 ? MAP_FAILED : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
    if (fill == MAP_FAILED) {
        if (v->fd >= 0) close(v->fd);
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(fill, GARBAGE, size); /* nor VMM memory */
    munmap(fill, size);
    v->magic = VMM_MAGIC;
    v->size = size;
    v->handle_types = prop->requestedHandleTypes;
    v->loc = prop->location;
    pthread_mutex_lock(&mu);
    v->next = vmms;
    vmms = v;
    pthread_mutex_unlock(&mu);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    ENTER(cuMemRelease);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct vmm *v = valid_vmm(handle);
    CUresult r = v && (!v->released || v->retains) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        if (v->retains)
            v->retains--; /* a reference cuMemRetainAllocationHandle took */
        else
            v->released = 1;
        drop_vmm_if_unused(v);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* The handle of the VMM allocation mapped at `addr`, with one more
 * reference (given back by cuMemRelease). */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    ENTER(cuMemRetainAllocationHandle);
    NEED_INIT();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    pthread_mutex_lock(&mu);
    struct range *r = range_of(a);
    CUresult res = CUDA_ERROR_INVALID_VALUE; /* not a VMM mapping */
    if (r && r->kind == K_RESERVED)
        for (struct piece *p = r->pieces; p; p = p->next)
            if (a >= p->va && a - p->va < p->len) {
                p->h->retains++;
                *handle = (CUmemGenericAllocationHandle)(uintptr_t)p->h;
                res = CUDA_SUCCESS;
            }
    pthread_mutex_unlock(&mu);
    return res;
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle) {
    ENTER(cuMemGetAllocationPropertiesFromHandle);
    NEED_INIT();
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct vmm *v = valid_vmm(handle);
    CUresult r = v && (!v->released || v->retains) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        memset(prop, 0, sizeof *prop);
        prop->type = 1;
        prop->requestedHandleTypes = v->handle_types;
        prop->location = v->loc;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) {
    ENTER(cuMemAddressReserve);
    NEED_INIT();
    (void)addr; /* a hint only */
    if (!ptr || !size || size % GRANULARITY || flags || (alignment && (alignment & (alignment - 1))))
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment > GRANULARITY) return CUDA_ERROR_NOT_SUPPORTED;
    char *va = reserve(size);
    struct range *r = calloc(1, sizeof *r);
    if (!va || !r) {
        if (va) munmap(va, size);
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *r = (struct range){K_RESERVED, (uint64_t)(uintptr_t)va, size, NULL, -1, 0, 0, 0, 0, NULL, NULL, 0};
    pthread_mutex_lock(&mu);
    r->next = ranges;
    ranges = r;
    pthread_mutex_unlock(&mu);
    *ptr = r->va;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    ENTER(cuMemAddressFree);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct range *r = range_of(ptr);
    CUresult res = CUDA_SUCCESS;
    if (!r || r->kind != K_RESERVED || r->va != ptr || r->len != size)
        res = CUDA_ERROR_INVALID_VALUE;
    else if (r->pieces)
        res = CUDA_ERROR_INVALID_VALUE; /* still mapped */
    else
        unlink_range(ptr, K_RESERVED);
    pthread_mutex_unlock(&mu);
    if (res) return res;
    munmap((void *)(uintptr_t)ptr, size);
    free(r);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
    ENTER(cuMemMap);
    NEED_INIT();
    if (!size || flags || size % GRANULARITY || offset % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct range *r = range_of(ptr);
    struct vmm *v = valid_vmm(handle);
    CUresult res = CUDA_SUCCESS;
    if (!r || r->kind != K_RESERVED || size > r->len - (ptr - r->va) || !v || v->released ||
        offset + size > v->size) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (struct piece *p = r->pieces; p; p = p->next)
            if (p->va < ptr + size && ptr < p->va + p->len) res = CUDA_ERROR_ALREADY_MAPPED;
    }
    struct piece *p = NULL;
    if (!res) {
        p = calloc(1, sizeof *p);
        char *shadow = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, (off_t)offset);
        if (!p || shadow == MAP_FAILED) {
            free(p);
            res = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            /* No access for anyone yet, the CPU included: cuMemSetAccess grants it. */
            *p = (struct piece){ptr, size, offset, shadow, v, 0, 0, r->pieces};
            r->pieces = p;
            v->maps++;
        }
    }
    pthread_mutex_unlock(&mu);
    return res;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    ENTER(cuMemUnmap);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct range *r = range_of(ptr);
    CUresult res = CUDA_ERROR_INVALID_VALUE;
    if (r && r->kind == K_RESERVED) {
        for (struct piece **pp = &r->pieces; *pp; pp = &(*pp)->next) {
            struct piece *p = *pp;
            if (p->va == ptr && p->len == size) { /* whole mappings only */
                *pp = p->next;
                munmap(p->shadow, p->len);
                mmap((void *)(uintptr_t)p->va, p->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                     -1, 0);
                p->h->maps--;
                drop_vmm_if_unused(p->h);
                free(p);
                res = CUDA_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&mu);
    return res;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    ENTER(cuMemSetAccess);
    NEED_INIT();
    if (!desc || !count || !size) return CUDA_ERROR_INVALID_VALUE;
    unsigned grant = 0, revoke = 0;
    int cpu = -1; /* no host descriptor: the CPU's access stays as it is */
    for (size_t i = 0; i < count; i++) {
        const CUmemAccessDesc *d = &desc[i];
        if (d->flags != 0 && d->flags != 1 && d->flags != 3) return CUDA_ERROR_INVALID_VALUE;
        if (d->location.type == LOC_DEVICE) {
            if (d->location.id < 0 || d->location.id >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
            if (d->flags == 3)
                grant |= 1u << d->location.id;
            else
                revoke |= 1u << d->location.id;
        } else if (d->location.type == LOC_HOST_NUMA || d->location.type == LOC_HOST) {
            if (d->location.type == LOC_HOST_NUMA && (d->location.id < 0 || d->location.id >= MAX_DEVICES))
                return CUDA_ERROR_INVALID_VALUE; /* no such NUMA node */
            cpu = d->flags;
        } else {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_lock(&mu);
    struct range *r = range_of(ptr);
    CUresult res = CUDA_SUCCESS;
    if (!r || r->kind != K_RESERVED || size > r->len - (ptr - r->va)) res = CUDA_ERROR_INVALID_VALUE;
    /* Every byte of the range must be mapped. */
    for (uint64_t a = ptr; !res && a < ptr + size;) {
        struct piece *hit = NULL;
        for (struct piece *p = r->pieces; p; p = p->next)
            if (a >= p->va && a - p->va < p->len) hit = p;
        if (!hit)
            res = CUDA_ERROR_INVALID_VALUE;
        else
            a = hit->va + hit->len;
    }
    /* The CPU can be granted host memory (EGM) only, not device memory. */
    for (struct piece *p = r && !res && cpu >= 0 ? r->pieces : NULL; p; p = p->next)
        if (p->va < ptr + size && ptr < p->va + p->len && p->h->loc.type != LOC_HOST_NUMA) res = CUDA_ERROR_INVALID_VALUE;
    /* A device is granted only memory it has a path to; otherwise nothing
     * is granted. */
    for (struct piece *p = r && !res ? r->pieces : NULL; p; p = p->next)
        for (int d = 0; d < n_devices && p->va < ptr + size && ptr < p->va + p->len; d++)
            if ((grant >> d & 1) && p->h->phys >= 0 && !phys_reach(physical_of[d], p->h->phys)) {
                res = CUDA_ERROR_INVALID_DEVICE;
                access_refused++;
            }
    for (struct piece *p = r && !res ? r->pieces : NULL; p; p = p->next) {
        if (!(p->va < ptr + size && ptr < p->va + p->len)) continue;
        p->access = (p->access | grant) & ~revoke;
        if (cpu >= 0 && cpu != p->cpu) {
            int prot = cpu == 3 ? PROT_READ | PROT_WRITE : cpu == 1 ? PROT_READ : PROT_NONE;
            if (mmap((void *)(uintptr_t)p->va, p->len, prot, MAP_SHARED | MAP_FIXED, p->h->fd, (off_t)p->offset) ==
                MAP_FAILED) {
                res = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            p->cpu = cpu;
        }
    }
    pthread_mutex_unlock(&mu);
    return res;
}

struct fabric_wire {
    uint32_t magic;
    uint32_t pid;
    int32_t fd;
    int8_t loc_type, loc_id;
    int8_t phys; /* the allocation's physical device; -1: host memory */
    uint8_t handle_types;
    uint64_t size;
    uint64_t id;
    uint64_t token;
    /* The exporter's place in the simulated fabric. */
    uint32_t cluster, clique;
    int32_t channel;
    uint8_t state;
    char pad[3];
    uint64_t check;
};
_Static_assert(sizeof(struct fabric_wire) == 64, "a fabric handle has 64 bytes");

EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle handle, int type,
                                             unsigned long long flags) {
    ENTER(cuMemExportToShareableHandle);
    NEED_INIT();
    if (!out || flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct vmm *v = valid_vmm(handle);
    CUresult res = CUDA_SUCCESS;
    if (!v || (v->released && !v->retains))
        res = CUDA_ERROR_INVALID_VALUE;
    else if ((type != HANDLE_POSIX_FD && type != HANDLE_FABRIC) || !(v->handle_types & type))
        res = CUDA_ERROR_INVALID_VALUE; /* not requested at cuMemCreate */
    else if (type == HANDLE_FABRIC && (no_fabric || imex_channel() < 0))
        res = CUDA_ERROR_NOT_PERMITTED; /* no IMEX channel */
    if (!res && type == HANDLE_POSIX_FD) {
        int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            res = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *(int *)out = fd;
    } else if (!res) {
        struct fabric_wire w = {FABRIC_MAGIC,
                                (uint32_t)getpid(),
                                v->fd,
                                (int8_t)v->loc.type,
                                (int8_t)v->loc.id,
                                (int8_t)v->phys,
                                (uint8_t)v->handle_types,
                                v->size,
                                v->id,
                                token,
                                fabric_cluster,
                                fabric_clique[(v->phys >= 0 ? v->phys : v->loc.id) & 7],
                                imex_channel(),
                                (uint8_t)fabric_state,
                                {0},
                                0};
        w.check = checksum(&w, offsetof(struct fabric_wire, check));
        memcpy(out, &w, sizeof w);
    }
    pthread_mutex_unlock(&mu);
    return res;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle, int type) {
    ENTER(cuMemImportFromShareableHandle);
    NEED_INIT();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    int fd = -1;
    CUmemLocation loc = {LOC_DEVICE, 0};
    int types = type;
    uint64_t id = 0;
    int phys = -1;
    if (type == HANDLE_POSIX_FD) {
        fd = fcntl((int)(intptr_t)os_handle, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
        /* Only an allocation of this driver: its memfd names its device. */
        char path[64], link[128];
        unsigned long long t, i;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, link, sizeof link - 1);
        link[n > 0 ? n : 0] = 0;
        if (n <= 0 || sscanf(link, "/memfd:fakecuda-%llx-%llu p%d", &t, &i, &phys) != 3) {
            close(fd);
            return CUDA_ERROR_INVALID_VALUE; /* not an allocation */
        }
        id = i;
        for (int o = 0; phys >= 0 && o < n_devices; o++)
            if (physical_of[o] == phys) loc.id = o; /* the exporter's true location, as seen here */
    } else if (type == HANDLE_FABRIC) {
        if (!os_handle) return CUDA_ERROR_INVALID_VALUE;
        int channel = imex_channel();
        if (no_fabric || channel < 0) return CUDA_ERROR_NOT_PERMITTED;
        struct fabric_wire w;
        memcpy(&w, os_handle, sizeof w);
        if (w.magic != FABRIC_MAGIC || w.check != checksum(&w, offsetof(struct fabric_wire, check)))
            return CUDA_ERROR_INVALID_VALUE;
        /* The IMEX domain's refusals, all with one opaque status: another
         * channel, another cluster or clique, a side not registered. */
        struct fc_ctx *c = current();
        int here = physical_of[c ? c->device : 0] & 7;
        if (w.channel != channel || w.cluster != fabric_cluster || w.clique != fabric_clique[here] ||
            w.state != 3 || fabric_state != 3)
            return CUDA_ERROR_INVALID_HANDLE;
        fd = open_peer_memfd(w.pid, w.fd, w.token, w.id, w.size);
        if (fd < 0) return CUDA_ERROR_INVALID_VALUE; /* the exporter released it or exited */
        loc = (CUmemLocation){w.loc_type, w.loc_id};
        types = w.handle_types;
        id = w.id;
        phys = w.phys;
    } else {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0 || (size_t)st.st_size % GRANULARITY) {
        close(fd);
        return CUDA_ERROR_INVALID_VALUE; /* not a driver allocation */
    }
    struct vmm *v = calloc(1, sizeof *v);
    if (!v) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *v = (struct vmm){VMM_MAGIC, fd, (size_t)st.st_size, types, loc, 0, 0, 0, id, NULL, phys};
    pthread_mutex_lock(&mu);
    v->next = vmms;
    vmms = v;
    pthread_mutex_unlock(&mu);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Streams, events, copies                                             */

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags) {
    ENTER(cuStreamCreate);
    NEED_INIT();
    if (!ps || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    struct fc_ctx *c = current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&mu);
    struct fc_stream *s = new_stream(c);
    if (s) s->nonblocking = flags & 1; /* CU_STREAM_NON_BLOCKING */
    pthread_mutex_unlock(&mu);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    *ps = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    ENTER(cuStreamDestroy_v2);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = valid_stream(s) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (!r) {
        s->destroyed = 1; /* queued work still completes */
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuStreamSynchronize(CUstream h) {
    ENTER(cuStreamSynchronize);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct fc_stream *s;
    CUresult r = stream_or_legacy(h, &s);
    if (!r) r = poison_of(s->ctx);
    if (!r) drain(s);
    if (!r) r = poison_of(s->ctx); /* a fault in what it waited for */
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuStreamQuery(CUstream h) {
    ENTER(cuStreamQuery);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct fc_stream *s;
    CUresult r = stream_or_legacy(h, &s);
    if (!r) r = poison_of(s->ctx);
    if (!r && s->done < s->enqueued) r = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
    ENTER(cuEventCreate);
    NEED_INIT();
    if (!pe || flags > 0xf) return CUDA_ERROR_INVALID_VALUE;
    struct fc_ctx *c = current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    struct fc_event *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = EVENT_MAGIC;
    e->ctx = c;
    pthread_mutex_lock(&mu);
    e->next = events;
    events = e;
    pthread_mutex_unlock(&mu);
    *pe = e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    ENTER(cuEventDestroy_v2);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    for (struct fc_event **p = &events; *p; p = &(*p)->next)
        if (*p == e && e->magic == EVENT_MAGIC) {
            *p = e->next;
            /* Pending records or waits may still name it: its memory is kept. */
            e->magic = 0;
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream h) {
    ENTER(cuEventRecord);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct fc_stream *s = NULL;
    CUresult r = valid_event(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (!r) r = stream_or_legacy(h, &s);
    if (!r && s->ctx != e->ctx) r = CUDA_ERROR_INVALID_HANDLE; /* event and stream of different contexts */
    if (!r) r = poison_of(s->ctx);
    struct op *o = NULL;
    if (!r && !(o = calloc(1, sizeof *o))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!r) {
        o->kind = OP_RECORD;
        o->ev = e;
        o->gen = ++e->recorded;
        push(s, o);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuEventQuery(CUevent e) {
    ENTER(cuEventQuery);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = !valid_event(e)           ? CUDA_ERROR_INVALID_HANDLE
                 : poison_of(e->ctx)           ? poison_of(e->ctx)
                 : e->completed < e->recorded ? CUDA_ERROR_NOT_READY
                                              : CUDA_SUCCESS;
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
    ENTER(cuEventSynchronize);
    NEED_INIT();
    pthread_mutex_lock(&mu);
    CUresult r = valid_event(e) ? poison_of(e->ctx) : CUDA_ERROR_INVALID_HANDLE;
    if (!r) {
        uint64_t target = e->recorded;
        while (e->completed < target) pthread_cond_wait(&progress, &mu);
        r = poison_of(e->ctx); /* a fault in what it waited for */
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* cuStreamWaitValue32_v2: work queued later on the stream waits until the
 * 32-bit word at addr meets the condition of flags (GEQ, EQ, AND, NOR; the
 * FLUSH bit is accepted and has nothing to flush here). The driver takes
 * device memory or host memory mapped for the device; the stand-in takes
 * device memory of a device the stream's context can reach, and an
 * aligned address (the driver requires 4-byte alignment). */
EXPORT CUresult cuStreamWaitValue32_v2(CUstream h, CUdeviceptr addr, uint32_t value, unsigned int flags) {
    ENTER(cuStreamWaitValue32_v2);
    NEED_INIT();
    unsigned cond = flags & ~(1u << 30);
    if (cond > WAIT_VALUE_NOR || (addr & 3)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct fc_stream *s = NULL;
    char *p = NULL;
    int device_side = 0;
    CUresult r = stream_or_legacy(h, &s);
    if (!r) r = poison_of(s->ctx);
    if (!r) r = resolve(addr, 4, s->ctx->device, &p, &device_side);
    if (!r && !device_side) r = CUDA_ERROR_INVALID_VALUE;
    struct op *o = NULL;
    if (!r && !(o = calloc(1, sizeof *o))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!r) {
        o->kind = OP_WAIT_VALUE;
        o->dst = p;
        o->gen = value;
        o->flags = cond;
        push(s, o);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
    ENTER(cuStreamWaitEvent);
    NEED_INIT();
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct fc_stream *s = NULL;
    CUresult r = valid_event(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (!r) r = stream_or_legacy(h, &s);
    if (!r) r = poison_of(s->ctx);
    struct op *o = NULL;
    if (!r && !(o = calloc(1, sizeof *o))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!r) {
        o->kind = OP_WAIT;
        o->ev = e;
        o->gen = e->recorded;
        push(s, o);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult copy_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct fc_stream *s;
    CUresult r = pick_stream(h, &s);
    if (!r) r = enqueue_copy(s, dst, src, n, NULL);
    pthread_mutex_unlock(&mu);
    return r;
}

/* Synchronous copies: wait unless both sides are device memory (a
 * device-to-device cuMemcpy may return before the copy is done). */
static CUresult copy_sync(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    NEED_INIT();
    pthread_mutex_lock(&mu);
    struct fc_stream *s;
    int host_side = 0;
    CUresult r = pick_stream(NULL, &s);
    if (!r) r = enqueue_copy(s, dst, src, n, &host_side);
    if (!r && host_side) drain(s);
    if (!r && host_side) r = poison_of(s->ctx); /* a fault in the copy waited for */
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    ENTER(cuMemcpy);
    return copy_sync(dst, src, n);
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    ENTER(cuMemcpyDtoD_v2);
    return copy_sync(dst, src, n);
}
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    ENTER(cuMemcpyDtoH_v2);
    return copy_sync((CUdeviceptr)(uintptr_t)dst, src, n);
}
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    ENTER(cuMemcpyHtoD_v2);
    return copy_sync(dst, (CUdeviceptr)(uintptr_t)src, n);
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    ENTER(cuMemcpyAsync);
    return copy_async(dst, src, n, s);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    ENTER(cuMemcpyDtoDAsync_v2);
    return copy_async(dst, src, n, s);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    ENTER(cuMemcpyDtoHAsync_v2);
    return copy_async((CUdeviceptr)(uintptr_t)dst, src, n, s);
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    ENTER(cuMemcpyHtoDAsync_v2);
    return copy_async(dst, (CUdeviceptr)(uintptr_t)src, n, s);
}

#ifndef FAKECUDA_OMIT_BATCH
EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                      CUmemcpyAttributes *attrs, size_t *attrs_idxs, size_t num_attrs, CUstream h) {
    /* An injected failure is not free of effects: the driver may have
     * enqueued part of the batch before failing (here: the first half of
     * valid descriptors, in input order). */
    int injected;
    CUresult inj = enter_rule(F_cuMemcpyBatchAsync_v2, &injected);
    if (inj && !injected) return inj; /* a poisoned context: nothing enqueued */
    NEED_INIT();
    if (!dsts || !srcs || !sizes || !count || !attrs || !attrs_idxs || !num_attrs || num_attrs > count ||
        attrs_idxs[0] != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < num_attrs; i++) {
        if (attrs[i].srcAccessOrder < 1 || attrs[i].srcAccessOrder > 3) return CUDA_ERROR_INVALID_VALUE;
        if (i && attrs_idxs[i] <= attrs_idxs[i - 1]) return CUDA_ERROR_INVALID_VALUE;
        if (attrs_idxs[i] >= count) return CUDA_ERROR_INVALID_VALUE;
    }
    if (!h) return CUDA_ERROR_INVALID_VALUE; /* not on the legacy stream */
    pthread_mutex_lock(&mu);
    struct fc_stream *s;
    CUresult r = pick_stream(h, &s);
    /* Validate every copy before enqueuing any. */
    for (size_t i = 0; !r && i < count; i++) {
        char *d, *sp;
        int a, b;
        if ((r = resolve(dsts[i], sizes[i], s->ctx->device, &d, &a)) == CUDA_SUCCESS)
            r = resolve(srcs[i], sizes[i], s->ctx->device, &sp, &b);
        if (r == CUDA_ERROR_ILLEGAL_ADDRESS) r = CUDA_SUCCESS; /* faults when it runs */
    }
    if (inj) {
        for (size_t i = 0; !r && i < count / 2; i++) r = enqueue_copy(s, dsts[i], srcs[i], sizes[i], NULL);
        pthread_mutex_unlock(&mu);
        return inj;
    }
    /* No order is promised between the copies of a batch: run them last to first. */
    for (size_t i = count; !r && i-- > 0;) r = enqueue_copy(s, dsts[i], srcs[i], sizes[i], NULL);
    pthread_mutex_unlock(&mu);
    return r;
}
#endif
