// file_raw_baseline — the raw cost of what the file:// backend does per lock, without
// distlock: the baseline for `distlock-bench --url file://DIR --workload uncontended`.
//
//   file_raw_baseline DIR [OPS]
//
// Prints one JSON line per workload:
//   raw-ofd-cycle   open(O_CREAT) + F_OFD_SETLK + pread + pwrite + F_UNLCK + close,
//                   i.e. one uncontended acquire + release as the backend does it;
//   raw-ofd-lock    F_OFD_SETLK + F_UNLCK on a descriptor kept open (the floor).
// Run it pinned like the bench (see docs/file-backend.md, "Figures").
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct flock whole_file(short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  return fl;
}

void report(const char* workload, const std::string& dir, std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) { return us[std::min(us.size() - 1, static_cast<std::size_t>(p * us.size()))]; };
  double total = 0;
  for (double v : us) total += v;
  std::printf(
      "{\"workload\":\"%s\",\"url\":\"raw %s\",\"clients\":1,\"ops\":%zu,\"ops_per_s\":%.1f,\"p50_us\":%.1f,"
      "\"p99_us\":%.1f,\"p999_us\":%.1f}\n",
      workload, dir.c_str(), us.size(), 1e6 * static_cast<double>(us.size()) / total, pct(0.50), pct(0.99),
      pct(0.999));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: file_raw_baseline DIR [OPS]\n");
    return 64;
  }
  const std::string dir = argv[1];
  const int ops = argc > 2 ? std::atoi(argv[2]) : 20000;
  const std::string path = dir + "/raw-baseline.lock";
  char record[96] = "DLOCKF1\n";
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(ops));

  for (int i = 0; i < ops; ++i) {
    const auto t0 = Clock::now();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    struct flock lk = whole_file(F_WRLCK), un = whole_file(F_UNLCK);
    if (fd < 0 || ::fcntl(fd, F_OFD_SETLK, &lk) != 0) {
      std::perror("raw-ofd-cycle");
      return 1;
    }
    char buf[128];
    (void)!::pread(fd, buf, sizeof buf, 0);
    (void)!::pwrite(fd, record, sizeof record, 0);
    ::fcntl(fd, F_OFD_SETLK, &un);
    ::close(fd);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  report("raw-ofd-cycle", dir, us);

  us.clear();
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  for (int i = 0; i < ops; ++i) {
    const auto t0 = Clock::now();
    struct flock lk = whole_file(F_WRLCK), un = whole_file(F_UNLCK);
    if (::fcntl(fd, F_OFD_SETLK, &lk) != 0) {
      std::perror("raw-ofd-lock");
      return 1;
    }
    ::fcntl(fd, F_OFD_SETLK, &un);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  ::close(fd);
  ::unlink(path.c_str());
  report("raw-ofd-lock", dir, us);
  return 0;
}
