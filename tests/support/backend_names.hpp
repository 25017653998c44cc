// The names of the internal backend interface (src/engine/backend.hpp) that the tests which drive
// a backend directly use unqualified, declared once in distlock::testing: a test written inside
// `namespace distlock::testing` includes this header instead of its own list of
// using-declarations.
//
//   AcquireRequest, Backend, Error, kMaxRecordValue, PutMode, ReleaseStatus, RenewItem,
//   RenewStatus
//
// Thread-safety: declarations only.
#pragma once

#include "engine/backend.hpp"
#include "engine/backend_error.hpp"

namespace distlock::testing {

using detail::AcquireRequest;
using detail::Backend;
using detail::Error;
using detail::kMaxRecordValue;
using detail::PutMode;
using detail::ReleaseStatus;
using detail::RenewItem;
using detail::RenewStatus;

}  // namespace distlock::testing
