/* Notifications through the C ABI, two engines in one process: argument
 * checks, a notification alone and with a WRITE batch, the buffer rules of
 * orbite_notification_take (BUFFER_TOO_SMALL leaves it queued), a full
 * queue, and a batch whose failed request sends nothing. */
#include <stdint.h>
#include "check.h"

int main(void) {
  orbite_engine *rx = NULL, *tx = NULL;
  CHECK_STATUS(orbite_engine_new("{\"name\": \"rx\", \"notification_queue\": 2, \"notification_max_bytes\": 64}", &rx),
               ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_engine_new("{\"name\": \"bad name\"}", &tx), ORBITE_STATUS_INVALID_CONFIG);
  CHECK_ERROR_MENTIONS("name");
  CHECK_STATUS(orbite_engine_new("{\"name\": \"tx\"}", &tx), ORBITE_STATUS_OK);
  static uint8_t pool[8192], ro[4096], local[4096];
  uint64_t id = 0;
  CHECK_STATUS(orbite_register_memory(rx, pool, sizeof pool, ORBITE_ACCESS_READ | ORBITE_ACCESS_WRITE, &id), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_register_memory(rx, ro, sizeof ro, ORBITE_ACCESS_READ, &id), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_register_memory(tx, local, sizeof local, 0, &id), ORBITE_STATUS_OK);
  char ep[128];
  size_t len = 0;
  CHECK_STATUS(orbite_engine_endpoint(rx, ep, sizeof ep, &len), ORBITE_STATUS_OK);
  uint64_t peer = 0;
  CHECK_STATUS(orbite_connect(tx, ep, 10000, &peer), ORBITE_STATUS_OK);

  /* Arguments. */
  CHECK_STATUS(orbite_notify(NULL, peer, "x", 1, 1000), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_notify(tx, peer, NULL, 1, 1000), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_notify(tx, 999, "x", 1, 1000), ORBITE_STATUS_NOT_FOUND);
  char big[100] = {0};
  CHECK_STATUS(orbite_notify(tx, peer, big, sizeof big, 1000), ORBITE_STATUS_INVALID_ARGUMENT); /* rx's limit */
  CHECK_ERROR_MENTIONS("notification_max_bytes (64)");
  static char huge[5000];
  CHECK_STATUS(orbite_notify(tx, peer, huge, sizeof huge, 1000), ORBITE_STATUS_INVALID_ARGUMENT); /* tx's own */
  CHECK_ERROR_MENTIONS("notification_max_bytes (4096)");
  char sender[128], msg[64];
  size_t msg_len = 99;
  CHECK_STATUS(orbite_notification_take(rx, 0, sender, sizeof sender, msg, sizeof msg, &msg_len), ORBITE_STATUS_TIMED_OUT);
  CHECK(msg_len == 99);
  CHECK_STATUS(orbite_notification_take(rx, 0, NULL, 0, msg, sizeof msg, &msg_len), ORBITE_STATUS_NULL_ARGUMENT);
  CHECK_STATUS(orbite_notification_take(rx, 0, sender, sizeof sender, NULL, 4, &msg_len), ORBITE_STATUS_NULL_ARGUMENT);

  /* A notification alone; too small buffers leave it queued. */
  CHECK_STATUS(orbite_notify(tx, peer, "hello", 5, 10000), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_notification_take(rx, 1000, sender, sizeof sender, msg, 4, &msg_len), ORBITE_STATUS_BUFFER_TOO_SMALL);
  CHECK(msg_len == 5);
  CHECK_STATUS(orbite_notification_take(rx, 1000, sender, 2, msg, sizeof msg, &msg_len), ORBITE_STATUS_BUFFER_TOO_SMALL);
  CHECK_STATUS(orbite_notification_take(rx, 1000, sender, 3, msg, 5, &msg_len), ORBITE_STATUS_OK);
  CHECK(msg_len == 5 && memcmp(msg, "hello", 5) == 0 && strcmp(sender, "tx") == 0);
  /* An empty one, with no message buffer at all. */
  CHECK_STATUS(orbite_notify(tx, peer, NULL, 0, 10000), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_notification_take(rx, 1000, sender, sizeof sender, NULL, 0, &msg_len), ORBITE_STATUS_OK);
  CHECK(msg_len == 0);

  /* With a WRITE: the bytes are there when it is taken. */
  for (size_t i = 0; i < sizeof local; i++) local[i] = (uint8_t)(i * 13 + 1);
  orbite_request w = {ORBITE_OP_WRITE, (uint64_t)(uintptr_t)local, (uint64_t)(uintptr_t)(pool + 4096), sizeof local};
  orbite_batch *b = NULL;
  CHECK_STATUS(orbite_submit_notify(tx, peer, &w, 1, NULL, "written", 7, &b), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_wait(b, 60000), ORBITE_STATUS_OK);
  orbite_batch_free(b);
  CHECK_STATUS(orbite_notification_take(rx, 10000, sender, sizeof sender, msg, sizeof msg, &msg_len), ORBITE_STATUS_OK);
  CHECK(msg_len == 7 && memcmp(msg, "written", 7) == 0);
  CHECK(memcmp(pool + 4096, local, sizeof local) == 0);

  /* A failed WRITE (read-only region) sends nothing; the batch says why. */
  orbite_request denied = {ORBITE_OP_WRITE, (uint64_t)(uintptr_t)local, (uint64_t)(uintptr_t)ro, 512};
  CHECK_STATUS(orbite_submit_notify(tx, peer, &denied, 1, NULL, "never", 5, &b), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_wait(b, 60000), ORBITE_STATUS_TRANSFER_FAILED);
  char notes[1024];
  CHECK_STATUS(orbite_batch_notes(b, notes, sizeof notes, &len), ORBITE_STATUS_OK);
  CHECK(strstr(notes, "notification not sent") != NULL);
  orbite_batch_free(b);
  CHECK_STATUS(orbite_notification_take(rx, 0, sender, sizeof sender, msg, sizeof msg, &msg_len), ORBITE_STATUS_TIMED_OUT);

  /* A full queue (2) refuses the third; the batch carrying one fails with
     every request OK. */
  CHECK_STATUS(orbite_notify(tx, peer, "1", 1, 10000), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_notify(tx, peer, "2", 1, 10000), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_notify(tx, peer, "3", 1, 10000), ORBITE_STATUS_RESOURCE_EXHAUSTED);
  CHECK_ERROR_MENTIONS("queue is full");
  CHECK_STATUS(orbite_submit_notify(tx, peer, &w, 1, NULL, "4", 1, &b), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_batch_wait(b, 60000), ORBITE_STATUS_TRANSFER_FAILED);
  CHECK_ERROR_MENTIONS("notification was not delivered");
  orbite_request_result res;
  CHECK_STATUS(orbite_batch_result(b, 0, &res), ORBITE_STATUS_OK);
  CHECK(res.status == ORBITE_STATUS_OK && res.remote_effect == ORBITE_REMOTE_EFFECT_APPLIED);
  orbite_batch_free(b);
  CHECK_STATUS(orbite_notification_take(rx, 1000, sender, sizeof sender, msg, sizeof msg, &msg_len), ORBITE_STATUS_OK);
  CHECK(msg_len == 1 && msg[0] == '1');

  char stats[8192];
  CHECK_STATUS(orbite_engine_stats_json(tx, stats, sizeof stats, &len), ORBITE_STATUS_OK);
  CHECK(strstr(stats, "\"notifications\":{\"sent\":8,\"delivered\":5,\"refused\":3,\"not_sent\":1") != NULL);
  CHECK_STATUS(orbite_close(tx, 10000), ORBITE_STATUS_OK);
  CHECK_STATUS(orbite_close(rx, 10000), ORBITE_STATUS_OK);
  orbite_engine_free(tx);
  orbite_engine_free(rx);
  return check_report("test_notify");
}
