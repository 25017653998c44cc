// What a backend's servers still hold once every client is gone, checked the same way by the
// suites that run over many backends (tests/conformance, tests/shard_group):
//
//   expect_no_leftovers(leftovers, limit, where)   waits (at most `limit`, this process's steady
//                                                  clock) until `leftovers()` lists nothing; else
//                                                  fails the test listing what is left
//
// `leftovers` is a Target's (support/backend_targets.hpp) or a cluster's own listing: one line
// a thing left (a key, a node, a row, a session). Two of those listings are written here, for
// the targets and the partition test's clusters alike (templates, so that only a test that
// starts etcd or ZooKeeper includes their harnesses):
//
//   etcd_leftovers(cluster)   every key under "distlock" ("key <k>") of an EtcdCluster
//                             (tests/etcd/etcd_cluster.hpp) and, if any lease is left,
//                             "leases: <etcdctl lease list>"
//   zk_leftovers(raw)         every node below /distlock/<dir> ("node <path>") but a live
//                             session's presence node, read through a RawZk (tests/zk/zk_server.hpp)
//
// Thread-safety: uses only its arguments.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "support/eventually.hpp"

namespace distlock::testing {

inline void expect_no_leftovers(const std::function<std::vector<std::string>()>& leftovers,
                                std::chrono::milliseconds limit, const std::string& where = "server") {
  std::vector<std::string> left;
  const bool clean = eventually(
      [&] {
        left = leftovers();
        return left.empty();
      },
      limit);
  std::string all;
  for (auto& l : left) all += "\n  " + l;
  EXPECT_TRUE(clean) << "left on the " << where << ":" << all;
}

template <class EtcdCluster>
std::vector<std::string> etcd_leftovers(const EtcdCluster& etcd) {
  std::vector<std::string> out;
  const std::string keys = etcd.etcdctl_ok({"get", "--prefix", "distlock", "--keys-only"});
  for (std::size_t pos = 0; pos < keys.size();) {
    std::size_t nl = keys.find('\n', pos);
    if (nl == std::string::npos) nl = keys.size();
    if (nl > pos) out.push_back("key " + keys.substr(pos, nl - pos));
    pos = nl + 1;
  }
  const std::string leases = etcd.etcdctl_ok({"lease", "list"});
  if (leases.find("found 0 leases") == std::string::npos) out.push_back("leases: " + leases);
  return out;
}

template <class RawZk>
std::vector<std::string> zk_leftovers(RawZk& raw) {
  std::vector<std::string> out;
  for (const auto& dir : raw.children("/distlock")) {
    // A live client session's presence node (zk_names.hpp, kSessionsDir): no lock state.
    if (dir == ".sessions") continue;
    for (const auto& node : raw.children("/distlock/" + dir))
      out.push_back("node /distlock/" + dir + "/" + node);
  }
  return out;
}

}  // namespace distlock::testing
