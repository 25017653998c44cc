// etcd_revoke_tool — a revoker process that dies right after its revoke's Txn was applied,
// before the keepalive of the revoked key's lease, for tests/etcd/etcd_revoke_fault_test.cpp.
//
//   etcd_revoke_tool URL LOCK REASON
//
// Connects to URL (an etcd:// URL), sets the etcd backend's revoke hook to raise SIGKILL
// once the revoke's Txn was answered as applied (EtcdBackend::RevokeStep::kApplied), and
// revokes LOCK. Dies by SIGKILL when a holder was revoked. Exit codes: 0 nothing was
// held (nothing revoked, no Txn), 64 usage, 69 an error (printed on stderr), 70 not an etcd
// backend.
#include <signal.h>

#include <cstdio>
#include <string>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/engine.hpp"
#include "etcd/etcd_backend_impl.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: etcd_revoke_tool URL LOCK REASON\n");
    return 64;
  }
  try {
    distlock::ClientOptions opts;
    opts.logger = [](distlock::LogLevel, std::string_view) {};
    distlock::Client client = distlock::connect(argv[1], opts);
    auto* backend =
        dynamic_cast<distlock::detail::etcd::EtcdBackend*>(&distlock::detail::engine_of(client)->backend());
    if (backend == nullptr) {
      std::fprintf(stderr, "etcd_revoke_tool: %s is not an etcd backend\n", argv[1]);
      return 70;
    }
    using Step = distlock::detail::etcd::EtcdBackend::RevokeStep;
    backend->set_revoke_hook_for_test([](Step step) {
      if (step == Step::kApplied) ::raise(SIGKILL);
    });
    const distlock::RevokeResult r = client.revoke(argv[2], argv[3]);
    std::printf("revoked %d\n", r.revoked ? 1 : 0);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "etcd_revoke_tool: %s\n", e.what());
    return 69;
  }
}
