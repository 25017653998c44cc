// Segment ids on postgres:// (ids/segment_source.hpp); registered in connect/segment_registry.cpp.
#pragma once

#include "ids/segment_source.hpp"

namespace distlock::detail::pg {

std::unique_ptr<ids::detail::SegmentSource> make_segment_source(const Url& url, Millis connect_timeout,
                                                                Millis command_timeout, Error& err);

}  // namespace distlock::detail::pg
