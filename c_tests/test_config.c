/* Config errors: each bad config is INVALID_CONFIG naming the key. */
#include "check.h"

static void expect_bad(const char *json, const char *key) {
  orbite_engine *e = (orbite_engine *)0x1;
  CHECK_STATUS(orbite_engine_new(json, &e), ORBITE_STATUS_INVALID_CONFIG);
  CHECK(e == (orbite_engine *)0x1); /* out-param untouched on failure */
  CHECK_ERROR_MENTIONS(key);
}

int main(void) {
  expect_bad("{\"no_such_key\": 1}", "no_such_key");
  expect_bad("{\"nvlink\": \"yes\"}", "nvlink");
  expect_bad("{\"max_inflight_bytes\": -5}", "max_inflight_bytes");
  expect_bad("{\"max_inflight_bytes\": 12}", "max_inflight_bytes");
  expect_bad("{\"nvlink_cache_entries\": 4097}", "nvlink_cache_entries");
  expect_bad("{\"nvlink_stream_count\": 0}", "nvlink_stream_count");
  expect_bad("{\"nvlink_async_memcpy_threshold_kb\": 1.5}", "nvlink_async_memcpy_threshold_kb");
  expect_bad("{\"transport_policy\": [\"carrier-pigeon\"]}", "transport_policy");
  expect_bad("{\"default_timeout_ms\": 0}", "default_timeout_ms");
  expect_bad("{\"listen\": \"nowhere\"}", "listen");
  expect_bad("{\"nvlink\": true, \"mnnvl\": {}}", "mnnvl");
  expect_bad("{\"mnnvl\": {\"handle_type\": \"magic\"}}", "mnnvl.handle_type");
  expect_bad("{\"mnnvl\": {\"fabric_domain\": \"12\"}}", "mnnvl.fabric_domain");
  expect_bad("{\"max_transfer_bytes\": 1073741824, \"max_inflight_bytes\": 1048576}", "max_transfer_bytes");
  expect_bad("not json", "JSON");
  expect_bad("[]", "object");

  /* Good configs: NULL, "", {}, and explicit values. */
  const char *good[] = {NULL, "", "{}", "{\"mnnvl\": null, \"nvlink\": false}",
                        "{\"max_transfer_bytes\": 65536, \"transport_policy\": [\"tcp\"]}",
                        "{\"mnnvl\": {\"handle_type\": \"posix_fd\", \"egm\": true}}"};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    orbite_engine *e = NULL;
    CHECK_STATUS(orbite_engine_new(good[i], &e), ORBITE_STATUS_OK);
    CHECK(e != NULL);
    orbite_engine_free(e);
  }
  return check_report("test_config");
}
