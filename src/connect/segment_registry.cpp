// Segment ids (ids/segment_source.hpp): the database schemes that can hand out id ranges,
// one line per backend folder that has a segment source (its <name>_segment.hpp is the
// folder's registration header for ids, as <name>_scheme.hpp is for locks).
#include "connect/registry.hpp"
#include "distlock/config.hpp"
#if DISTLOCK_HAS_IDS
#include "ids/segment_source.hpp"
#if DISTLOCK_HAS_POSTGRES
#include "postgres/pg_segment.hpp"
#endif
#if DISTLOCK_HAS_MYSQL
#include "mysql/my_segment.hpp"
#endif
#endif

namespace distlock::detail {

#if DISTLOCK_HAS_IDS
// Segment ids (ids/segment_source.hpp): one row per database scheme that has a source.
namespace {
struct SegmentScheme {
  std::string_view name;
  ids::detail::SegmentSourceFactory factory;
};
constexpr SegmentScheme kSegmentSchemes[] = {
#if DISTLOCK_HAS_POSTGRES
    {"postgres", &pg::make_segment_source},
    {"postgresql", &pg::make_segment_source},
#endif
#if DISTLOCK_HAS_MYSQL
    {"mysql", &my::make_segment_source},
#endif
    {"", nullptr},
};
}  // namespace

ids::detail::SegmentSourceFactory find_segment_source(std::string_view scheme) noexcept {
  for (const auto& s : kSegmentSchemes) {
    if (s.factory && s.name == scheme) return s.factory;
  }
  return nullptr;
}

Error check_segment_url_query(const Url& url) {
  const Scheme* scheme = find_scheme(url.scheme);
  if (!scheme) return {};
  return check_query(*scheme, url);
}

std::string segment_schemes() {
  std::string out;
  for (const auto& s : kSegmentSchemes) {
    if (!s.factory) continue;
    if (!out.empty()) out += ", ";
    out += std::string(s.name) + "://";
  }
  return out;
}
#endif

}  // namespace distlock::detail
