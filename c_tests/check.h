/* Minimal assertion helpers for the C tests. */
#ifndef ORBITE_C_TESTS_CHECK_H
#define ORBITE_C_TESTS_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orbite.h"

static int check_failures = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
      check_failures++;                                                          \
    }                                                                            \
  } while (0)

/* A call must return `want`; on failure print both names and the message. */
#define CHECK_STATUS(call, want)                                                 \
  do {                                                                           \
    orbite_status got_ = (call);                                                 \
    if (got_ != (orbite_status)(want)) {                                         \
      fprintf(stderr, "%s:%d: %s returned %s, wanted %s (%s)\n", __FILE__,       \
              __LINE__, #call, orbite_status_name(got_),                         \
              orbite_status_name(want), orbite_last_error());                    \
      check_failures++;                                                          \
    }                                                                            \
  } while (0)

/* The last error must be non-empty and contain `needle`. */
#define CHECK_ERROR_MENTIONS(needle)                                             \
  do {                                                                           \
    const char *m_ = orbite_last_error();                                        \
    if (m_ == NULL || strstr(m_, (needle)) == NULL) {                            \
      fprintf(stderr, "%s:%d: last error \"%s\" does not mention \"%s\"\n",      \
              __FILE__, __LINE__, m_ ? m_ : "(null)", (needle));                 \
      check_failures++;                                                          \
    }                                                                            \
  } while (0)

static int check_report(const char *name) {
  if (check_failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
    return 1;
  }
  printf("%s: all checks passed\n", name);
  return 0;
}

#endif
