// Test certificates made by the openssl command in a temp dir: a CA, a server
// certificate for IP 127.0.0.1 signed by it, a client certificate signed by it (for
// mutual TLS), and a second CA that signed nothing the servers use. Shared by the
// rediss:// and redlocks:// suites.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

// The openssl command, quiet; a failure fails the test with the command.
inline void openssl(const std::string& args) {
  const std::string cmd = "openssl " + args + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

struct Certs {
  TempDir dir{"distlock-tls"};
  std::string path(const char* f) const { return (dir.path() / f).string(); }
  Certs() {
    const std::string d = dir.path().string();
    for (const char* ca : {"ca", "other-ca"}) {
      openssl("req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=distlock-test-" + std::string(ca) +
              " -keyout " + d + "/" + ca + ".key -out " + d + "/" + ca + ".pem");
    }
    std::FILE* ext = std::fopen((d + "/server.ext").c_str(), "w");
    std::fputs("subjectAltName=IP:127.0.0.1\n", ext);
    std::fclose(ext);
    for (const char* who : {"server", "client"}) {
      const std::string w = d + "/" + who;
      openssl("req -newkey rsa:2048 -nodes -subj /CN=" + std::string(who) + " -keyout " + w + ".key -out " +
              w + ".csr");
      openssl("x509 -req -in " + w + ".csr -CA " + d + "/ca.pem -CAkey " + d +
              "/ca.key -CAcreateserial -days 2" +
              (std::string(who) == "server" ? " -extfile " + d + "/server.ext" : std::string()) + " -out " +
              w + ".pem");
    }
  }
};

/// A redis-server that also listens with TLS, using `c`'s server certificate.
inline RedisServerOptions tls_options(const Certs& c, bool auth_clients = false) {
  RedisServerOptions o;
  o.tls_cert = c.path("server.pem");
  o.tls_key = c.path("server.key");
  o.tls_ca = c.path("ca.pem");
  o.tls_auth_clients = auth_clients;
  return o;
}

}  // namespace distlock::testing
