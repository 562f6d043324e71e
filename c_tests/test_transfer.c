/* Two processes (fork) on loopback: READ and WRITE over TCP, bytes verified,
 * and the per-request remote rejections. The child is the source. */
#include "check.h"
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG (1u << 20)
#define SMALL 4096u

static uint8_t pat_src(size_t i) { return (uint8_t)(i * 7u + 13u); }
static uint8_t pat_dst(size_t i) { return (uint8_t)(i * 5u + 1u); }

static void write_line(int fd, const char *s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w <= 0) exit(90);
    s += w;
    n -= (size_t)w;
  }
}

static void read_line(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = read(fd, buf + n, 1);
    if (r <= 0) break;
    if (buf[n] == '\n') break;
    n++;
  }
  buf[n] = '\0';
}

static int child(int in, int out) {
  uint8_t *rw = malloc(BIG), *wo = malloc(SMALL), *ro = malloc(SMALL);
  if (!rw || !wo || !ro) return 91;
  for (size_t i = 0; i < BIG; i++) rw[i] = pat_src(i);
  memset(wo, 0, SMALL);
  memset(ro, 0x77, SMALL);
  orbite_engine *e = NULL;
  if (orbite_engine_new("{\"default_timeout_ms\": 60000}", &e) != ORBITE_STATUS_OK) return 92;
  uint64_t r1, r2, r3;
  if (orbite_register_memory(e, rw, BIG, ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, &r1) ||
      orbite_register_memory(e, wo, SMALL, ORBITE_ACCESS_WRITE, &r2) ||
      orbite_register_memory(e, ro, SMALL, ORBITE_ACCESS_READ, &r3))
    return 93;
  char ep[128], line[512];
  size_t len;
  if (orbite_engine_endpoint(e, ep, sizeof ep, &len) != ORBITE_STATUS_OK) return 94;
  snprintf(line, sizeof line, "%s %llu %llu %llu\n", ep, (unsigned long long)(uintptr_t)rw,
           (unsigned long long)(uintptr_t)wo, (unsigned long long)(uintptr_t)ro);
  write_line(out, line);
  int rc = 0;
  for (;;) {
    read_line(in, line, sizeof line);
    if (strcmp(line, "verify") == 0) {
      /* The parent wrote pat_dst over [3, 3+65536) and left the rest alone. */
      int ok = 1;
      for (size_t i = 0; i < BIG; i++) {
        uint8_t want = (i >= 3 && i < 3 + 65536) ? pat_dst(i - 3) : pat_src(i);
        if (rw[i] != want) { ok = 0; break; }
      }
      for (size_t i = 0; i < SMALL; i++)
        if (ro[i] != 0x77) ok = 0;
      write_line(out, ok ? "ok\n" : "bad\n");
    } else {
      break; /* "quit" or EOF */
    }
  }
  if (orbite_close(e, 10000) != ORBITE_STATUS_OK) rc = 95;
  orbite_engine_free(e);
  free(rw);
  free(wo);
  free(ro);
  return rc;
}

static orbite_status run1(orbite_engine *e, uint64_t peer, uint32_t op, void *local, uint64_t remote, uint64_t n,
                          orbite_request_result *res) {
  orbite_request r = {op, (uint64_t)(uintptr_t)local, remote, n};
  orbite_batch *b = NULL;
  orbite_status s = orbite_submit(e, peer, &r, 1, NULL, &b);
  if (s != ORBITE_STATUS_OK) return s;
  s = orbite_batch_wait(b, 60000);
  CHECK_STATUS(orbite_batch_results(b, res, 1), ORBITE_STATUS_OK);
  orbite_batch_free(b);
  return s;
}

