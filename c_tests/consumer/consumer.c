/* Uses only the installed header and library: one READ between two engines. */
#include <orbite.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  if (orbite_abi_version() != ORBITE_ABI_VERSION) return 10;
  orbite_engine *a = NULL, *b = NULL;
  if (orbite_engine_new(NULL, &a) || orbite_engine_new(NULL, &b)) return 11;
  static char src[4096], dst[4096];
  memset(src, 'z', sizeof src);
  uint64_t r1, r2, peer;
  if (orbite_register_memory(a, src, sizeof src, ORBITE_ACCESS_READ, &r1)) return 12;
  if (orbite_register_memory(b, dst, sizeof dst, 0, &r2)) return 13;
  char ep[128];
  size_t len;
  if (orbite_engine_endpoint(a, ep, sizeof ep, &len) || orbite_connect(b, ep, 5000, &peer)) return 14;
  orbite_request r = {ORBITE_OP_READ, (uint64_t)(uintptr_t)dst, (uint64_t)(uintptr_t)src, sizeof src};
  orbite_batch *batch = NULL;
  if (orbite_submit(b, peer, &r, 1, NULL, &batch) || orbite_batch_wait(batch, 30000)) return 15;
  orbite_batch_free(batch);
  int ok = memcmp(src, dst, sizeof src) == 0;
  orbite_close(b, 5000);
  orbite_close(a, 5000);
  orbite_engine_free(b);
  orbite_engine_free(a);
  printf("consumer (liborbite %s): %s\n", orbite_version(), ok ? "ok" : "bytes differ");
  return ok ? 0 : 16;
}
