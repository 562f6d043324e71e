/* transfer_demo: two processes move data with liborbite over loopback.
 *
 * The child process is the *source*: it registers a buffer and publishes its
 * endpoint. The parent is the *requester*: it connects, READs the source's
 * buffer, WRITEs into it, checks every byte and prints what moved and how
 * fast. Copy from here: every call below is the whole pattern.
 *
 * Usage: transfer_demo [MiB]   (default 64)
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
  uint8_t *buf = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) buf[i] = pattern(i);

  orbite_engine *engine = NULL;
  TRY(orbite_engine_new(NULL, &engine)); /* defaults: listen on 127.0.0.1, port from the OS */
  uint64_t region = 0;
  TRY(orbite_register_memory(engine, buf, bytes, ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, &region));

  char endpoint[128];
  size_t len = 0;
  TRY(orbite_engine_endpoint(engine, endpoint, sizeof endpoint, &len));
  dprintf(to_parent, "%s %llu\n", endpoint, (unsigned long long)(uintptr_t)buf);

  char c;
  if (read(from_parent, &c, 1) != 1) c = 0; /* the parent says when it is done */
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; i++) wrong += buf[i] != inverted(i);
  dprintf(to_parent, "%zu\n", wrong);

  TRY(orbite_close(engine, 10000)); /* waits for requests being served */
  orbite_engine_free(engine);
  free(buf);
  return 0;
}

/* Submit one request per MiB and wait; returns seconds taken. */
static double move(orbite_engine *e, uint64_t peer, uint32_t op, uint8_t *local, uint64_t remote, size_t bytes) {
  size_t n = bytes / BLOCK;
  orbite_request *reqs = calloc(n, sizeof *reqs);
  for (size_t i = 0; i < n; i++) {
    reqs[i].opcode = op;
    reqs[i].local_addr = (uint64_t)(uintptr_t)(local + i * BLOCK);
    reqs[i].remote_addr = remote + i * BLOCK;
    reqs[i].length = BLOCK;
  }
  orbite_submit_options opts = {ORBITE_TRANSPORT_AUTO, 60000};
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
  size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 64;
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
  unsigned long long remote = 0;
  if (fscanf(from_child, "%127s %llu", endpoint, &remote) != 2) return 1;

  orbite_engine *engine = NULL;
  TRY(orbite_engine_new(NULL, &engine));
  uint8_t *local = malloc(bytes);
  memset(local, 0, bytes);
  uint64_t region = 0;
  TRY(orbite_register_memory(engine, local, bytes, 0, &region)); /* 0: peers may not touch it */
  uint64_t peer = 0;
  TRY(orbite_connect(engine, endpoint, 10000, &peer));
  printf("requester pid %d connected to source pid %d at %s\n", (int)getpid(), (int)pid, endpoint);

  double t_read = move(engine, peer, ORBITE_OP_READ, local, remote, bytes);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; i++) wrong += local[i] != pattern(i);
  printf("READ  %zu MiB in %zu requests: %.3f s, %.2f GB/s, %zu wrong bytes\n", mib, mib, t_read,
         (double)bytes / t_read / 1e9, wrong);

  for (size_t i = 0; i < bytes; i++) local[i] = inverted(i);
  double t_write = move(engine, peer, ORBITE_OP_WRITE, local, remote, bytes);
  printf("WRITE %zu MiB in %zu requests: %.3f s, %.2f GB/s\n", mib, mib, t_write, (double)bytes / t_write / 1e9);

  char stats[4096];
  size_t len = 0;
  TRY(orbite_engine_stats_json(engine, stats, sizeof stats, &len));
  printf("requester stats: %s\n", stats);

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
