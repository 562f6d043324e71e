/* transfer_demo: two processes move data with liborbite over loopback.
 *
 * The child process is the *source*: it registers two buffers and publishes
 * its endpoint: plain heap memory (which travels over TCP) and memory from
 * orbite_host_allocate_shared (which a peer on the same host reaches over
 * SHM, shared memory). The parent is the *requester*: it connects, READs
 * each buffer, WRITEs into it, checks every byte and prints what moved, over
 * which transport and how fast. Copy from here: every call below is the
 * whole pattern.
 *
 * Usage: transfer_demo [MiB] [--stats]   (default 64 MiB; --stats also
 *        prints the requester's whole stats JSON)
 */
#include <orbite.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOCK (1u << 20) /* one request per MiB */

/* Print the failing call with its status name and message, then exit. */
#define TRY(call)                                                                         \
  do {                                                                                    \
    orbite_status s_ = (call);                                                            \
    if (s_ != ORBITE_STATUS_OK) {                                                         \
      fprintf(stderr, "%s failed: %s: %s\n", #call, orbite_status_name(s_), orbite_last_error()); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint8_t pattern(size_t i) { return (uint8_t)(i * 131u + (i >> 20)); }
static uint8_t inverted(size_t i) { return (uint8_t)(255u - pattern(i)); }

/* The source: register a buffer, tell the parent where it is, serve until told to stop. */
static int run_source(size_t bytes, int to_parent, int from_parent) {
  /* Heap memory: any peer can reach it over TCP. */
  uint8_t *heap = malloc(bytes);
  /* Library shared memory: a peer on this host reaches it over SHM. */
  orbite_allocation *alloc = NULL;
  TRY(orbite_host_allocate_shared(bytes, &alloc));
  uint8_t *shared = orbite_allocation_addr(alloc);
  for (size_t i = 0; i < bytes; i++) heap[i] = shared[i] = pattern(i);

  orbite_engine *engine = NULL;
  TRY(orbite_engine_new(NULL, &engine)); /* defaults: listen on 127.0.0.1, port from the OS */
  uint64_t r1 = 0, r2 = 0;
  TRY(orbite_register_memory(engine, heap, bytes, ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, &r1));
  TRY(orbite_register_memory(engine, shared, bytes, ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, &r2));

  char endpoint[128];
  size_t len = 0;
  TRY(orbite_engine_endpoint(engine, endpoint, sizeof endpoint, &len));
  dprintf(to_parent, "%s %llu %llu\n", endpoint, (unsigned long long)(uintptr_t)heap,
          (unsigned long long)(uintptr_t)shared);

  char c;
  if (read(from_parent, &c, 1) != 1) c = 0; /* the parent says when it is done */
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; i++) wrong += (heap[i] != inverted(i)) + (shared[i] != inverted(i));
  dprintf(to_parent, "%zu\n", wrong);

  TRY(orbite_close(engine, 10000)); /* waits for requests being served and exports */
  orbite_engine_free(engine);
  TRY(orbite_allocation_free(alloc)); /* unregistered by close: now it can go */
  free(heap);
  return 0;
}

/* Submit one request per MiB over `transport` and wait; returns seconds taken. */
static double move(orbite_engine *e, uint64_t peer, uint32_t transport, uint32_t op, uint8_t *local, uint64_t remote,
                   size_t bytes) {
  size_t n = bytes / BLOCK;
  orbite_request *reqs = calloc(n, sizeof *reqs);
  for (size_t i = 0; i < n; i++) {
    reqs[i].opcode = op;
    reqs[i].local_addr = (uint64_t)(uintptr_t)(local + i * BLOCK);
    reqs[i].remote_addr = remote + i * BLOCK;
    reqs[i].length = BLOCK;
  }
  orbite_submit_options opts = {transport, 60000}; /* ORBITE_TRANSPORT_AUTO would pick the best */
  orbite_batch *batch = NULL;
  double t0 = now_s();
  TRY(orbite_submit(e, peer, reqs, n, &opts, &batch)); /* returns once admitted */
  orbite_status s = orbite_batch_wait(batch, 60000);
  double dt = now_s() - t0;
  if (s != ORBITE_STATUS_OK) {
    /* Per-request outcomes tell exactly what happened to each request. */
    orbite_request_result *res = calloc(n, sizeof *res);
    TRY(orbite_batch_results(batch, res, n));
    for (size_t i = 0; i < n; i++)
      if (res[i].status != ORBITE_STATUS_OK)
        fprintf(stderr, "request %zu: %s (remote effect %u)\n", i, orbite_status_name(res[i].status), res[i].remote_effect);
    exit(1);
  }
  orbite_batch_free(batch);
  free(reqs);
  return dt;
}

int main(int argc, char **argv) {
  size_t mib = 64;
  int print_stats = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--stats") == 0) print_stats = 1;
    else mib = (size_t)atoi(argv[i]);
  }
  if (mib == 0) mib = 1;
  size_t bytes = mib * BLOCK;
  int up[2], down[2];
  if (pipe(up) || pipe(down)) return 1;
  pid_t pid = fork(); /* fork before creating any engine: engines own threads */
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    _exit(run_source(bytes, up[1], down[0]));
  }
  close(up[1]);
  close(down[0]);
  FILE *from_child = fdopen(up[0], "r");
  char endpoint[128];
  unsigned long long remote_heap = 0, remote_shared = 0;
  if (fscanf(from_child, "%127s %llu %llu", endpoint, &remote_heap, &remote_shared) != 3) return 1;

  /* A small SHM relocation cache keeps the source's memory mapped between
     submissions (each one is still validated by the source). */
  orbite_engine *engine = NULL;
  TRY(orbite_engine_new("{\"shm_cache_entries\": 4}", &engine));
  uint8_t *local = malloc(bytes);
  memset(local, 0, bytes);
  uint64_t region = 0;
  TRY(orbite_register_memory(engine, local, bytes, 0, &region)); /* 0: peers may not touch it */
  uint64_t peer = 0;
  TRY(orbite_connect(engine, endpoint, 10000, &peer));
  printf("requester pid %d connected to source pid %d at %s\n", (int)getpid(), (int)pid, endpoint);

  size_t wrong = 0;
  struct {
    const char *name;
    uint32_t transport;
    uint64_t remote;
  } runs[2] = {{"TCP", ORBITE_TRANSPORT_TCP, remote_heap}, {"SHM", ORBITE_TRANSPORT_SHM, remote_shared}};
  for (int k = 0; k < 2; k++) {
    memset(local, 0, bytes);
    double t_read = move(engine, peer, runs[k].transport, ORBITE_OP_READ, local, runs[k].remote, bytes);
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++) bad += local[i] != pattern(i);
    wrong += bad;
    printf("%s READ  %zu MiB in %zu requests: %.3f s, %.2f GB/s, %zu wrong bytes\n", runs[k].name, mib, mib, t_read,
           (double)bytes / t_read / 1e9, bad);
    for (size_t i = 0; i < bytes; i++) local[i] = inverted(i);
    double t_write = move(engine, peer, runs[k].transport, ORBITE_OP_WRITE, local, runs[k].remote, bytes);
    printf("%s WRITE %zu MiB in %zu requests: %.3f s, %.2f GB/s\n", runs[k].name, mib, mib, t_write,
           (double)bytes / t_write / 1e9);
  }

  /* What the engine counted, read by name from a stats snapshot. */
  orbite_stats *snapshot = NULL;
  TRY(orbite_engine_stats(engine, &snapshot));
  for (int k = 0; k < 2; k++) {
    char path[64];
    uint64_t done = 0, moved = 0, failed = 0;
    const char *t = k == 0 ? "tcp" : "shm";
    snprintf(path, sizeof path, "transports.%s.requests_completed", t);
    TRY(orbite_stats_number(snapshot, path, &done));
    snprintf(path, sizeof path, "transports.%s.bytes_completed", t);
    TRY(orbite_stats_number(snapshot, path, &moved));
    snprintf(path, sizeof path, "transports.%s.requests_failed", t);
    TRY(orbite_stats_number(snapshot, path, &failed));
    printf("requester counted over %s: %llu requests completed (%llu MiB), %llu failed\n", runs[k].name,
           (unsigned long long)done, (unsigned long long)(moved >> 20), (unsigned long long)failed);
  }
  orbite_stats_free(snapshot);
  if (print_stats) {
    char stats[16384];
    size_t len = 0;
    TRY(orbite_engine_stats_json(engine, stats, sizeof stats, &len));
    printf("requester stats: %s\n", stats);
  }

  if (write(down[1], "x", 1) != 1) return 1;
  size_t remote_wrong = 1;
  if (fscanf(from_child, "%zu", &remote_wrong) != 1) return 1;
  printf("source verified the WRITE: %zu wrong bytes\n", remote_wrong);

  TRY(orbite_close(engine, 10000));
  orbite_engine_free(engine);
  free(local);
  int status = 0;
  waitpid(pid, &status, 0);
  int ok = wrong == 0 && remote_wrong == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  printf("%s\n", ok ? "demo OK" : "demo FAILED");
  return ok ? 0 : 1;
}
