/* The log callback through the C ABI: the exact lines an engine's start and
 * close give at the exact levels; the config's log_level filters them and
 * ORBITE_LOG wins over it; strict parsing of both; the callback cannot be
 * changed from inside itself; NULL restores stderr (one line per event:
 * timestamp, level, the same text). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>
#include "check.h"

#define MAX_LINES 32

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uint32_t level;
  char text[512];
} lines[MAX_LINES];
static int n_lines = 0;
static int wrong_user_data = 0;
static int token; /* its address is the callback's user_data */
static int change_inside = 0;
static orbite_status inside_status = 0xffff;

static void on_log(uint32_t level, const char *message, void *user_data) {
  pthread_mutex_lock(&mu);
  if (user_data != &token) wrong_user_data++;
  if (n_lines < MAX_LINES) {
    lines[n_lines].level = level;
    snprintf(lines[n_lines].text, sizeof lines[n_lines].text, "%s", message);
  }
  n_lines++;
  int change = change_inside;
  pthread_mutex_unlock(&mu);
  /* Refused: it would wait for this very call to end. */
  if (change) inside_status = orbite_set_log_callback(NULL, NULL);
}

static int take_lines(void) {
  pthread_mutex_lock(&mu);
  int n = n_lines;
  n_lines = 0;
  pthread_mutex_unlock(&mu);
  return n;
}

/* Starts an engine of `config`, closes and frees it; writes "[LABEL]" (its
 * name, if any, and endpoint) and the names of its transports ("tcp, shm"). */
static void cycle(const char *config, const char *name, char *label, size_t label_cap, char *transports,
                  size_t transports_cap) {
  orbite_engine *e = NULL;
  label[0] = transports[0] = '\0';
  CHECK_STATUS(orbite_engine_new(config, &e), ORBITE_STATUS_OK);
  if (!e) return;
  char ep[128];
  size_t len = 0;
  CHECK_STATUS(orbite_engine_endpoint(e, ep, sizeof ep, &len), ORBITE_STATUS_OK);
  snprintf(label, label_cap, name ? "[%s %s]" : "[%s%s]", name ? name : "", ep);
  uint32_t mask = 0;
  CHECK_STATUS(orbite_engine_transports(e, &mask), ORBITE_STATUS_OK);
  static const struct {
    uint32_t t;
    const char *name;
  } order[] = {{ORBITE_TRANSPORT_TCP, "tcp"},
               {ORBITE_TRANSPORT_SHM, "shm"},
               {ORBITE_TRANSPORT_NVLINK, "nvlink"},
               {ORBITE_TRANSPORT_MNNVL, "mnnvl"},
               {ORBITE_TRANSPORT_CMA, "cma"}};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    if (mask & (1u << order[i].t)) {
      size_t at = strlen(transports);
      snprintf(transports + at, transports_cap - at, "%s%s", at ? ", " : "", order[i].name);
    }
  }
  CHECK_STATUS(orbite_close(e, 10000), ORBITE_STATUS_OK);
  orbite_engine_free(e);
}

static void check_line(int i, uint32_t level, const char *want) {
  CHECK(lines[i].level == level);
  if (strcmp(lines[i].text, want) != 0) {
    fprintf(stderr, "line %d is \"%s\", wanted \"%s\"\n", i, lines[i].text, want);
    check_failures++;
  }
}

