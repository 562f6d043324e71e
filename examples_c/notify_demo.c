/* notify_demo: a prefill worker WRITEs KV blocks into a decode worker and
 * tells it so; the decode worker tells the prefill worker it may free them.
 *
 * The child process is the *decode* worker (engine name "decode-0"): it
 * allocates its KV pool with orbite_host_allocate_shared (so a peer on this
 * host WRITEs into it over SHM; any memory works over TCP), registers it
 * writable, and takes notifications. Each says which pool slots of which
 * request were written; the decode checks those bytes the moment it takes
 * the notification (they are guaranteed in place by then), and answers the
 * prefill with its own notification. The parent is the *prefill* worker
 * (engine name "prefill-0"): for each request it WRITEs 8 scattered 64 KiB
 * blocks with orbite_submit_notify, alternating TCP and SHM, and takes the
 * decode's answers. Copy from here: every call below is the whole pattern.
 *
 * Usage: notify_demo [requests]   (default 6)
 */
#include <orbite.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK (64u << 10) /* one KV block */
#define SLOTS 64u         /* pool slots */
#define PER_REQUEST 8u    /* blocks per request */

#define TRY(call)                                                                                 \
  do {                                                                                            \
    orbite_status s_ = (call);                                                                    \
    if (s_ != ORBITE_STATUS_OK) {                                                                 \
      fprintf(stderr, "%s failed: %s: %s\n", #call, orbite_status_name(s_), orbite_last_error()); \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

/* The byte at offset i of block b of request r. */
static uint8_t kv_byte(unsigned r, unsigned b, size_t i) { return (uint8_t)(i * 7u + b * 31u + r * 101u + (i >> 9)); }
/* The pool slot block b of request r goes to (scattered). */
static unsigned slot_of(unsigned r, unsigned b) { return (b * 5u + r * 3u) % SLOTS; }

static int run_decode(int to_prefill, int from_prefill, unsigned requests) {
  orbite_allocation *pool_alloc = NULL;
  TRY(orbite_host_allocate_shared((size_t)SLOTS * BLOCK, &pool_alloc));
  uint8_t *pool = orbite_allocation_addr(pool_alloc);
  orbite_engine *engine = NULL;
  TRY(orbite_engine_new("{\"name\": \"decode-0\"}", &engine));
  uint64_t region = 0;
  TRY(orbite_register_memory(engine, pool, (size_t)SLOTS * BLOCK, ORBITE_ACCESS_WRITE, &region));
  char endpoint[128];
  size_t len = 0;
  TRY(orbite_engine_endpoint(engine, endpoint, sizeof endpoint, &len));
  dprintf(to_prefill, "%s %llu\n", endpoint, (unsigned long long)(uintptr_t)pool);

  /* The prefill's endpoint, to answer it. */
  char prefill_ep[128] = {0};
  FILE *in = fdopen(from_prefill, "r");
  if (fscanf(in, "%127s", prefill_ep) != 1) return 1;
  uint64_t prefill = 0;
  TRY(orbite_connect(engine, prefill_ep, 10000, &prefill));

  int bad_total = 0;
  for (unsigned n = 0; n < requests; n++) {
    char sender[128], msg[256];
    size_t msg_len = 0;
    TRY(orbite_notification_take(engine, 60000, sender, sizeof sender, msg, sizeof msg - 1, &msg_len));
    msg[msg_len] = 0;
    unsigned r = 0;
    if (sscanf(msg, "request %u", &r) != 1) return 1;
    /* The bytes of every block of the request are in place now. */
    size_t wrong = 0;
    for (unsigned b = 0; b < PER_REQUEST; b++) {
      const uint8_t *blk = pool + (size_t)slot_of(r, b) * BLOCK;
      for (size_t i = 0; i < BLOCK; i++) wrong += blk[i] != kv_byte(r, b, i);
    }
    printf("decode-0: from %s: \"%s\": %zu wrong bytes\n", sender, msg, wrong);
    fflush(stdout); /* the child leaves with _exit */
    bad_total += wrong != 0;
    char answer[64];
    int k = snprintf(answer, sizeof answer, "request %u consumed", r);
    TRY(orbite_notify(engine, prefill, answer, (size_t)k, 10000));
  }
  TRY(orbite_close(engine, 10000));
  orbite_engine_free(engine);
  TRY(orbite_allocation_free(pool_alloc));
  return bad_total ? 1 : 0;
}

int main(int argc, char **argv) {
  unsigned requests = argc > 1 ? (unsigned)atoi(argv[1]) : 6;
  if (requests == 0) requests = 1;
  int up[2], down[2];
  if (pipe(up) || pipe(down)) return 1;
  pid_t pid = fork(); /* before any engine: engines own threads */
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    _exit(run_decode(up[1], down[0], requests));
  }
  close(up[1]);
  close(down[0]);
  FILE *from_decode = fdopen(up[0], "r");
  char decode_ep[128];
  unsigned long long pool = 0;
  if (fscanf(from_decode, "%127s %llu", decode_ep, &pool) != 2) return 1;

  orbite_engine *engine = NULL;
  TRY(orbite_engine_new("{\"name\": \"prefill-0\"}", &engine));
  char endpoint[128];
  size_t len = 0;
  TRY(orbite_engine_endpoint(engine, endpoint, sizeof endpoint, &len));
  dprintf(down[1], "%s\n", endpoint);
  uint8_t *kv = malloc((size_t)PER_REQUEST * BLOCK);
  uint64_t region = 0;
  TRY(orbite_register_memory(engine, kv, (size_t)PER_REQUEST * BLOCK, 0, &region));
  uint64_t decode = 0;
  TRY(orbite_connect(engine, decode_ep, 10000, &decode));

  int ok = 1;
  for (unsigned r = 0; r < requests; r++) {
    orbite_request reqs[PER_REQUEST];
    for (unsigned b = 0; b < PER_REQUEST; b++) {
      for (size_t i = 0; i < BLOCK; i++) kv[(size_t)b * BLOCK + i] = kv_byte(r, b, i);
      reqs[b].opcode = ORBITE_OP_WRITE;
      reqs[b].local_addr = (uint64_t)(uintptr_t)(kv + (size_t)b * BLOCK);
      reqs[b].remote_addr = pool + (uint64_t)slot_of(r, b) * BLOCK;
      reqs[b].length = BLOCK;
    }
    /* Sent only once all 8 blocks are in the decode's memory; not at all
       if one of them failed (the batch then says why). */
    char msg[64];
    int k = snprintf(msg, sizeof msg, "request %u: %u blocks", r, PER_REQUEST);
    orbite_submit_options opts = {r % 2 ? ORBITE_TRANSPORT_SHM : ORBITE_TRANSPORT_TCP, 30000};
    orbite_batch *batch = NULL;
    TRY(orbite_submit_notify(engine, decode, reqs, PER_REQUEST, &opts, msg, (size_t)k, &batch));
    orbite_status s = orbite_batch_wait(batch, 30000);
    uint32_t transport = 0;
    TRY(orbite_batch_transport(batch, 0, &transport));
    printf("prefill-0: request %u: 8 x 64 KiB over %s, notified: %s\n", r,
           transport == ORBITE_TRANSPORT_SHM ? "SHM" : "TCP", orbite_status_name(s));
    ok &= s == ORBITE_STATUS_OK;
    orbite_batch_free(batch);
    /* The decode's answer: it consumed the blocks; the prefill may reuse
       its buffer. */
    char sender[128], answer[128];
    size_t answer_len = 0;
    TRY(orbite_notification_take(engine, 60000, sender, sizeof sender, answer, sizeof answer - 1, &answer_len));
    answer[answer_len] = 0;
    printf("prefill-0: from %s: \"%s\"\n", sender, answer);
    ok &= strcmp(sender, "decode-0") == 0;
  }
  char stats[8192];
  TRY(orbite_engine_stats_json(engine, stats, sizeof stats, &len));
  char *n = strstr(stats, "\"notifications\"");
  printf("prefill-0 stats: %.*s\n", n ? (int)(strchr(n, '}') - n + 1) : 0, n ? n : "");
  TRY(orbite_close(engine, 10000));
  orbite_engine_free(engine);
  free(kv);
  int status = 0;
  waitpid(pid, &status, 0);
  ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  printf("%s\n", ok ? "notify demo OK" : "notify demo FAILED");
  return ok ? 0 : 1;
}
