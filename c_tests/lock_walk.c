/* The lock walk's driver (issue 61): one 4 KiB SHM READ submitted 21 times
 * between two engines in this process, the last call made through
 * `measured_submit`, so that a profiler can record that call alone, e.g.
 *   valgrind --tool=callgrind --toggle-collect=measured_submit --dump-instr=yes
 * scripts/walk-shm-read.sh runs it that way and prints the lock acquisitions
 * and the rooms (files of src/) of that one submission. Not a test: it
 * checks its bytes and exits 0, and asserts no count.
 *
 * usage: lock_walk [transport: shm|cma|auto (default shm)] */
#include <orbite.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 4096u
#define ROUNDS 21

static void die(const char *what, orbite_status s) {
  fprintf(stderr, "%s: %s: %s\n", what, orbite_status_name(s), orbite_last_error());
  exit(1);
}

/* The one call a profiler records (kept out of line so that its name is seen). */
__attribute__((noinline)) orbite_status measured_submit(orbite_engine *e, uint64_t peer, const orbite_request *r,
                                                        const orbite_submit_options *o, orbite_batch **b) {
  orbite_status s = orbite_submit(e, peer, r, 1, o, b);
  __asm__ volatile("" ::: "memory");
  return s;
}

int main(int argc, char **argv) {
  const char *tname = argc > 1 ? argv[1] : "shm";
  uint32_t transport = strcmp(tname, "cma") == 0    ? ORBITE_TRANSPORT_CMA
                       : strcmp(tname, "auto") == 0 ? ORBITE_TRANSPORT_AUTO
                                                    : ORBITE_TRANSPORT_SHM;
  orbite_engine *src = NULL, *dst = NULL;
  orbite_status s;
  if ((s = orbite_engine_new("{\"default_timeout_ms\": 60000}", &src))) die("source engine", s);
  if ((s = orbite_engine_new("{\"default_timeout_ms\": 60000}", &dst))) die("requester engine", s);
  orbite_allocation *remote = NULL;
  if ((s = orbite_host_allocate_shared(BLOCK, &remote))) die("allocate", s);
  uint8_t *r = orbite_allocation_addr(remote);
  uint64_t region;
  if ((s = orbite_register_memory(src, r, BLOCK, ORBITE_ACCESS_READ, &region))) die("register remote", s);
  uint8_t *local = malloc(BLOCK);
  if (!local) return 2;
  memset(local, 0, BLOCK);
  if ((s = orbite_register_memory(dst, local, BLOCK, 0, &region))) die("register local", s);
  char ep[256];
  size_t len;
  if ((s = orbite_engine_endpoint(src, ep, sizeof ep, &len))) die("endpoint", s);
  uint64_t peer;
  if ((s = orbite_connect(dst, ep, 10000, &peer))) die("connect", s);
  orbite_request req = {ORBITE_OP_READ, (uint64_t)(uintptr_t)local, (uint64_t)(uintptr_t)r, BLOCK};
  orbite_submit_options o = {transport, 60000};
  for (int k = 0; k < ROUNDS; k++) {
    for (size_t i = 0; i < BLOCK; i++) r[i] = (uint8_t)(i * 7u + (unsigned)k);
    orbite_batch *b = NULL;
    s = k + 1 < ROUNDS ? orbite_submit(dst, peer, &req, 1, &o, &b) : measured_submit(dst, peer, &req, &o, &b);
    if (s != ORBITE_STATUS_OK) die("orbite_submit", s);
    if ((s = orbite_batch_wait(b, 60000)) != ORBITE_STATUS_OK) die("orbite_batch_wait", s);
    orbite_batch_free(b);
    for (size_t i = 0; i < BLOCK; i++) {
      if (local[i] != r[i]) {
        fprintf(stderr, "round %d: byte %zu differs\n", k, i);
        return 3;
      }
    }
  }
  printf("%s: %d READs of %u bytes landed\n", tname, ROUNDS, BLOCK);
  orbite_disconnect(dst, peer, 10000);
  orbite_close(dst, 10000);
  orbite_close(src, 10000);
  orbite_engine_free(dst);
  orbite_engine_free(src);
  orbite_allocation_free(remote);
  free(local);
  return 0;
}
