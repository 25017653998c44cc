// distlock/distlock.hpp — the whole public API in one include.
#pragma once

#include "distlock/client.hpp"
#include "distlock/clock.hpp"
#include "distlock/config.hpp"
#include "distlock/election.hpp"
#include "distlock/error.hpp"
#include "distlock/hold.hpp"
#if DISTLOCK_HAS_FENCING
#include "distlock/fencing.hpp"
#endif
#if DISTLOCK_HAS_IDS
#include "distlock/ids.hpp"
#endif
#include "distlock/multi_lease.hpp"
#include "distlock/options.hpp"
#include "distlock/semaphore.hpp"
#include "distlock/shard_group.hpp"
#include "distlock/shared_mutex.hpp"
#include "distlock/text.hpp"
#include "distlock/tracing.hpp"
#include "distlock/version.hpp"
#include "distlock/watch.hpp"
#include "distlock/with_lock.hpp"
