/* c_api_tool: C programs over the installed-style C API (include/distlock/distlock.h only),
 * driven by bindings/c/tests/c_api_test.cpp:
 *   c_api_tool hammer URL NAME LOG THREADS ITERS
 *     THREADS threads each take NAME ITERS times; inside each section they append
 *     "B <pid> <thread> <token>" and "E <pid> <thread> <token>" to LOG (O_APPEND, one write per
 *     line), checking distlock_lease_owns() before the end line. The test reads LOG.
 *   c_api_tool hold URL NAME TTL_MS WRITES
 *     Takes NAME, prints "held <token>", then every 10 ms until the lease is lost (at most
 *     60 s): checks the loss signals and, only while it holds, appends "write <token>" to
 *     WRITES; after the third write it stops itself (SIGSTOP) until the test continues it. On loss it prints
 * "lost <how>" (how: fd = the lost descriptor was readable, owns = distlock_lease_owns() said 0 first), waits
 * (bounded, 5 s) for the descriptor and the on_lost callback and prints "fd <0|1> callback <0|1>" and the
 * loss sentence. Exit status 0 on success, 1 with a message on stderr otherwise. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "distlock/distlock.h"

static const char* g_url;
static const char* g_name;
static int g_log = -1;
static int g_iters;
static atomic_int g_failed;

static void append_line(int fd, const char* line) {
  size_t n = strlen(line);
  if (write(fd, line, n) != (ssize_t)n) {
    perror("c_api_tool: write");
    atomic_store(&g_failed, 1);
  }
}

static void* hammer_thread(void* arg) {
  long id = (long)arg;
  distlock_error err;
  distlock_client* client = NULL;
  if (distlock_connect(g_url, NULL, &client, &err) != DISTLOCK_OK) {
    fprintf(stderr, "c_api_tool: connect: %s\n", err.message);
    atomic_store(&g_failed, 1);
    return NULL;
  }
  for (int i = 0; i < g_iters && !atomic_load(&g_failed); ++i) {
    distlock_lease* lease = NULL;
    distlock_lock_options opts;
    distlock_lock_options_init(&opts);
    opts.ttl_ms = 10000;
    opts.wait_ms = 60000;
    if (distlock_acquire(client, g_name, &opts, &lease, &err) != DISTLOCK_OK) {
      fprintf(stderr, "c_api_tool: acquire: %s\n", err.message);
      atomic_store(&g_failed, 1);
      break;
    }
    uint64_t token = 0;
    if (distlock_lease_token(lease, &token, &err) != DISTLOCK_OK) {
      fprintf(stderr, "c_api_tool: token: %s\n", err.message);
      atomic_store(&g_failed, 1);
    }
    char line[128];
    snprintf(line, sizeof line, "B %ld %ld %llu\n", (long)getpid(), id, (unsigned long long)token);
    append_line(g_log, line);
    if (!distlock_lease_owns(lease)) {
      fprintf(stderr, "c_api_tool: the lease was lost inside the section\n");
      atomic_store(&g_failed, 1);
    }
    snprintf(line, sizeof line, "E %ld %ld %llu\n", (long)getpid(), id, (unsigned long long)token);
    append_line(g_log, line);
    if (distlock_lease_release(lease, &err) != DISTLOCK_OK) {
      fprintf(stderr, "c_api_tool: release: %s\n", err.message);
      atomic_store(&g_failed, 1);
    }
    distlock_lease_free(lease);
  }
  distlock_client_close(client);
  return NULL;
}

static int hammer(int argc, char** argv) {
  if (argc != 7) return 2;
  g_url = argv[2];
  g_name = argv[3];
  g_log = open(argv[4], O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (g_log < 0) {
    perror("c_api_tool: open log");
    return 1;
  }
  int threads = atoi(argv[5]);
  g_iters = atoi(argv[6]);
  pthread_t tids[64];
  if (threads < 1 || threads > 64) return 2;
  for (long t = 0; t < threads; ++t) pthread_create(&tids[t], NULL, hammer_thread, (void*)t);
  for (int t = 0; t < threads; ++t) pthread_join(tids[t], NULL);
  close(g_log);
  return atomic_load(&g_failed) ? 1 : 0;
}

static atomic_int g_callback_ran;
static void on_lost(void* user) {
  (void)user;
  atomic_store(&g_callback_ran, 1);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int hold(int argc, char** argv) {
  if (argc != 6) return 2;
  distlock_error err;
  distlock_client* client = NULL;
  if (distlock_connect(argv[2], NULL, &client, &err) != DISTLOCK_OK) {
    fprintf(stderr, "c_api_tool: connect: %s\n", err.message);
    return 1;
  }
  distlock_lock_options opts;
  distlock_lock_options_init(&opts);
  opts.ttl_ms = atoll(argv[4]);
  opts.wait_ms = 10000;
  distlock_lease* lease = NULL;
  if (distlock_acquire(client, argv[3], &opts, &lease, &err) != DISTLOCK_OK) {
    fprintf(stderr, "c_api_tool: acquire: %s\n", err.message);
    return 1;
  }
  uint64_t token = 0;
  if (distlock_lease_token(lease, &token, &err) != DISTLOCK_OK ||
      distlock_lease_on_lost(lease, on_lost, NULL, &err) != DISTLOCK_OK) {
    fprintf(stderr, "c_api_tool: %s\n", err.message);
    return 1;
  }
  int writes = open(argv[5], O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (writes < 0) {
    perror("c_api_tool: open writes");
    return 1;
  }
  printf("held %llu\n", (unsigned long long)token);
  fflush(stdout);
  struct pollfd pfd = {distlock_lease_lost_fd(lease), POLLIN, 0};
  const char* how = NULL;
  int written = 0;
  const int64_t end = now_ms() + 60000;
  while (how == NULL && now_ms() < end) {
    pfd.revents = 0;
    if (poll(&pfd, 1, 10) > 0) {
      how = "fd";
    } else if (!distlock_lease_owns(lease)) {
      how = "owns";
    } else {
      char line[64];
      snprintf(line, sizeof line, "write %llu\n", (unsigned long long)token);
      append_line(writes, line);
      /* After the third write it stops itself, right after a write and before the next check:
       * the test then sees whether the first thing it does on SIGCONT is to notice the loss.
       * (A stop between a check and a write would let that one write through: no lock can
       * prevent it, which is what the fencing token is for.) */
      if (++written == 3) raise(SIGSTOP);
    }
  }
  if (how == NULL) {
    fprintf(stderr, "c_api_tool: the lease was not lost within 60 s\n");
    return 1;
  }
  printf("lost %s\n", how);
  /* The descriptor and the callback follow (the callback on the client's event thread). */
  int fd_fired = 0;
  const int64_t wait_end = now_ms() + 5000;
  while ((!fd_fired || !atomic_load(&g_callback_ran)) && now_ms() < wait_end) {
    pfd.revents = 0;
    if (poll(&pfd, 1, 10) > 0) fd_fired = 1;
  }
  printf("fd %d callback %d\n", fd_fired, atomic_load(&g_callback_ran));
  distlock_lease_loss(lease, &err);
  printf("loss %d %s\n", err.code, err.message);
  int rc = distlock_lease_release(lease, &err);
  printf("release %s\n", distlock_status_name(rc));
  fflush(stdout);
  distlock_lease_free(lease);
  distlock_client_close(client);
  close(writes);
  return atomic_load(&g_failed) ? 1 : 0;
}

int main(int argc, char** argv) {
  int rc = 2;
  if (argc > 1 && strcmp(argv[1], "hammer") == 0) rc = hammer(argc, argv);
  if (argc > 1 && strcmp(argv[1], "hold") == 0) rc = hold(argc, argv);
  if (rc == 2)
    fprintf(stderr, "usage: c_api_tool hammer URL NAME LOG THREADS ITERS | hold URL NAME TTL_MS WRITES\n");
  return rc;
}
