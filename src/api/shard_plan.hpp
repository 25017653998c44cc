// The shard group's assignment rule (include/distlock/shard_group.hpp, docs/sharding.md):
// a pure function every member evaluates on what it listed, so members that listed the
// same state compute the same assignment without talking to each other.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace distlock::detail {

/// For `shards` shards, the live `members` (any order; duplicates ignored) and each shard's
/// current owner (`owners[i]`, nullopt when unowned; an owner that is not a live member
/// counts as unowned; `owners` may be shorter than `shards`): the shards each member is to
/// own. Every live member gets an entry (possibly empty).
///
/// Balanced: with W members, the first M mod W members in the order (current count of
/// kept-able shards clamped to [floor(M/W), ceil(M/W)], descending; id ascending) get
/// ceil(M/W), the others floor(M/W). The clamp makes the plan stable while members carry it
/// out one by one (a member that took its free shards does not overtake another).
/// Sticky: a shard stays with its live owner while that owner is under its quota (shards
/// in index order); only the rest move, each free shard (index order) to the first member
/// in id order still under its quota. So a join or leave moves exactly the shards balance
/// requires: sum over members of max(0, owned - quota).
std::map<std::string, std::vector<std::uint32_t>> plan_shards(
    std::uint32_t shards, std::vector<std::string> members,
    const std::vector<std::optional<std::string>>& owners);

}  // namespace distlock::detail
