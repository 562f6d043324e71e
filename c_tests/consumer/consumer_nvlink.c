/* An installed-package consumer of the CUDA side of the C ABI: two
 * processes (fork before any CUDA call), the source with
 * orbite_cuda_allocate_ipc memory, the requester with orbite_cuda_allocate
 * memory, one READ and one WRITE over ORBITE_TRANSPORT_NVLINK, bytes checked.
 * It needs no CUDA toolkit to build: the driver is loaded at run time, by
 * liborbite and (for filling and checking device memory) by this program
 * through dlopen.
 *
 * Exit 77 (skipped) only when liborbite itself says it was built without
 * CUDA; anything else that prevents the transfer (no driver, an allocation
 * refused, a wrong byte) fails with a nonzero status other than 77, so a
 * regression of the CUDA build can never pass as a skip. run.sh checks in
 * turn that a skip comes only from a build configured without CUDA. */
#include <dlfcn.h>
#include <orbite.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N (1u << 20)

typedef int (*cu_init_t)(unsigned);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_retain_t)(void **, int);
typedef int (*cu_set_current_t)(void *);
typedef int (*cu_memcpy_t)(unsigned long long, unsigned long long, size_t);
typedef int (*cu_sync_t)(void);

static cu_memcpy_t cu_memcpy;
static cu_sync_t cu_sync;

/* Binds device 0's primary context on this thread for the program's own
 * copies (liborbite restores whatever context was current). */
static int cuda_setup(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return -1;
  cu_init_t init = (cu_init_t)dlsym(h, "cuInit");
  cu_device_get_t get = (cu_device_get_t)dlsym(h, "cuDeviceGet");
  cu_retain_t retain = (cu_retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
  cu_set_current_t set = (cu_set_current_t)dlsym(h, "cuCtxSetCurrent");
  cu_memcpy = (cu_memcpy_t)dlsym(h, "cuMemcpy");
  cu_sync = (cu_sync_t)dlsym(h, "cuCtxSynchronize");
  void *ctx = NULL;
  int dev = 0;
  if (!init || !get || !retain || !set || !cu_memcpy || !cu_sync) return -1;
  if (init(0) || get(&dev, 0) || retain(&ctx, dev) || set(ctx)) return -1;
  return 0;
}

static int copy(void *dst, const void *src) {
  return cu_memcpy((unsigned long long)(uintptr_t)dst, (unsigned long long)(uintptr_t)src, N) || cu_sync();
}

static uint8_t pat(size_t i) { return (uint8_t)(i * 13u + 5u); }

static void put_line(int fd, const char *s) {
  if (write(fd, s, strlen(s)) != (ssize_t)strlen(s)) exit(90);
}

static void get_line(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap && read(fd, buf + n, 1) == 1 && buf[n] != '\n') n++;
  buf[n] = '\0';
}

/* The one reason to skip: this liborbite has no CUDA layer at all. */
static const char NO_CUDA_BUILD[] = "this build of liborbite has no CUDA support";

