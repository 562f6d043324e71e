/* Version and ABI checks: the header, the library and the SONAME agree. */
#include "check.h"

int main(void) {
  CHECK(orbite_abi_version() == ORBITE_ABI_VERSION);
  CHECK(strcmp(orbite_version(), ORBITE_VERSION_STRING) == 0);
  int major = -1, minor = -1, patch = -1;
  CHECK(sscanf(orbite_version(), "%d.%d.%d", &major, &minor, &patch) == 3);
  CHECK(major >= 0 && minor >= 0 && patch >= 0);
  CHECK(strcmp(orbite_status_name(ORBITE_STATUS_OK), "ORBITE_STATUS_OK") == 0);
  CHECK(strcmp(orbite_status_name(ORBITE_STATUS_PANIC), "ORBITE_STATUS_PANIC") == 0);
  CHECK(strcmp(orbite_status_name(ORBITE_STATUS_BUFFER_TOO_SMALL), "ORBITE_STATUS_BUFFER_TOO_SMALL") == 0);
  CHECK(strcmp(orbite_status_name(9999), "ORBITE_STATUS_UNKNOWN") == 0);
  CHECK(strcmp(orbite_last_error(), "") == 0); /* nothing failed yet */
  CHECK(sizeof(orbite_request) == 32);
  CHECK(sizeof(orbite_submit_options) == 8);
  CHECK(sizeof(orbite_request_result) == 8);
  CHECK(sizeof(orbite_status) == 4);
  CHECK(ORBITE_TRANSPORT_AUTO == 0);
  return check_report("test_version");
}
