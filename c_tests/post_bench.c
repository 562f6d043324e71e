/* A posting driver over orbite.h: how long orbite_submit takes for one
 * submission of N tiny SHM READs (64 bytes each, gapped: every 256th byte
 * of a shared allocation), for N = 8192 and N = 100000, two engines in
 * this process. Prints the median of `rounds` submissions of each size
 * (alternating the sizes) and the ratio of the medians; linear would be
 * 100000 / 8192 = 12.2x. Every batch is waited for and checked.
 *
 * usage: post_bench [rounds (default 15)] [transport: shm|tcp|auto (default shm)] [wall|cpu]
 * `cpu` (the default) times the submitting thread's CPU time (a loaded
 * machine's preemptions left out), `wall` the wall-clock time.
 * Exit status 0 when every submission succeeded (a timing is not checked:
 * timing goals live in benchmarks, never in tests). */
#define _GNU_SOURCE
#include <orbite.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define MAX_N 100000u
#define TINY 64u
#define STRIDE 256u

/* Page faults taken by this thread during the last timed submission. */
static long faults;

static long thread_faults(void) {
  struct rusage u;
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt + u.ru_majflt;
}

static double clock_us(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void die(const char *what, orbite_status s) {
  fprintf(stderr, "%s: %s: %s\n", what, orbite_status_name(s), orbite_last_error());
  exit(1);
}

/* One submission of `n` READs; returns the microseconds orbite_submit took
 * (`cpu`: of this thread's CPU time, else wall-clock). */
static double post(orbite_engine *e, uint64_t peer, orbite_request *reqs, size_t n, uint32_t transport, int cpu) {
  orbite_submit_options o = {transport, 60000};
  orbite_batch *b = NULL;
  clockid_t c = cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
  long f0 = thread_faults();
  double t0 = clock_us(c);
  orbite_status s = orbite_submit(e, peer, reqs, n, &o, &b);
  double t = clock_us(c) - t0;
  faults = thread_faults() - f0;
  if (s != ORBITE_STATUS_OK) die("orbite_submit", s);
  if ((s = orbite_batch_wait(b, 60000)) != ORBITE_STATUS_OK) die("orbite_batch_wait", s);
  orbite_batch_free(b);
  return t;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 15;
  const char *tname = argc > 2 ? argv[2] : "shm";
  uint32_t transport = strcmp(tname, "tcp") == 0   ? ORBITE_TRANSPORT_TCP
                       : strcmp(tname, "auto") == 0 ? ORBITE_TRANSPORT_AUTO
                                                    : ORBITE_TRANSPORT_SHM;
  int cpu = !(argc > 3 && strcmp(argv[3], "wall") == 0);
  if (rounds < 1) rounds = 1;
  size_t bytes = (size_t)MAX_N * STRIDE;
  orbite_engine *src = NULL, *dst = NULL;
  orbite_status s;
  if ((s = orbite_engine_new("{\"default_timeout_ms\": 60000}", &src))) die("source engine", s);
  if ((s = orbite_engine_new("{\"default_timeout_ms\": 60000}", &dst))) die("requester engine", s);
  orbite_allocation *remote = NULL;
  if ((s = orbite_host_allocate_shared(bytes, &remote))) die("allocate", s);
  uint8_t *r = orbite_allocation_addr(remote);
  for (size_t i = 0; i < bytes; i++) r[i] = (uint8_t)(i * 7u + 3u);
  uint64_t region;
  if ((s = orbite_register_memory(src, r, bytes, ORBITE_ACCESS_READ, &region))) die("register remote", s);
  uint8_t *local = malloc(bytes);
  if (!local) return 2;
  memset(local, 0, bytes);
  if ((s = orbite_register_memory(dst, local, bytes, 0, &region))) die("register local", s);
  char ep[256];
  size_t len;
  if ((s = orbite_engine_endpoint(src, ep, sizeof ep, &len))) die("endpoint", s);
  uint64_t peer;
  if ((s = orbite_connect(dst, ep, 10000, &peer))) die("connect", s);
  orbite_request *reqs = malloc(MAX_N * sizeof *reqs);
  if (!reqs) return 2;
  for (size_t i = 0; i < MAX_N; i++) {
    reqs[i].opcode = ORBITE_OP_READ;
    reqs[i].local_addr = (uint64_t)(uintptr_t)(local + i * STRIDE);
    reqs[i].remote_addr = (uint64_t)(uintptr_t)(r + i * STRIDE);
    reqs[i].length = TINY;
  }
  /* A warm-up of each size (imports, first touch), then the rounds. */
  post(dst, peer, reqs, 8192, transport, cpu);
  post(dst, peer, reqs, MAX_N, transport, cpu);
  double *small = malloc(rounds * sizeof *small), *large = malloc(rounds * sizeof *large);
  long small_faults = 0, large_faults = 0;
  for (int k = 0; k < rounds; k++) {
    small[k] = post(dst, peer, reqs, 8192, transport, cpu);
    small_faults += faults;
    large[k] = post(dst, peer, reqs, MAX_N, transport, cpu);
    large_faults += faults;
  }
  for (size_t i = 0; i < MAX_N; i++) {
    for (size_t j = 0; j < TINY; j++) {
      if (local[i * STRIDE + j] != r[i * STRIDE + j]) {
        fprintf(stderr, "request %zu: byte %zu differs\n", i, j);
        return 3;
      }
    }
  }
  qsort(small, rounds, sizeof *small, cmp);
  qsort(large, rounds, sizeof *large, cmp);
  double a = small[rounds / 2], b = large[rounds / 2];
  printf("%s %s: 8192 requests %.0f us (%.1f ns each), 100000 requests %.0f us (%.1f ns each), ratio %.1fx "
         "(linear 12.2x), medians of %d; page faults per submission %ld and %ld\n",
         tname, cpu ? "cpu" : "wall", a, a * 1e3 / 8192, b, b * 1e3 / MAX_N, b / a, rounds, small_faults / rounds, large_faults / rounds);
  orbite_disconnect(dst, peer, 10000);
  orbite_close(dst, 10000);
  orbite_close(src, 10000);
  orbite_engine_free(dst);
  orbite_engine_free(src);
  free(small);
  free(large);
  free(reqs);
  free(local);
  return 0;
}
