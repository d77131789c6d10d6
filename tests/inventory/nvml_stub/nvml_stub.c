/*
 * A scriptable stand-in for libnvidia-ml.so.1, built by the inventory tests.
 *
 * It exports the NVML entry points the inventory's pynvml adapter calls, with the real C
 * signatures and struct layouts, so that unmodified pynvml runs its real ctypes code path against
 * it. Devices are described by a control file beside the library (nvml_stub.conf), re-read at
 * nvmlInit and at every nvmlDeviceGetCount_v2, so a test can change a GPU between two reads.
 * Health events are lines appended to nvml_stub.events ("<device> <event type> <data>"); each
 * line is delivered once through nvmlEventSetWait_v2.
 *
 * Control file lines (one setting per line, '#' starts a comment):
 *   init_error <nvml return code>         nvmlInit fails with this code
 *   driver <version>
 *   count <n>                             how many devices NVML reports
 *   topology <i> <j> <level>              common ancestor of devices i and j (both directions)
 *   p2p_nvlink <i> <j>                    P2P over NVLink between i and j is OK
 *   dev <i> uuid|name|bus_id <text>
 *   dev <i> mem_total_mib|mem_used_mib|util|temp|power_mw|sm_clock|sm_clock_max <n>
 *   dev <i> numa|mig|lost <n>             lost 1: every call on this device says GPU_IS_LOST
 *   dev <i> power_unsupported 1           nvmlDeviceGetPowerUsage says NOT_SUPPORTED
 *   dev <i> nvlink <link> <peer device>   an active NVLink from device i to device peer
 *   dev <i> proc <pid> <used MiB>         a running compute process
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEVICES 8
#define MAX_LINKS 36
#define MAX_PROCS 16

enum {
    OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7,
    TIMEOUT = 10, GPU_IS_LOST = 15,
};

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct stub_device {
    int index;
    char uuid[96], name[96], bus_id[32];
    unsigned long long mem_total_mib, mem_used_mib;
    unsigned int util, temp, power_mw, sm_clock, sm_clock_max, mig, lost, power_unsupported;
    int numa;
    int link_peer[MAX_LINKS]; /* -1 = link inactive */
    int nprocs;
    unsigned int proc_pid[MAX_PROCS];
    unsigned long long proc_mib[MAX_PROCS];
    unsigned long long registered_events;
} stub_device;

