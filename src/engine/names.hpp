// Derived names: the one place that spells how the primitives built from ordinary
// locks name their parts on the server, reads those names back and shows them.
//
// A derived name is `<name>\x1f<kind>` (a definition record, an election) or
// `<name>\x1f<kind>\x1f<detail>` (a permit, a reader slot, the writer); \x1f (ASCII
// unit separator) marks it, so a primitive's name may not contain that byte. The
// on-server names are part of the wire format (docs/primitives.md): changing one
// strands every lock and record written before.
//
//   semaphore NAME     permits   NAME\x1fsem\x1f<i>   definition record  NAME\x1fsem
//   read-write NAME    writer    NAME\x1frw\x1fw      reader slots NAME\x1frw\x1f<i>,
//                                                     definition record  NAME\x1frw
//   election NAME      lock and record NAME\x1felect, its bell NAME\x1felect\x1fbell
//   --once-per mark    record    NAME\x1fonce  (NAME\x1fexclusive for a read-write lock's)
//
// Used by the primitives (src/api), the engine's metrics (a part counts under its
// primitive's name), Client::list and the records API. The CLI calls only the public API,
// so it spells the permit, once-per and exclusive suffixes itself (src/cli/run/
// run_locked.cpp, job_guard.cpp, flags.cpp). Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "distlock/client.hpp"

namespace distlock::detail::names {

inline constexpr char kSep = '\x1f';

/// The kinds of the primitives' derived names.
inline constexpr std::string_view kSemaphoreKind = "sem";
inline constexpr std::string_view kReadWriteKind = "rw";
inline constexpr std::string_view kElectionKind = "elect";
/// The record tags the library keeps itself (a semaphore's and a read-write lock's size, an
/// election's value): Client::put_record refuses them, as a user's record under one would
/// change those primitives.
inline constexpr std::array<std::string_view, 3> kLibraryRecordTags = {kSemaphoreKind, kReadWriteKind,
                                                                       kElectionKind};

/// `<name>\x1f<kind>` or, with a detail, `<name>\x1f<kind>\x1f<detail>`.
std::string derived(std::string_view name, std::string_view kind, std::string_view detail = {});

std::string semaphore_definition(std::string_view name);
std::string semaphore_permit(std::string_view name, std::size_t index);
std::string rw_definition(std::string_view name);
std::string rw_writer(std::string_view name);
std::string rw_reader(std::string_view name, std::size_t index);
std::string election(std::string_view name);
std::string election_bell(std::string_view name);
/// The record key of `name`'s --once-per mark.
std::string once_mark(std::string_view name);
/// The name whose once-per mark a read-write lock NAME held exclusively keeps (it and
/// the plain lock NAME do not exclude each other, so each has its own mark).
std::string rw_exclusive_mark_name(std::string_view name);

/// The bytes a primitive's longest derived lock name adds to its name.
inline constexpr std::size_t kSemaphoreSuffixBytes = 9;  // "\x1fsem\x1f1023"
inline constexpr std::size_t kRwSuffixBytes = 8;         // "\x1frw\x1f1023"

/// What a stored lock name is, read back.
struct Decoded {
  LockKind kind = LockKind::lock;
  std::string_view base;               ///< the user's name (the whole name for a plain lock)
  std::optional<std::uint32_t> index;  ///< permit or reader slot number
};

/// Decodes a lock name. A name that is not one this library derives (no \x1f, a kind
/// it does not make, an election's bell) is a plain lock whose base is the whole name.
/// The result views `name`, which must outlive it; a temporary string does not compile.
Decoded decode(std::string_view name);
Decoded decode(std::string&& name) = delete;
/// The definition record that holds the size of the primitive a permit or reader slot
/// belongs to (NAME\x1fsem or NAME\x1frw); empty for other kinds.
std::string definition_of(const Decoded& d);
/// For people: "lock", "semaphore permit 2 of 5", "rw writer", "rw reader slot 3",
/// "election" (`of`: the primitive's size when known).
std::string display(const Decoded& d, std::optional<std::uint32_t> of = std::nullopt);
/// The part of `name` before its first \x1f (the whole name when it has none).
std::string_view primitive_of(std::string_view name) noexcept;
/// For messages: at most 200 bytes of `name`, each \x1f written as the text \x1f.
std::string printable(std::string_view name);

}  // namespace distlock::detail::names
