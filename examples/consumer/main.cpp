// consumer — the smallest program using an installed distlock: take a lock on the
// host-local backend, check its token through a fence (when the install has the fencing
// component), release it.
//   consumer [URL]   (default: file:// in a fresh temporary directory)
#include <unistd.h>

#include <cstdlib>
#include <distlock/distlock.hpp>
#include <filesystem>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  try {
    std::string url;
    std::filesystem::path temp_dir;
    if (argc > 1) {
      url = argv[1];
    } else {
      temp_dir = std::filesystem::temp_directory_path() / ("distlock-consumer-" + std::to_string(::getpid()));
      std::filesystem::create_directories(temp_dir);
      url = "file://" + temp_dir.string();
    }
    distlock::Client client = distlock::connect(url);
#if DISTLOCK_HAS_FENCING  // an install built without the fencing component has no FenceGuard
    distlock::FenceGuard fence;
#endif
    std::uint64_t first = 0;
    {
      distlock::Lease lease = client.acquire("consumer/demo");
      first = lease.token();
#if DISTLOCK_HAS_FENCING
      fence.apply(lease.token(), [] {}).check(lease.token());
#endif
    }
    std::uint64_t second = 0;
    {
      distlock::Lease again = client.acquire("consumer/demo");
      second = again.token();
    }
    if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
    if (second <= first) {
      std::cerr << "consumer: token did not increase (" << first << " then " << second << ")\n";
      return 1;
    }
    std::cout << "consumer: distlock " << distlock::kVersion << " on " << client.url() << ": tokens " << first
              << " then " << second << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "consumer: " << e.what() << "\n";
    return 1;
  }
}
