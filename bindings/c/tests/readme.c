/* The README's C snippet, as written there, run by the c_api test: readme URL. */
#include <inttypes.h>
#include <stdio.h>

#include "distlock/distlock.h"

static void write_order(uint64_t token) {
  printf("order 42 written with token %" PRIu64 "\n", token);
}

int main(int argc, char** argv) {
  const char* url = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
  /* README begins */
  /* clang-format off */
  distlock_client* client; distlock_lease* lease; distlock_error err;
  if (distlock_connect(url, NULL, &client, &err) != DISTLOCK_OK) return 1;
  if (distlock_acquire(client, "orders/42", NULL, &lease, &err) == DISTLOCK_OK) {
    uint64_t token; distlock_lease_token(lease, &token, &err);
    write_order(token); distlock_lease_free(lease);  /* released */
  }
  /* clang-format on */
  /* README ends */
  distlock_client_close(client);
  return err.code;
}
