/* The shard group example of docs/c.md and docs/sharding.md, compiled as C99 and run by ctest
 * (c_shard_group): shard_example URL. Joins the group "reindex" of 4 shards, waits until it owns
 * its share (here all four: it is alone), works on each shard with its token until the shard's
 * stopped descriptor fires, and leaves. */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>

#include "distlock/distlock.h"

static void reindex_shard(uint32_t index, uint64_t token) {
  printf("shard %" PRIu32 " reindexed with token %" PRIu64 "\n", index, token);
}

int main(int argc, char** argv) {
  const char* url = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
  distlock_client* client = NULL;
  distlock_shard_group* member = NULL;
  distlock_shard_assignment* now = NULL;
  distlock_error err;
  if (distlock_connect(url, NULL, &client, &err) != DISTLOCK_OK) {
    fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  distlock_shard_group_options opts;
  distlock_shard_group_options_init(&opts);
  opts.ttl_ms = 10000; /* membership and shard leases, renewed while held */
  if (distlock_shard_group_join(client, "reindex", 4, &opts, &member, &err) != DISTLOCK_OK) {
    fprintf(stderr, "%s\n", err.message);
    distlock_client_close(client);
    return 1;
  }
  /* Wait (30 s at most per change) until this member owns its share. */
  int rc = distlock_shard_group_assigned(member, &now, &err);
  while (rc == DISTLOCK_OK && distlock_shard_assignment_count(now) < 4) {
    distlock_shard_assignment* next = NULL;
    rc = distlock_shard_group_wait_change(member, distlock_shard_assignment_version(now), 30000, NULL, &next,
                                          &err);
    if (rc == DISTLOCK_OK) {
      distlock_shard_assignment_free(now);
      now = next;
    }
  }
  if (rc == DISTLOCK_OK) {
    size_t i;
    for (i = 0; i < distlock_shard_assignment_count(now); ++i) {
      distlock_owned_shard s;
      distlock_shard_assignment_shard(now, i, &s, &err);
      if (distlock_shard_assignment_owns(now, i)) reindex_shard(s.index, s.token); /* fenced writes */
    }
  }
  distlock_shard_group_leave(member); /* every shard's stopped_fd fires, all released at once */
  if (rc == DISTLOCK_OK) {
    distlock_owned_shard s;
    struct pollfd p;
    distlock_shard_assignment_shard(now, 0, &s, &err);
    p.fd = s.stopped_fd;
    p.events = POLLIN;
    p.revents = 0;
    printf("shard 0 stopped: %d\n", poll(&p, 1, 1000) == 1);
  } else {
    fprintf(stderr, "%s\n", err.message);
  }
  distlock_shard_assignment_free(now);
  distlock_shard_group_free(member);
  distlock_client_close(client);
  return rc == DISTLOCK_OK ? 0 : 1;
}
