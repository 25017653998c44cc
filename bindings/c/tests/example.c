/* The example of include/distlock/distlock.h (and docs/c.md), compiled as C99 and run by
 * ctest: example URL. write_order() stands for the caller's fenced write. */
#include <inttypes.h>
#include <stdio.h>

#include "distlock/distlock.h"

static void write_order(uint64_t token) {
  printf("order 42 written with token %" PRIu64 "\n", token);
}

int main(int argc, char** argv) {
  const char* url = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
  distlock_client* client = NULL;
  distlock_lease* lease = NULL;
  distlock_error err;
  if (distlock_connect(url, NULL, &client, &err) != DISTLOCK_OK) {
    fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  distlock_lock_options opts;
  distlock_lock_options_init(&opts);
  opts.ttl_ms = 10000; /* lease length on the server, renewed while held */
  opts.wait_ms = 5000; /* give up after 5 s (DISTLOCK_E_TIMEOUT) */
  int rc = distlock_acquire(client, "orders/42", &opts, &lease, &err);
  if (rc == DISTLOCK_OK) {
    uint64_t token = 0;
    distlock_lease_token(lease, &token, &err);
    write_order(token);                       /* pass the fencing token on */
    rc = distlock_lease_release(lease, &err); /* DISTLOCK_E_LOST if it had been lost */
    distlock_lease_free(lease);
  }
  if (rc != DISTLOCK_OK) fprintf(stderr, "%s\n", err.message);
  distlock_client_close(client);
  return rc == DISTLOCK_OK ? 0 : 1;
}