typedef struct {
    stub_device *device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

typedef struct stub_event_set { int unused; } stub_event_set;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static stub_device devices[MAX_DEVICES];
static int topology[MAX_DEVICES][MAX_DEVICES];
static int p2p_nvlink[MAX_DEVICES][MAX_DEVICES];
static unsigned int device_count;
static int init_error;
static int initialized;
static char driver[80];
static long events_delivered;
static stub_event_set the_event_set;

static const char *beside_library(const char *file, char *out, size_t size) {
    Dl_info info;
    char path[4096];
    dladdr((void *)&beside_library, &info);
    snprintf(path, sizeof path, "%s", info.dli_fname);
    snprintf(out, size, "%s/%s", dirname(path), file);
    return out;
}

/* Copy text, truncated to the destination like NVML's fixed-size buffers. */
static void set_text(char *out, size_t size, const char *text) {
    size_t n = strlen(text);
    if (n >= size) n = size - 1;
    memcpy(out, text, n);
    out[n] = 0;
}

static void reset_locked(void) {
    memset(devices, 0, sizeof devices);
    memset(topology, 0, sizeof topology);
    memset(p2p_nvlink, 0, sizeof p2p_nvlink);
    device_count = 0;
    init_error = 0;
    snprintf(driver, sizeof driver, "stub");
    for (int i = 0; i < MAX_DEVICES; i++) {
        devices[i].index = i;
        devices[i].numa = -1;
        for (int l = 0; l < MAX_LINKS; l++) devices[i].link_peer[l] = -1;
    }
}

static void load_control_locked(void) {
    char path[4096], line[512];
    unsigned long long registered[MAX_DEVICES];
    for (int i = 0; i < MAX_DEVICES; i++) registered[i] = devices[i].registered_events;
    reset_locked();
    for (int i = 0; i < MAX_DEVICES; i++) devices[i].registered_events = registered[i];
    FILE *f = fopen(beside_library("nvml_stub.conf", path, sizeof path), "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char key[64] = "", text[256] = "";
        int i, j, a, b;
        unsigned long long n;
        line[strcspn(line, "#\n")] = 0;
        if (sscanf(line, "init_error %d", &a) == 1) init_error = a;
        else if (sscanf(line, "driver %79s", driver) == 1) continue;
        else if (sscanf(line, "count %d", &a) == 1) device_count = a < MAX_DEVICES ? a : MAX_DEVICES;
        else if (sscanf(line, "topology %d %d %d", &i, &j, &a) == 3) {
            if (i < MAX_DEVICES && j < MAX_DEVICES) topology[i][j] = topology[j][i] = a;
        } else if (sscanf(line, "p2p_nvlink %d %d", &i, &j) == 2) {
            if (i < MAX_DEVICES && j < MAX_DEVICES) p2p_nvlink[i][j] = p2p_nvlink[j][i] = 1;
        } else if (sscanf(line, "dev %d %63s", &i, key) == 2 && i >= 0 && i < MAX_DEVICES) {
            stub_device *d = &devices[i];
            const char *rest = strstr(line, key) + strlen(key);
            while (*rest == ' ') rest++;
            snprintf(text, sizeof text, "%s", rest);
            if (!strcmp(key, "uuid")) set_text(d->uuid, sizeof d->uuid, text);
            else if (!strcmp(key, "name")) set_text(d->name, sizeof d->name, text);
            else if (!strcmp(key, "bus_id")) set_text(d->bus_id, sizeof d->bus_id, text);
            else if (!strcmp(key, "nvlink") && sscanf(text, "%d %d", &a, &b) == 2) {
                if (a >= 0 && a < MAX_LINKS) d->link_peer[a] = b;
            } else if (!strcmp(key, "proc") && sscanf(text, "%d %llu", &a, &n) == 2) {
                if (d->nprocs < MAX_PROCS) {
                    d->proc_pid[d->nprocs] = a;
                    d->proc_mib[d->nprocs++] = n;
                }
            } else if (sscanf(text, "%llu", &n) == 1) {
                if (!strcmp(key, "mem_total_mib")) d->mem_total_mib = n;
                else if (!strcmp(key, "mem_used_mib")) d->mem_used_mib = n;
                else if (!strcmp(key, "util")) d->util = n;
                else if (!strcmp(key, "temp")) d->temp = n;
                else if (!strcmp(key, "power_mw")) d->power_mw = n;
                else if (!strcmp(key, "power_unsupported")) d->power_unsupported = n;
                else if (!strcmp(key, "sm_clock")) d->sm_clock = n;
                else if (!strcmp(key, "sm_clock_max")) d->sm_clock_max = n;
                else if (!strcmp(key, "numa")) d->numa = (int)n;
                else if (!strcmp(key, "mig")) d->mig = n;
                else if (!strcmp(key, "lost")) d->lost = n;
            }
        }
    }
    fclose(f);
}

/* Every per-device call goes through this: a bad handle or a lost GPU fails like NVML does. */
static int check(stub_device *d) {
    if (!initialized) return UNINITIALIZED;
    if (!d || d < devices || d >= devices + MAX_DEVICES) return INVALID_ARGUMENT;
    if ((unsigned)d->index >= device_count) return INVALID_ARGUMENT;
    if (d->lost) return GPU_IS_LOST;
    return OK;
}

#define CHECK(d) do { int rc_ = check(d); if (rc_) return rc_; } while (0)

static int copy_text(char *out, unsigned int length, const char *text) {
    if (strlen(text) + 1 > length) return INSUFFICIENT_SIZE;
    snprintf(out, length, "%s", text);
    return OK;
}

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    load_control_locked();
    int rc = init_error;
    if (!rc) {
        initialized = 1;
        events_delivered = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    initialized = 0;
    return OK;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case TIMEOUT: return "Timeout";
    case GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return UNINITIALIZED;
    return copy_text(version, length, driver);
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return UNINITIALIZED;
    pthread_mutex_lock(&lock);
    load_control_locked();
    *count = device_count;
    pthread_mutex_unlock(&lock);
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, stub_device **device) {
    if (!initialized) return UNINITIALIZED;
    if (index >= device_count) return INVALID_ARGUMENT;
    if (devices[index].lost) return GPU_IS_LOST;
    *device = &devices[index];
    return OK;
}

int nvmlDeviceGetUUID(stub_device *d, char *uuid, unsigned int length) {
    CHECK(d);
    return copy_text(uuid, length, d->uuid);
}

int nvmlDeviceGetName(stub_device *d, char *name, unsigned int length) {
    CHECK(d);
    return copy_text(name, length, d->name);
}

int nvmlDeviceGetMemoryInfo(stub_device *d, nvmlMemory_t *memory) {
    CHECK(d);
    memory->total = d->mem_total_mib << 20;
    memory->used = d->mem_used_mib << 20;
    memory->free = memory->total - memory->used;
    return OK;
}

int nvmlDeviceGetUtilizationRates(stub_device *d, nvmlUtilization_t *utilization) {
    CHECK(d);
    utilization->gpu = d->util;
    utilization->memory = d->util / 2;
    return OK;
}

int nvmlDeviceGetTemperature(stub_device *d, int sensor, unsigned int *temp) {
    CHECK(d);
    if (sensor != 0) return INVALID_ARGUMENT;
    *temp = d->temp;
    return OK;
}

int nvmlDeviceGetPowerUsage(stub_device *d, unsigned int *milliwatts) {
    CHECK(d);
    if (d->power_unsupported) return NOT_SUPPORTED;
    *milliwatts = d->power_mw;
    return OK;
}

int nvmlDeviceGetClockInfo(stub_device *d, int type, unsigned int *clock) {
    CHECK(d);
    if (type != 1) return NOT_SUPPORTED; /* only NVML_CLOCK_SM */
    *clock = d->sm_clock;
    return OK;
}

int nvmlDeviceGetMaxClockInfo(stub_device *d, int type, unsigned int *clock) {
    CHECK(d);
    if (type != 1) return NOT_SUPPORTED;
    *clock = d->sm_clock_max;
    return OK;
}

static void fill_pci(stub_device *d, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", d->bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", d->bus_id);
    sscanf(d->bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = 0x20b010de;
}

int nvmlDeviceGetPciInfo_v3(stub_device *d, nvmlPciInfo_t *pci) {
    CHECK(d);
    fill_pci(d, pci);
    return OK;
}

int nvmlDeviceGetNumaNodeId(stub_device *d, int *node) {
    CHECK(d);
    if (d->numa < 0) return NOT_SUPPORTED;
    *node = d->numa;
    return OK;
}

int nvmlDeviceGetTopologyCommonAncestor(stub_device *a, stub_device *b, int *level) {
    CHECK(a);
    CHECK(b);
    *level = topology[a->index][b->index];
    return OK;
}

int nvmlDeviceGetP2PStatus(stub_device *a, stub_device *b, int caps_index, int *status) {
    CHECK(a);
    CHECK(b);
    if (caps_index != 2) return NOT_SUPPORTED; /* only NVML_P2P_CAPS_INDEX_NVLINK */
    *status = p2p_nvlink[a->index][b->index] ? 0 : 4; /* OK or NOT_SUPPORTED status */
    return OK;
}

int nvmlDeviceGetNvLinkState(stub_device *d, unsigned int link, unsigned int *active) {
    CHECK(d);
    if (link >= MAX_LINKS) return INVALID_ARGUMENT;
    *active = d->link_peer[link] >= 0;
    return OK;
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(stub_device *d, unsigned int link, nvmlPciInfo_t *pci) {
    CHECK(d);
    if (link >= MAX_LINKS || d->link_peer[link] < 0) return INVALID_ARGUMENT;
    fill_pci(&devices[d->link_peer[link]], pci);
    return OK;
}

int nvmlDeviceGetMigMode(stub_device *d, unsigned int *current, unsigned int *pending) {
    CHECK(d);
    *current = d->mig;
    *pending = d->mig;
    return OK;
}

int nvmlDeviceGetComputeRunningProcesses_v3(
    stub_device *d, unsigned int *count, nvmlProcessInfo_t *infos) {
    CHECK(d);
    if (d->nprocs == 0) {
        *count = 0;
        return OK;
    }
    if (!infos || *count < (unsigned)d->nprocs) {
        *count = d->nprocs;
        return INSUFFICIENT_SIZE;
    }
    for (int p = 0; p < d->nprocs; p++) {
        infos[p].pid = d->proc_pid[p];
        infos[p].usedGpuMemory = d->proc_mib[p] << 20;
        infos[p].gpuInstanceId = 0xFFFFFFFF;
        infos[p].computeInstanceId = 0xFFFFFFFF;
    }
    *count = d->nprocs;
    return OK;
}

int nvmlEventSetCreate(stub_event_set **set) {
    if (!initialized) return UNINITIALIZED;
    *set = &the_event_set;
    return OK;
}

int nvmlDeviceRegisterEvents(stub_device *d, unsigned long long types, stub_event_set *set) {
    CHECK(d);
    if (set != &the_event_set) return INVALID_ARGUMENT;
    d->registered_events |= types;
    return OK;
}

int nvmlEventSetFree(stub_event_set *set) {
    if (set != &the_event_set) return INVALID_ARGUMENT;
    for (int i = 0; i < MAX_DEVICES; i++) devices[i].registered_events = 0;
    return OK;
}

/* The next undelivered line of the events file, if any; 1 when one was taken. */
static int take_event(nvmlEventData_t *data) {
    char path[4096], line[256];
    int taken = 0;
    pthread_mutex_lock(&lock);
    FILE *f = fopen(beside_library("nvml_stub.events", path, sizeof path), "r");
    if (f) {
        long number = 0;
        while (fgets(line, sizeof line, f)) {
            int device;
            unsigned long long type, value;
            if (sscanf(line, "%d %llu %llu", &device, &type, &value) != 3) continue;
            if (number++ < events_delivered) continue;
            events_delivered = number;
            if (device < 0 || device >= MAX_DEVICES) continue;
            if (!(devices[device].registered_events & type)) continue;
            memset(data, 0, sizeof *data);
            data->device = &devices[device];
            data->eventType = type;
            data->eventData = value;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
            taken = 1;
            break;
        }
        fclose(f);
    }
    pthread_mutex_unlock(&lock);
    return taken;
}

int nvmlEventSetWait_v2(stub_event_set *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (!initialized) return UNINITIALIZED;
    if (set != &the_event_set) return INVALID_ARGUMENT;
    struct timespec step = {0, 5 * 1000 * 1000};
    for (unsigned int waited = 0;; waited += 5) {
        if (take_event(data)) return OK;
        if (waited >= timeout_ms) return TIMEOUT;
        nanosleep(&step, NULL);
    }
}
