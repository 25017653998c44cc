// distlock/distlock.hpp — the whole public API in one include.
#pragma once

#include "distlock/client.hpp"
#include "distlock/clock.hpp"
#include "distlock/error.hpp"
#include "distlock/fencing.hpp"
#include "distlock/ids.hpp"
#include "distlock/options.hpp"
#include "distlock/semaphore.hpp"
#include "distlock/shared_mutex.hpp"
#include "distlock/version.hpp"