static int source(int in, int out) {
  orbite_allocation *a = NULL;
  orbite_status st = orbite_cuda_allocate_ipc(0, N, &a);
  if (st == ORBITE_STATUS_UNAVAILABLE && strstr(orbite_last_error(), NO_CUDA_BUILD)) {
    fprintf(stderr, "consumer_nvlink: %s\n", orbite_last_error());
    return 77;
  }
  if (st) {
    fprintf(stderr, "consumer_nvlink: orbite_cuda_allocate_ipc: %s: %s\n", orbite_status_name(st),
            orbite_last_error());
    return 21;
  }
  if (cuda_setup()) {
    fprintf(stderr, "consumer_nvlink: libcuda.so.1 cannot be loaded or initialised by this program\n");
    return 19;
  }
  orbite_engine *e = NULL;
  uint64_t region;
  if (orbite_engine_new("{\"nvlink\": true}", &e)) return 20;
  uint8_t *host = malloc(N);
  for (size_t i = 0; i < N; i++) host[i] = pat(i);
  if (copy(orbite_allocation_addr(a), host)) return 22;
  if (orbite_register_memory(e, orbite_allocation_addr(a), N, ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, &region))
    return 23;
  char ep[128], line[256];
  size_t len;
  if (orbite_engine_endpoint(e, ep, sizeof ep, &len)) return 24;
  snprintf(line, sizeof line, "%s %llu\n", ep, (unsigned long long)(uintptr_t)orbite_allocation_addr(a));
  put_line(out, line);
  get_line(in, line, sizeof line); /* "check": the WRITE put 0x5a over the first half */
  if (copy(host, orbite_allocation_addr(a))) return 25;
  for (size_t i = 0; i < N; i++)
    if (host[i] != (i < N / 2 ? 0x5a : pat(i))) return 26;
  put_line(out, "ok\n");
  get_line(in, line, sizeof line);
  if (orbite_close(e, 30000)) return 27;
  orbite_engine_free(e);
  if (orbite_allocation_free(a)) return 28;
  free(host);
  return 0;
}

static int requester(int in, int out) {
  char line[256], ep[128];
  unsigned long long remote = 0;
  get_line(in, line, sizeof line);
  if (sscanf(line, "%127s %llu", ep, &remote) != 2) return 40;
  if (cuda_setup()) return 41;
  orbite_engine *e = NULL;
  orbite_allocation *l = NULL;
  uint64_t region, peer;
  if (orbite_engine_new("{\"nvlink\": true}", &e) || orbite_cuda_allocate(0, N, &l)) return 42;
  if (orbite_register_memory(e, orbite_allocation_addr(l), N, 0, &region)) return 43;
  if (orbite_connect(e, ep, 30000, &peer)) return 44;
  orbite_submit_options opts = {ORBITE_TRANSPORT_NVLINK, 60000};
  orbite_request r = {ORBITE_OP_READ, (uint64_t)(uintptr_t)orbite_allocation_addr(l), remote, N};
  orbite_batch *b = NULL;
  if (orbite_submit(e, peer, &r, 1, &opts, &b) || orbite_batch_wait(b, 60000)) return 45;
  orbite_batch_free(b);
  uint8_t *host = malloc(N);
  if (copy(host, orbite_allocation_addr(l))) return 46;
  for (size_t i = 0; i < N; i++)
    if (host[i] != pat(i)) return 47;
  memset(host, 0x5a, N);
  if (copy(orbite_allocation_addr(l), host)) return 48;
  orbite_request w = {ORBITE_OP_WRITE, (uint64_t)(uintptr_t)orbite_allocation_addr(l), remote, N / 2};
  if (orbite_submit(e, peer, &w, 1, &opts, &b) || orbite_batch_wait(b, 60000)) return 49;
  orbite_batch_free(b);
  put_line(out, "check\n");
  get_line(in, line, sizeof line);
  if (strcmp(line, "ok") != 0) return 50;
  if (orbite_close(e, 30000)) return 51;
  orbite_engine_free(e);
  if (orbite_allocation_free(l)) return 52;
  free(host);
  put_line(out, "done\n");
  return 0;
}

int main(void) {
  int to_child[2], to_parent[2];
  if (pipe(to_child) || pipe(to_parent)) return 2;
  pid_t pid = fork();
  if (pid == 0) {
    close(to_child[1]);
    close(to_parent[0]);
    _exit(source(to_child[0], to_parent[1]));
  }
  /* Only the other side holds these ends: a dead peer reads as EOF. */
  close(to_child[0]);
  close(to_parent[1]);
  int rc = requester(to_parent[0], to_child[1]);
  int status = 0;
  if (rc) kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  int child = WIFEXITED(status) ? WEXITSTATUS(status) : 99;
  if (child == 77) {
    printf("consumer_nvlink: skipped: %s\n", NO_CUDA_BUILD);
    return 77;
  }
  printf("consumer_nvlink (liborbite %s): requester %d, source %d\n", orbite_version(), rc, child);
  return rc || child ? 1 : 0;
}
