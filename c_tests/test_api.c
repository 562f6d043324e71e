/* API conventions and bad arguments: every NULL, every unknown enum value,
 * every too-small buffer. Nothing may crash; each call returns the contract's
 * status, leaves out-parameters alone and names the cause. */
#include <sched.h>
#include <time.h>

#include "check.h"

#define SENTINEL_PTR ((void *)0x5a5a)

static void text_out_rules(const orbite_engine *e) {
  char buf[256];
  size_t len = 12345;
  CHECK_STATUS(orbite_engine_endpoint(NULL, buf, sizeof buf, &len), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_ERROR_MENTIONS("engine");
  CHECK(len == 12345);
  CHECK_STATUS(orbite_engine_endpoint(e, buf, sizeof buf, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_ERROR_MENTIONS("out_len");
  /* Size query: NULL buffer with cap 0 tells the length needed. */
  CHECK_STATUS(orbite_engine_endpoint(e, NULL, 0, &len), ORBITE_STATUS_BUFFER_TOO_SMALL);
  size_t need = len;
  CHECK(need > 8 && need < sizeof buf);
  /* cap == len (no room for the NUL) is too small; len+1 fits exactly. */
  memset(buf, 'x', sizeof buf);
  CHECK_STATUS(orbite_engine_endpoint(e, buf, need, &len), ORBITE_STATUS_BUFFER_TOO_SMALL);
  CHECK(len == need);
  CHECK(buf[0] == 'x'); /* nothing written on failure */
  CHECK_STATUS(orbite_engine_endpoint(e, buf, need + 1, &len), ORBITE_STATUS_OK);
  CHECK(len == need && buf[need] == '\0' && strlen(buf) == need);
  CHECK(strncmp(buf, "127.0.0.1:", 10) == 0);
  CHECK_STATUS(orbite_engine_endpoint(e, NULL, 100, &len), ORBITE_STATUS_NULL_ARGUMENT);

  CHECK_STATUS(orbite_engine_stats_json(NULL, buf, sizeof buf, &len), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_engine_stats_json(e, buf, 2, &len), ORBITE_STATUS_BUFFER_TOO_SMALL);
  CHECK(len > 2);
  char big[8192];
  CHECK_STATUS(orbite_engine_stats_json(e, big, sizeof big, &len), ORBITE_STATUS_OK);
  CHECK(big[0] == '{' && strstr(big, "\"transports\"") != NULL && strstr(big, "\"inflight_bytes\"") != NULL);

  /* The same counters as a snapshot, by path, without JSON. */
  orbite_stats *st = (orbite_stats *)SENTINEL_PTR;
  CHECK_STATUS(orbite_engine_stats(NULL, &st), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_engine_stats(e, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK(st == (orbite_stats *)SENTINEL_PTR);
  CHECK_STATUS(orbite_engine_stats(e, &st), ORBITE_STATUS_OK);
  size_t count = orbite_stats_count(st);
  CHECK(count > 70 && orbite_stats_count(NULL) == 0);
  uint64_t v = 77;
  CHECK_STATUS(orbite_stats_number(st, "inflight_bytes", &v), ORBITE_STATUS_OK);
  CHECK(v == 0);
  CHECK_STATUS(orbite_stats_number(st, "transports.tcp.requests_completed", &v), ORBITE_STATUS_OK);
  CHECK(v == 0);
  CHECK_STATUS(orbite_stats_number(st, "discovery.enabled", &v), ORBITE_STATUS_OK);
  CHECK(v == 0);
  v = 77;
  CHECK_STATUS(orbite_stats_number(st, "transports", &v), ORBITE_STATUS_NOT_FOUND);
  CHECK_ERROR_MENTIONS("\"transports\"");
  CHECK_STATUS(orbite_stats_number(st, "transports_available.tcp", &v), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("a text");
  CHECK(v == 77);
  CHECK_STATUS(orbite_stats_number(st, NULL, &v), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_stats_number((orbite_stats *)e, "peers", &v), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("not an orbite_stats");
  const char *path = NULL, *text = NULL;
  int numbers = 0, texts = 0, tcp_available = 0;
  for (size_t i = 0; i < count; i++) {
    CHECK_STATUS(orbite_stats_entry(st, i, &path, &v, &text), ORBITE_STATUS_OK);
    if (text) {
      texts++;
      CHECK(v == 0);
      if (strcmp(path, "transports_available.tcp") == 0) tcp_available = strcmp(text, "available") == 0;
    } else {
      numbers++;
    }
  }
  CHECK(tcp_available && texts >= 2 && numbers + texts == (int)count);
  path = "kept";
  CHECK_STATUS(orbite_stats_entry(st, count, &path, &v, &text), ORBITE_STATUS_OUT_OF_RANGE);
  CHECK(strcmp(path, "kept") == 0);
  CHECK_STATUS(orbite_stats_entry(st, 0, NULL, &v, &text), ORBITE_STATUS_NULL_ARGUMENT);
  orbite_stats_free(st);
  orbite_stats_free(NULL);

  CHECK_STATUS(orbite_cuda_retained_resources_json(big, sizeof big, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_cuda_retained_resources_json(big, 1, &len), ORBITE_STATUS_BUFFER_TOO_SMALL);
  CHECK_STATUS(orbite_cuda_retained_resources_json(big, sizeof big, &len), ORBITE_STATUS_OK);
  CHECK(strstr(big, "cuda_available") != NULL);

  /* The doctor: the text out-parameter rules, options checked by name. */
  len = 0;
  CHECK_STATUS(orbite_diagnose_json(NULL, NULL, 0, &len), ORBITE_STATUS_BUFFER_TOO_SMALL);
  CHECK(len > 0);
  CHECK_STATUS(orbite_diagnose_json("{\"transport\": \"mnnvl\"}", big, sizeof big, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_diagnose_json("{\"transport\": \"mnnvl\"}", big, sizeof big, &len), ORBITE_STATUS_OK);
  CHECK(strstr(big, "\"layer\":\"driver\"") != NULL && len == strlen(big));
  CHECK_STATUS(orbite_diagnose_json("{\"transprot\": 1}", big, sizeof big, &len), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("transprot");
}

static void registration(orbite_engine *e, uint8_t *mem, size_t n) {
  uint64_t region = 777;
  CHECK_STATUS(orbite_register_memory(NULL, mem, n, ORBITE_ACCESS_READ, &region), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_register_memory(e, NULL, n, ORBITE_ACCESS_READ, &region), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_ERROR_MENTIONS("addr");
  CHECK_STATUS(orbite_register_memory(e, mem, n, ORBITE_ACCESS_READ, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_register_memory(e, mem, 0, ORBITE_ACCESS_READ, &region), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("length");
  CHECK_STATUS(orbite_register_memory(e, mem, n, 4, &region), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("access");
  CHECK_STATUS(orbite_register_memory(e, mem, n, 0xffffffffu, &region), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK(region == 777);
  CHECK_STATUS(orbite_register_memory(e, mem, n, ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, &region), ORBITE_STATUS_OK);
  CHECK(region != 0 && region != 777);
  uint64_t other = 5;
  CHECK_STATUS(orbite_register_memory(e, mem + n / 2, n, ORBITE_ACCESS_READ, &other), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("overlaps");
  CHECK(other == 5);

  CHECK_STATUS(orbite_unregister_memory(NULL, region, 0), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_unregister_memory(e, 0, 0), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_STATUS(orbite_unregister_memory(e, 424242, 0), ORBITE_STATUS_NOT_FOUND);
  CHECK_STATUS(orbite_record_producer_stream(NULL, region, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_record_producer_stream(e, 0, NULL), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_STATUS(orbite_record_producer_stream(e, 424242, NULL), ORBITE_STATUS_NOT_FOUND);
  CHECK_STATUS(orbite_unregister_memory(e, region, 1000), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_unregister_memory(e, region, 1000), ORBITE_STATUS_NOT_FOUND);
}

static void allocations(orbite_engine *e) {
  orbite_allocation *a = (orbite_allocation *)SENTINEL_PTR;
  CHECK_STATUS(orbite_host_allocate_shared(4096, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_host_allocate_shared(0, &a), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK(a == (orbite_allocation *)SENTINEL_PTR);
  CHECK_STATUS(orbite_host_allocate_shared(12345, &a), ORBITE_STATUS_OK);
  uint8_t *p = (uint8_t *)orbite_allocation_addr(a);
  CHECK(p != NULL);
  CHECK(orbite_allocation_length(a) == 12345);
  size_t zeros = 0;
  for (size_t i = 0; i < 12345; i++) zeros += p[i] == 0;
  CHECK(zeros == 12345);
  CHECK(orbite_allocation_addr(NULL) == NULL);
  CHECK(orbite_allocation_length(NULL) == 0);
  uint64_t region = 0;
  CHECK_STATUS(orbite_register_memory(e, p, 12345, ORBITE_ACCESS_READ, &region), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_allocation_free(a), ORBITE_STATUS_UNAVAILABLE); /* still registered */
  CHECK_ERROR_MENTIONS("registered");
  CHECK(orbite_allocation_length(a) == 12345); /* handle still valid */
  CHECK_STATUS(orbite_unregister_memory(e, region, 0), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_allocation_free(a), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_allocation_free(NULL), ORBITE_STATUS_OK);
  a = (orbite_allocation *)SENTINEL_PTR;

  /* CUDA, MNNVL and EGM: argument checks first, then UNAVAILABLE without CUDA. */
  CHECK_STATUS(orbite_cuda_allocate(0, 4096, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_cuda_allocate(0, 0, &a), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_STATUS(orbite_cuda_allocate_ipc(0, 4096, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_cuda_allocate_ipc(0, 0, &a), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_STATUS(orbite_cuda_allocate_pinned_host(4096, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_cuda_allocate_pinned_host(0, &a), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_STATUS(orbite_allocate_mnnvl(0, 4096, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_allocate_mnnvl(0, 0, &a), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_STATUS(orbite_allocate_egm(0, 4096, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_allocate_egm(0, 0, &a), ORBITE_STATUS_INVALID_ARGUMENT);
  /* Adoption: a NULL pointer is NULL_ARGUMENT (C-API.md), whatever else. */
  CHECK_STATUS(orbite_cuda_adopt(NULL, 4096, ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION, &a), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_ERROR_MENTIONS("ptr is NULL");
  CHECK(a == (orbite_allocation *)SENTINEL_PTR);
  CHECK_STATUS(orbite_cuda_adopt((void *)SENTINEL_PTR, 4096, ORBITE_ADOPT_SHARE_WHOLE_ALLOCATION, NULL),
               ORBITE_STATUS_NULL_ARGUMENT);
  orbite_status s = orbite_cuda_allocate(0, 4096, &a);
  if (s == ORBITE_STATUS_OK) {
    printf("CUDA present: skipping the no-CUDA status checks\n");
    CHECK_STATUS(orbite_allocation_free(a), ORBITE_STATUS_OK);
  } else {
    CHECK(s == ORBITE_STATUS_UNAVAILABLE);
    CHECK_ERROR_MENTIONS("CUDA");
    CHECK(a == (orbite_allocation *)SENTINEL_PTR);
    CHECK_STATUS(orbite_cuda_allocate_ipc(0, 4096, &a), ORBITE_STATUS_UNAVAILABLE);
    CHECK_STATUS(orbite_cuda_allocate_pinned_host(4096, &a), ORBITE_STATUS_UNAVAILABLE);
    CHECK_STATUS(orbite_allocate_mnnvl(0, 4096, &a), ORBITE_STATUS_UNAVAILABLE);
    CHECK_STATUS(orbite_allocate_egm(0, 4096, &a), ORBITE_STATUS_UNAVAILABLE);
    CHECK(a == (orbite_allocation *)SENTINEL_PTR);
  }
}

/* An end callback: counts its calls in *user_data. */
static void count_end(void *user_data) { __atomic_add_fetch((int *)user_data, 1, __ATOMIC_SEQ_CST); }

static void peers_and_submit(orbite_engine *src, orbite_engine *req) {
  char ep[128];
  size_t len = 0;
  CHECK_STATUS(orbite_engine_endpoint(src, ep, sizeof ep, &len), ORBITE_STATUS_OK);
  uint64_t peer = 99;
  CHECK_STATUS(orbite_connect(NULL, ep, 0, &peer), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_connect(req, NULL, 0, &peer), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_connect(req, ep, 0, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_connect(req, "not an endpoint", 0, &peer), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("not an endpoint");
  CHECK_STATUS(orbite_connect(req, "127.0.0.1:0", 0, &peer), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_STATUS(orbite_connect(req, "example.com:80", 0, &peer), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("localhost:port"); /* the forms it accepts, localhost included */
  CHECK(peer == 99);
  CHECK_STATUS(orbite_connect(req, ep, 5000, &peer), ORBITE_STATUS_OK);
  CHECK(peer != 0 && peer != 99);

  /* Capability masks: TCP, SHM and CMA on both engines (default config, one
   * host); CMA needs two processes, so this peer (this process) gets TCP and SHM. */
  uint32_t mask = 7;
  CHECK_STATUS(orbite_engine_transports(NULL, &mask), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_engine_transports(req, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_peer_transports(NULL, peer, &mask), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_peer_transports(req, peer, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_peer_transports(req, 31337, &mask), ORBITE_STATUS_NOT_FOUND);
  CHECK(mask == 7);
  const uint32_t tcp_shm = (1u << ORBITE_TRANSPORT_TCP) | (1u << ORBITE_TRANSPORT_SHM);
  CHECK_STATUS(orbite_engine_transports(req, &mask), ORBITE_STATUS_OK);
  CHECK(mask == (tcp_shm | (1u << ORBITE_TRANSPORT_CMA)));
  mask = 0;
  CHECK_STATUS(orbite_peer_transports(req, peer, &mask), ORBITE_STATUS_OK);
  CHECK(mask == tcp_shm);

  static uint8_t remote[4096], local[4096];
  uint64_t rr = 0, lr = 0;
  CHECK_STATUS(orbite_register_memory(src, remote, sizeof remote, ORBITE_ACCESS_READ, &rr), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_register_memory(req, local, sizeof local, 0, &lr), ORBITE_STATUS_OK);

  char rj[4096];
  CHECK_STATUS(orbite_peer_regions_json(NULL, peer, rj, sizeof rj, &len), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_peer_regions_json(req, 31337, rj, sizeof rj, &len), ORBITE_STATUS_NOT_FOUND);
  CHECK_STATUS(orbite_peer_regions_json(req, peer, rj, sizeof rj, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_peer_regions_json(req, peer, rj, 3, &len), ORBITE_STATUS_BUFFER_TOO_SMALL);
  CHECK_STATUS(orbite_peer_regions_json(req, peer, rj, sizeof rj, &len), ORBITE_STATUS_OK);
  CHECK(strstr(rj, "\"kind\":\"host\"") != NULL && strstr(rj, "\"access\":[\"read\"]") != NULL);

  /* The same regions as C records. */
  orbite_region_info regs[64];
  size_t nregs = 99;
  CHECK_STATUS(orbite_peer_regions(NULL, peer, regs, 64, &nregs), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_peer_regions(req, peer, regs, 64, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_peer_regions(req, 31337, regs, 64, &nregs), ORBITE_STATUS_NOT_FOUND);
  CHECK(nregs == 99);
  CHECK_STATUS(orbite_peer_regions(req, peer, NULL, 0, &nregs), ORBITE_STATUS_BUFFER_TOO_SMALL);
  CHECK(nregs >= 1);
  size_t want = nregs;
  CHECK_STATUS(orbite_peer_regions(req, peer, regs, 64, &nregs), ORBITE_STATUS_OK);
  CHECK(nregs == want);
  int seen = 0;
  for (size_t i = 0; i < nregs; i++) {
    if (regs[i].id != rr) continue;
    seen = 1;
    CHECK(regs[i].addr == (uint64_t)(uintptr_t)remote && regs[i].length == sizeof remote && regs[i].epoch != 0);
    CHECK(regs[i].access == ORBITE_ACCESS_READ && strcmp(regs[i].kind, "host") == 0);
  }
  CHECK(seen);

  orbite_request r = {ORBITE_OP_READ, (uint64_t)(uintptr_t)local, (uint64_t)(uintptr_t)remote, 4096};
  orbite_batch *b = (orbite_batch *)SENTINEL_PTR;
  CHECK_STATUS(orbite_submit(NULL, peer, &r, 1, NULL, &b), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_submit(req, peer, NULL, 1, NULL, &b), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_submit(req, peer, &r, 1, NULL, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_submit(req, peer, &r, 0, NULL, &b), ORBITE_STATUS_INVALID_ARGUMENT);
  /* Counts that could never be allocated are refused before anything is read. */
  CHECK_STATUS(orbite_submit(req, peer, &r, SIZE_MAX, NULL, &b), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("at most");
  CHECK_STATUS(orbite_submit(req, peer, &r, (size_t)1 << 40, NULL, &b), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_STATUS(orbite_submit(req, 31337, &r, 1, NULL, &b), ORBITE_STATUS_NOT_FOUND);
  CHECK_STATUS(orbite_submit(req, 0, &r, 1, NULL, &b), ORBITE_STATUS_NOT_FOUND);
  orbite_request bad = r;
  bad.opcode = 0;
  CHECK_STATUS(orbite_submit(req, peer, &bad, 1, NULL, &b), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("opcode");
  bad.opcode = 3;
  CHECK_STATUS(orbite_submit(req, peer, &bad, 1, NULL, &b), ORBITE_STATUS_INVALID_ARGUMENT);
  bad = r;
  bad.length = 0;
  CHECK_STATUS(orbite_submit(req, peer, &bad, 1, NULL, &b), ORBITE_STATUS_INVALID_ARGUMENT);
  bad = r;
  bad.local_addr += 1; /* crosses the end of the local region */
  CHECK_STATUS(orbite_submit(req, peer, &bad, 1, NULL, &b), ORBITE_STATUS_OUT_OF_RANGE);
  bad.local_addr = 16; /* in no region */
  CHECK_STATUS(orbite_submit(req, peer, &bad, 1, NULL, &b), ORBITE_STATUS_NOT_FOUND);
  orbite_submit_options o = {99, 0};
  CHECK_STATUS(orbite_submit(req, peer, &r, 1, &o, &b), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("transport");
  /* Forcing SHM onto the peer's plain host memory is refused, saying why and what to do. */
  orbite_submit_options shm = {ORBITE_TRANSPORT_SHM, 0};
  CHECK_STATUS(orbite_submit(req, peer, &r, 1, &shm, &b), ORBITE_STATUS_NOT_SUPPORTED);
  CHECK_ERROR_MENTIONS("shm moves only memory the peer allocated with orbite_host_allocate_shared");
  CHECK_ERROR_MENTIONS("ORBITE_TRANSPORT_TCP");
  CHECK(b == (orbite_batch *)SENTINEL_PTR);

  /* A good submission, and the batch calls' bad arguments. */
  memset(remote, 0xab, sizeof remote);
  o.transport = ORBITE_TRANSPORT_TCP;
  o.timeout_ms = 30000;
  CHECK_STATUS(orbite_submit(req, peer, &r, 1, &o, &b), ORBITE_STATUS_OK);
  /* The end callback runs once when the batch ends (on the thread that
     ends it: counted, not assumed done when the wait returns), and at once
     on a batch that has ended; NULL batch or callback refused. */
  int ends = 0;
  CHECK_STATUS(orbite_batch_on_end(b, count_end, &ends), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_wait(b, 30000), ORBITE_STATUS_OK);
  /* It comes within microseconds; up to 30 s on a loaded host. */
  struct timespec began, now;
  clock_gettime(CLOCK_MONOTONIC, &began);
  do {
    sched_yield();
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (__atomic_load_n(&ends, __ATOMIC_SEQ_CST) == 0 && now.tv_sec - began.tv_sec < 30);
  CHECK(__atomic_load_n(&ends, __ATOMIC_SEQ_CST) == 1);
  CHECK_STATUS(orbite_batch_on_end(b, count_end, &ends), ORBITE_STATUS_OK);
  CHECK(__atomic_load_n(&ends, __ATOMIC_SEQ_CST) == 2);
  CHECK_STATUS(orbite_batch_on_end(NULL, count_end, &ends), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_on_end(b, NULL, &ends), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_ERROR_MENTIONS("cb is NULL");
  CHECK(__atomic_load_n(&ends, __ATOMIC_SEQ_CST) == 2);
  CHECK_STATUS(orbite_batch_poll(b), ORBITE_STATUS_OK);
  CHECK(local[0] == 0xab && local[4095] == 0xab);
  orbite_request_result res[2];
  CHECK_STATUS(orbite_batch_results(b, res, 2), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_STATUS(orbite_batch_results(b, NULL, 1), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_results(NULL, res, 1), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_results(b, res, 1), ORBITE_STATUS_OK);
  CHECK(res[0].status == ORBITE_STATUS_OK && res[0].remote_effect == ORBITE_REMOTE_EFFECT_NONE);
  orbite_request_result one = {77, 77};
  CHECK_STATUS(orbite_batch_result(NULL, 0, &one), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_result(b, 0, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_result(b, 1, &one), ORBITE_STATUS_OUT_OF_RANGE);
  CHECK_ERROR_MENTIONS("holds 1 requests");
  CHECK(one.status == 77);
  CHECK_STATUS(orbite_batch_result(b, 0, &one), ORBITE_STATUS_OK);
  CHECK(one.status == ORBITE_STATUS_OK && one.remote_effect == ORBITE_REMOTE_EFFECT_NONE);
  uint32_t carried = 99;
  CHECK_STATUS(orbite_batch_transport(NULL, 0, &carried), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_transport(b, 0, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_transport(b, 1, &carried), ORBITE_STATUS_OUT_OF_RANGE);
  CHECK(carried == 99);
  CHECK_STATUS(orbite_batch_transport(b, 0, &carried), ORBITE_STATUS_OK);
  CHECK(carried == ORBITE_TRANSPORT_TCP);
  CHECK_STATUS(orbite_batch_poll(NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_wait(NULL, 0), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_cancel(NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_batch_cancel(b), ORBITE_STATUS_OK); /* already done: no effect */
  /* One request alone: a NULL batch, an index past the end (named), and an
     ended request (no effect). */
  CHECK_STATUS(orbite_batch_cancel_request(NULL, 0), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_ERROR_MENTIONS("batch is NULL");
  CHECK_STATUS(orbite_batch_cancel_request(b, 1), ORBITE_STATUS_OUT_OF_RANGE);
  CHECK_ERROR_MENTIONS("request index 1: the batch holds 1 requests");
  CHECK_STATUS(orbite_batch_cancel_request(b, SIZE_MAX), ORBITE_STATUS_OUT_OF_RANGE);
  CHECK_STATUS(orbite_batch_cancel_request(b, 0), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_results(b, res, 1), ORBITE_STATUS_OK);
  CHECK(res[0].status == ORBITE_STATUS_OK);
  orbite_batch_free(b);
  orbite_batch_free(NULL);

  /* A WRITE into a read-only remote region fails per request. */
  orbite_request w = {ORBITE_OP_WRITE, (uint64_t)(uintptr_t)local, (uint64_t)(uintptr_t)remote, 16};
  CHECK_STATUS(orbite_submit(req, peer, &w, 1, NULL, &b), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_wait(b, 30000), ORBITE_STATUS_TRANSFER_FAILED);
  CHECK_ERROR_MENTIONS("WRITE");
  CHECK_STATUS(orbite_batch_results(b, res, 1), ORBITE_STATUS_OK);
  CHECK(res[0].status == ORBITE_STATUS_PERMISSION_DENIED);
  CHECK(res[0].remote_effect == ORBITE_REMOTE_EFFECT_NONE);
  orbite_batch_free(b);

  CHECK_STATUS(orbite_disconnect(NULL, peer, 0), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_disconnect(req, 31337, 0), ORBITE_STATUS_NOT_FOUND);
  CHECK_STATUS(orbite_disconnect(req, peer, 5000), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_submit(req, peer, &r, 1, NULL, &b), ORBITE_STATUS_NOT_FOUND);
  CHECK_STATUS(orbite_unregister_memory(src, rr, 0), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_unregister_memory(req, lr, 0), ORBITE_STATUS_OK);
}

/* A batch outlives its engine: freeing the engine ends every request of a
   pending batch (completed, or UNAVAILABLE with remote effect NONE for a
   READ; never left pending), and the batch stays readable until freed. */
static void batch_outlives_engine(void) {
  enum { N = 16, PIECE = 256 * 1024 };
  static uint8_t remote[N * PIECE], local[N * PIECE];
  memset(remote, 0x5a, sizeof remote);
  orbite_engine *src = NULL, *req = NULL;
  CHECK_STATUS(orbite_engine_new(NULL, &src), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_engine_new(NULL, &req), ORBITE_STATUS_OK);
  uint64_t rr = 0, lr = 0, peer = 0;
  CHECK_STATUS(orbite_register_memory(src, remote, sizeof remote, ORBITE_ACCESS_READ, &rr), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_register_memory(req, local, sizeof local, 0, &lr), ORBITE_STATUS_OK);
  char ep[128];
  size_t len = 0;
  CHECK_STATUS(orbite_engine_endpoint(src, ep, sizeof ep, &len), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_connect(req, ep, 5000, &peer), ORBITE_STATUS_OK);
  orbite_request r[N];
  for (int i = 0; i < N; i++) {
    orbite_request one = {ORBITE_OP_READ, (uint64_t)(uintptr_t)(local + i * PIECE),
                          (uint64_t)(uintptr_t)(remote + i * PIECE), PIECE};
    r[i] = one;
  }
  orbite_submit_options o = {ORBITE_TRANSPORT_TCP, 30000};
  orbite_batch *done = NULL, *pending = NULL;
  CHECK_STATUS(orbite_submit(req, peer, r, N, &o, &done), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_wait(done, 30000), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_submit(req, peer, r, N, &o, &pending), ORBITE_STATUS_OK);
  orbite_engine_free(req); /* closes the connection and joins its threads */

  orbite_status s = orbite_batch_wait(pending, 30000);
  CHECK(s == ORBITE_STATUS_OK || s == ORBITE_STATUS_TRANSFER_FAILED);
  orbite_request_result res[N];
  CHECK_STATUS(orbite_batch_results(pending, res, N), ORBITE_STATUS_OK);
  for (int i = 0; i < N; i++) {
    CHECK(res[i].status == ORBITE_STATUS_OK || res[i].status == ORBITE_STATUS_UNAVAILABLE);
    CHECK(res[i].remote_effect == ORBITE_REMOTE_EFFECT_NONE);
  }
  CHECK_STATUS(orbite_batch_results(done, res, N), ORBITE_STATUS_OK);
  CHECK(res[0].status == ORBITE_STATUS_OK && res[N - 1].status == ORBITE_STATUS_OK);
  uint32_t carried = 0;
  CHECK_STATUS(orbite_batch_transport(done, N - 1, &carried), ORBITE_STATUS_OK);
  CHECK(carried == ORBITE_TRANSPORT_TCP);
  CHECK_STATUS(orbite_batch_poll(done), ORBITE_STATUS_OK);
  orbite_batch_free(done);
  orbite_batch_free(pending);
  CHECK_STATUS(orbite_close(src, 5000), ORBITE_STATUS_OK);
  orbite_engine_free(src);
}

static void nobody_listens(orbite_engine *req) {
  orbite_engine *gone = NULL;
  CHECK_STATUS(orbite_engine_new(NULL, &gone), ORBITE_STATUS_OK);
  char ep[128];
  size_t len = 0;
  CHECK_STATUS(orbite_engine_endpoint(gone, ep, sizeof ep, &len), ORBITE_STATUS_OK);
  orbite_engine_free(gone);
  uint64_t peer = 42;
  orbite_status s = orbite_connect(req, ep, 2000, &peer);
  CHECK(s == ORBITE_STATUS_UNAVAILABLE || s == ORBITE_STATUS_TIMED_OUT);
  CHECK(peer == 42);
}

/* Discovery's C surface without an etcd: orbite_connect_name on an engine
   without discovery is UNAVAILABLE (out_peer untouched); discovery without
   a name is INVALID_CONFIG; an etcd nobody serves is UNAVAILABLE at start
   naming the address (NOT_SUPPORTED in a build without the etcd feature).
   tests/discovery.rs runs the rest against a real etcd. */
static void discovery_without_etcd(orbite_engine *e) {
  uint64_t peer = 42;
  CHECK_STATUS(orbite_connect_name(e, "prefill-0", 1000, &peer), ORBITE_STATUS_UNAVAILABLE);
  CHECK_ERROR_MENTIONS("no discovery is configured");
  CHECK(peer == 42);
  CHECK_STATUS(orbite_connect_name(e, NULL, 1000, &peer), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_connect_name(e, "not a name", 1000, &peer), ORBITE_STATUS_INVALID_ARGUMENT);
  orbite_engine *d = NULL;
  CHECK_STATUS(orbite_engine_new("{\"discovery\": {\"etcd\": [\"http://127.0.0.1:1\"]}}", &d),
               ORBITE_STATUS_INVALID_CONFIG);
  CHECK_ERROR_MENTIONS("needs `name`");
  orbite_status s = orbite_engine_new(
      "{\"name\": \"x\", \"default_timeout_ms\": 300, \"discovery\": {\"etcd\": [\"http://127.0.0.1:1\"]}}", &d);
  CHECK(s == ORBITE_STATUS_UNAVAILABLE || s == ORBITE_STATUS_NOT_SUPPORTED);
  CHECK_ERROR_MENTIONS(s == ORBITE_STATUS_UNAVAILABLE ? "http://127.0.0.1:1" : "etcd");
  CHECK(d == NULL);
}

/* Every handle is checked for its type and liveness before it is touched:
 * a batch passed as an engine, an engine as a batch or an allocation, a
 * freed batch and a pointer the library never gave out are
 * INVALID_ARGUMENT, naming what they are; nothing is dereferenced (ASan and
 * valgrind run this), and a free of a wrong handle leaves it alone. */
static void handles_are_checked_for_their_type(void) {
  static uint8_t remote[4096], local[4096];
  orbite_engine *src = NULL, *req = NULL;
  CHECK_STATUS(orbite_engine_new(NULL, &src), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_engine_new(NULL, &req), ORBITE_STATUS_OK);
  uint64_t rr = 0, lr = 0, peer = 0;
  CHECK_STATUS(orbite_register_memory(src, remote, sizeof remote, ORBITE_ACCESS_READ, &rr), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_register_memory(req, local, sizeof local, 0, &lr), ORBITE_STATUS_OK);
  char ep[128];
  size_t len = 0;
  CHECK_STATUS(orbite_engine_endpoint(src, ep, sizeof ep, &len), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_connect(req, ep, 5000, &peer), ORBITE_STATUS_OK);
  orbite_request r = {ORBITE_OP_READ, (uint64_t)(uintptr_t)local, (uint64_t)(uintptr_t)remote, sizeof local};
  orbite_batch *b = NULL;
  CHECK_STATUS(orbite_submit(req, peer, &r, 1, NULL, &b), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_wait(b, 30000), ORBITE_STATUS_OK);

  CHECK_STATUS(orbite_engine_endpoint((orbite_engine *)b, ep, sizeof ep, &len), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("is an orbite_batch, not an orbite_engine");
  CHECK_STATUS(orbite_batch_poll((orbite_batch *)req), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("is an orbite_engine, not an orbite_batch");
  CHECK(orbite_allocation_addr((orbite_allocation *)req) == NULL);
  CHECK(orbite_allocation_length((orbite_allocation *)b) == 0);
  CHECK_STATUS(orbite_engine_endpoint((orbite_engine *)local, ep, sizeof ep, &len), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("not a live handle");
  /* A free of the wrong type changes nothing: both still work. */
  orbite_batch_free((orbite_batch *)req);
  orbite_engine_free((orbite_engine *)b);
  CHECK_STATUS(orbite_engine_endpoint(req, ep, sizeof ep, &len), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_poll(b), ORBITE_STATUS_OK);
  orbite_batch_free(b);
  CHECK_STATUS(orbite_batch_poll(b), ORBITE_STATUS_INVALID_ARGUMENT);
  CHECK_ERROR_MENTIONS("not a live handle");
  orbite_batch_free(b); /* a second free is refused, not a double free */
  CHECK_STATUS(orbite_close(req, 5000), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_close(src, 5000), ORBITE_STATUS_OK);
  orbite_engine_free(req);
  orbite_engine_free(src);
}

int main(void) {
  orbite_engine *e = (orbite_engine *)SENTINEL_PTR;
  CHECK_STATUS(orbite_engine_new(NULL, NULL), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_ERROR_MENTIONS("out_engine");
  CHECK_STATUS(orbite_engine_new("{}", &e), ORBITE_STATUS_OK);
  orbite_engine *src = NULL;
  CHECK_STATUS(orbite_engine_new("", &src), ORBITE_STATUS_OK);

  text_out_rules(e);
  static uint8_t mem[8192];
  registration(e, mem, sizeof mem);
  allocations(e);
  peers_and_submit(src, e);
  nobody_listens(e);
  discovery_without_etcd(e);
  batch_outlives_engine();
  handles_are_checked_for_their_type();

  CHECK_STATUS(orbite_flush_nvlink_cache(NULL, 0), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_flush_nvlink_cache(e, 0), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_close_requester(NULL, 0), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_close_source(NULL, 0), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_close(NULL, 0), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_close(e, 5000), ORBITE_STATUS_OK);
  /* After close: calls fail cleanly. */
  uint64_t region = 3;
  CHECK_STATUS(orbite_register_memory(e, mem, 16, ORBITE_ACCESS_READ, &region), ORBITE_STATUS_UNAVAILABLE);
  CHECK_ERROR_MENTIONS("closed");
  orbite_request r = {ORBITE_OP_READ, (uint64_t)(uintptr_t)mem, 1, 1};
  orbite_batch *b = NULL;
  CHECK_STATUS(orbite_submit(e, 1, &r, 1, NULL, &b), ORBITE_STATUS_UNAVAILABLE);
  orbite_engine_free(e);
  orbite_engine_free(src);
  orbite_engine_free(NULL);
  return check_report("test_api");
}
