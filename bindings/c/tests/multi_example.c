/* docs/c.md's multi-lease example, compiled as C99 and run by the c_api test:
 * multi_example URL. Moves money between two accounts holding both locks at once, with a
 * lock-delay so that a holder that dies mid-transfer keeps the accounts back for 2 s. */
#include <inttypes.h>
#include <stdio.h>

#include "distlock/distlock.h"

static void transfer(uint64_t from_token, uint64_t to_token) {
  printf("transfer written with tokens %" PRIu64 " and %" PRIu64 "\n", from_token, to_token);
}

int main(int argc, char** argv) {
  const char* url = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
  distlock_client* client = NULL;
  distlock_error err;
  if (distlock_connect(url, NULL, &client, &err) != DISTLOCK_OK) {
    fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  /* docs begin */
  const char* accounts[] = {"accounts/7", "accounts/3"}; /* any order: taken sorted */
  distlock_lock_options opts;
  distlock_lock_options_init(&opts);
  opts.wait_ms = 5000; /* bounds the whole call */
  distlock_lock_options_ext ext;
  distlock_lock_options_ext_init(&ext);
  ext.lock_delay_ms = 2000; /* a lost holder keeps both names back for 2 s */
  distlock_multi_lease* both = NULL;
  int rc = distlock_acquire_all(client, accounts, 2, &opts, &ext, &both, &err);
  if (rc == DISTLOCK_OK) {
    uint64_t from = 0, to = 0;
    distlock_multi_lease_token(both, "accounts/7", &from, &err);
    distlock_multi_lease_token(both, "accounts/3", &to, &err);
    if (distlock_multi_lease_owns(both)) transfer(from, to); /* 0 once either name is lost */
    rc = distlock_multi_lease_release(both, &err);           /* DISTLOCK_E_LOST if one was lost */
    distlock_multi_lease_free(both);
  }
  /* docs end */
  if (rc != DISTLOCK_OK) fprintf(stderr, "%s\n", err.message);
  distlock_client_close(client);
  return rc;
}