int main(void) {
  char label[256], transports[64], want[512];
  /* The test's own environment decides nothing. */
  unsetenv("ORBITE_LOG");
  CHECK_STATUS(orbite_set_log_callback(on_log, &token), ORBITE_STATUS_OK);

  /* At info: the start and the close, exactly, in order. */
  cycle("{\"name\": \"logtest\", \"log_level\": \"info\"}", "logtest", label, sizeof label, transports,
        sizeof transports);
  int n = take_lines();
  CHECK(n == 2);
  if (n == 2) {
    snprintf(want, sizeof want, "%s engine started (transports: %s; log level info)", label, transports);
    check_line(0, ORBITE_LOG_INFO, want);
    snprintf(want, sizeof want, "%s engine closed", label);
    check_line(1, ORBITE_LOG_INFO, want);
  }
  CHECK(strncmp(transports, "tcp", 3) == 0);
  CHECK(wrong_user_data == 0);

  /* The default level (warn) and "off" pass neither. */
  cycle("{\"name\": \"quiet\"}", "quiet", label, sizeof label, transports, sizeof transports);
  cycle("{\"log_level\": \"off\"}", NULL, label, sizeof label, transports, sizeof transports);
  CHECK(take_lines() == 0);

  /* ORBITE_LOG wins over the config, both ways, and says so. */
  setenv("ORBITE_LOG", "off", 1);
  cycle("{\"log_level\": \"trace\"}", NULL, label, sizeof label, transports, sizeof transports);
  CHECK(take_lines() == 0);
  setenv("ORBITE_LOG", "info", 1);
  cycle("{\"log_level\": \"off\"}", NULL, label, sizeof label, transports, sizeof transports);
  n = take_lines();
  CHECK(n == 2);
  if (n == 2) {
    snprintf(want, sizeof want, "%s engine started (transports: %s; log level info from ORBITE_LOG)", label,
             transports);
    check_line(0, ORBITE_LOG_INFO, want);
  }
  /* Strict: an unknown level in either place is INVALID_CONFIG naming it. */
  orbite_engine *e = NULL;
  setenv("ORBITE_LOG", "verbose", 1);
  CHECK_STATUS(orbite_engine_new(NULL, &e), ORBITE_STATUS_INVALID_CONFIG);
  CHECK_ERROR_MENTIONS("ORBITE_LOG");
  CHECK(e == NULL);
  unsetenv("ORBITE_LOG");
  CHECK_STATUS(orbite_engine_new("{\"log_level\": \"INFO\"}", &e), ORBITE_STATUS_INVALID_CONFIG);
  CHECK_ERROR_MENTIONS("`log_level`");
  CHECK(e == NULL);
  CHECK(take_lines() == 0);

  /* From inside the callback it cannot be changed (UNAVAILABLE), and the
   * callback stays installed. */
  change_inside = 1;
  cycle("{\"log_level\": \"info\"}", NULL, label, sizeof label, transports, sizeof transports);
  change_inside = 0;
  CHECK(inside_status == ORBITE_STATUS_UNAVAILABLE);
  CHECK(take_lines() == 2);

  /* NULL restores stderr: the same lines, with a timestamp and the level. */
  CHECK_STATUS(orbite_set_log_callback(NULL, NULL), ORBITE_STATUS_OK);
  char path[] = "/tmp/orbite-test-log-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  cycle("{\"name\": \"to-stderr\", \"log_level\": \"info\"}", "to-stderr", label, sizeof label, transports,
        sizeof transports);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char text[4096] = {0};
  ssize_t got = pread(fd, text, sizeof text - 1, 0);
  close(fd);
  unlink(path);
  CHECK(got > 0);
  CHECK(take_lines() == 0);
  /* "2026-12-01T09:05:03.000042Z orbite INFO [to-stderr 127.0.0.1:P] engine started (...)\n" */
  char *second = strchr(text, '\n');
  CHECK(second != NULL && strchr(second + 1, '\n') == text + strlen(text) - 1);
  snprintf(want, sizeof want, "Z orbite INFO %s engine started (transports: %s; log level info)\n", label,
           transports);
  CHECK(strlen(text) > 27 && text[4] == '-' && text[10] == 'T' && strncmp(text + 26, want, strlen(want)) == 0);
  snprintf(want, sizeof want, "Z orbite INFO %s engine closed\n", label);
  CHECK(second != NULL && strlen(second + 1) > 27 && strncmp(second + 1 + 26, want, strlen(want)) == 0);
  if (check_failures) fprintf(stderr, "stderr held:\n%s", text);
  return check_report("test_log");
}