int main(void) {
  int to_child[2], to_parent[2];
  if (pipe(to_child) || pipe(to_parent)) return 2;
  pid_t pid = fork();
  if (pid < 0) return 3;
  if (pid == 0) {
    close(to_child[1]);
    close(to_parent[0]);
    _exit(child(to_child[0], to_parent[1]));
  }
  close(to_child[0]);
  close(to_parent[1]);

  char line[512], ep[128];
  unsigned long long rw, wo, ro;
  read_line(to_parent[0], line, sizeof line);
  if (sscanf(line, "%127s %llu %llu %llu", ep, &rw, &wo, &ro) != 4) {
    fprintf(stderr, "child did not report its endpoint: \"%s\"\n", line);
    return 4;
  }
  orbite_engine *e = NULL;
  CHECK_STATUS(orbite_engine_new("{\"max_transfer_bytes\": 262144}", &e), ORBITE_STATUS_OK);
  uint8_t *local = malloc(BIG);
  memset(local, 0, BIG);
  uint64_t lr;
  CHECK_STATUS(orbite_register_memory(e, local, BIG, 0, &lr), ORBITE_STATUS_OK);
  uint64_t peer = 0;
  CHECK_STATUS(orbite_connect(e, ep, 10000, &peer), ORBITE_STATUS_OK);

  orbite_request_result res[8];
  /* 1 MiB READ (split into 256 KiB transfers by max_transfer_bytes). */
  CHECK_STATUS(run1(e, peer, ORBITE_OP_READ, local, rw, BIG, res), ORBITE_STATUS_OK);
  size_t bad = 0;
  for (size_t i = 0; i < BIG; i++) bad += local[i] != pat_src(i);
  CHECK(bad == 0);
  /* 1 byte and 4097 bytes at odd offsets. */
  memset(local, 0, BIG);
  CHECK_STATUS(run1(e, peer, ORBITE_OP_READ, local + 1, rw + 999, 1, res), ORBITE_STATUS_OK);
  CHECK(local[1] == pat_src(999) && local[0] == 0 && local[2] == 0);
  CHECK_STATUS(run1(e, peer, ORBITE_OP_READ, local + 7, rw + 4093, 4097, res), ORBITE_STATUS_OK);
  bad = 0;
  for (size_t i = 0; i < 4097; i++) bad += local[7 + i] != pat_src(4093 + i);
  CHECK(bad == 0 && local[6] == 0 && local[7 + 4097] == 0);
  /* WRITE 64 KiB at remote offset 3. */
  for (size_t i = 0; i < 65536; i++) local[i] = pat_dst(i);
  CHECK_STATUS(run1(e, peer, ORBITE_OP_WRITE, local, rw + 3, 65536, res), ORBITE_STATUS_OK);
  CHECK(res[0].status == ORBITE_STATUS_OK && res[0].remote_effect == ORBITE_REMOTE_EFFECT_APPLIED);

  /* Remote rejections, one batch, results in input order. */
  orbite_request rs[5] = {
      {ORBITE_OP_READ, (uint64_t)(uintptr_t)local, wo, 16},              /* write-only region */
      {ORBITE_OP_WRITE, (uint64_t)(uintptr_t)local, ro, 16},             /* read-only region */
      {ORBITE_OP_READ, (uint64_t)(uintptr_t)local, rw + BIG - 8, 16},    /* crosses the end */
      {ORBITE_OP_READ, (uint64_t)(uintptr_t)local, 8, 16},               /* in no region */
      {ORBITE_OP_READ, (uint64_t)(uintptr_t)(local + 100), rw + 10, 10}, /* fine */
  };
  orbite_batch *b = NULL;
  CHECK_STATUS(orbite_submit(e, peer, rs, 5, NULL, &b), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_wait(b, 60000), ORBITE_STATUS_TRANSFER_FAILED);
  CHECK_STATUS(orbite_batch_results(b, res, 5), ORBITE_STATUS_OK);
  CHECK(res[0].status == ORBITE_STATUS_PERMISSION_DENIED);
  CHECK(res[1].status == ORBITE_STATUS_PERMISSION_DENIED && res[1].remote_effect == ORBITE_REMOTE_EFFECT_NONE);
  CHECK(res[2].status == ORBITE_STATUS_OUT_OF_RANGE);
  CHECK(res[3].status == ORBITE_STATUS_NOT_FOUND);
  CHECK(res[4].status == ORBITE_STATUS_OK);
  CHECK(local[100] == pat_dst(10 - 3) && local[109] == pat_dst(19 - 3)); /* overwritten by the WRITE above */
  orbite_batch_free(b);

  write_line(to_child[1], "verify\n");
  read_line(to_parent[0], line, sizeof line);
  CHECK(strcmp(line, "ok") == 0);
  write_line(to_child[1], "quit\n");
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  /* The source is gone: a new submission is refused or fails, never hangs. */
  orbite_request r = {ORBITE_OP_READ, (uint64_t)(uintptr_t)local, rw, 16};
  orbite_status s = orbite_submit(e, peer, &r, 1, NULL, &b);
  if (s == ORBITE_STATUS_OK) {
    CHECK_STATUS(orbite_batch_wait(b, 60000), ORBITE_STATUS_TRANSFER_FAILED);
    orbite_batch_free(b);
  } else {
    CHECK(s == ORBITE_STATUS_UNAVAILABLE);
  }
  CHECK_STATUS(orbite_close(e, 10000), ORBITE_STATUS_OK);
  orbite_engine_free(e);
  free(local);
  close(to_child[1]);
  close(to_parent[0]);
  return check_report("test_transfer");
}
