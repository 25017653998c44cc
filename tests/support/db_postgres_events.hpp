// A plain connection to PostgreSQL that LISTENs on the channel the lock statements publish to
// (distlock_events), for the tests that check what is published (tests/postgres/
// postgres_watch_test.cpp, postgres_watch_load_test.cpp). It holds no key: it is not a watch.
//
//   EventListener l(url);        connects and LISTENs; l.ok() says whether both worked,
//                                l.error() the server's sentence if not
//   l.events_until(marker)       the payloads heard up to `marker`, which it publishes itself
//                                after every change it must cover (PostgreSQL delivers in commit
//                                order); waits at most 10 s on the steady clock and fails the
//                                test if the marker does not come
//
// Thread-safety: one thread at a time.
#pragma once

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <poll.h>

#include <chrono>
#include <string>
#include <vector>

namespace distlock::testing {

class EventListener {
 public:
  explicit EventListener(const std::string& url) : c_(PQconnectdb(url.c_str())) {
    if (PQstatus(c_) != CONNECTION_OK) return;
    PGresult* r = PQexec(c_, "LISTEN distlock_events");
    listening_ = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
  }
  EventListener(const EventListener&) = delete;
  EventListener& operator=(const EventListener&) = delete;
  ~EventListener() { PQfinish(c_); }

  bool ok() const { return PQstatus(c_) == CONNECTION_OK && listening_; }
  std::string error() const { return PQerrorMessage(c_); }

  std::vector<std::string> events_until(const std::string& marker) {
    std::vector<std::string> seen;
    PGresult* r = PQexec(c_, ("SELECT pg_notify('distlock_events', '" + marker + "')").c_str());
    EXPECT_EQ(PQresultStatus(r), PGRES_TUPLES_OK) << PQerrorMessage(c_);
    PQclear(r);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < end) {
      while (PGnotify* n = PQnotifies(c_)) {
        const std::string payload = n->extra;
        PQfreemem(n);
        if (payload == marker) return seen;
        seen.push_back(payload);
      }
      pollfd p{PQsocket(c_), POLLIN, 0};
      ::poll(&p, 1, 100);
      if (!PQconsumeInput(c_)) break;
    }
    ADD_FAILURE() << "the marker " << marker << " did not come back within 10 s";
    return seen;
  }

 private:
  PGconn* c_;
  bool listening_ = false;
};

}  // namespace distlock::testing
