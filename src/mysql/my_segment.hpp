// Segment ids on mysql:// (ids/segment_source.hpp); registered in connect/segment_registry.cpp.
#pragma once

#include "ids/segment_source.hpp"

namespace distlock::detail::my {

std::unique_ptr<ids::detail::SegmentSource> make_segment_source(const Url& url, Millis connect_timeout,
                                                                Millis command_timeout, Error& err);

}  // namespace distlock::detail::my
