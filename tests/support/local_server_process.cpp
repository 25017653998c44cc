#include "support/local_server_process.hpp"

#include <signal.h>

#include <chrono>

namespace distlock::testing {

LocalServerProcess::LocalServerProcess(const std::string& tmp_prefix) : dir_(tmp_prefix) {}

LocalServerProcess::~LocalServerProcess() {
  process_.stop(std::chrono::milliseconds(2000));
}

void LocalServerProcess::kill() {
  process_.signal(SIGKILL);
  process_.wait_for(std::chrono::seconds(10));
}

void LocalServerProcess::pause() {
  process_.signal(SIGSTOP);
}

void LocalServerProcess::resume() {
  process_.signal(SIGCONT);
}

void LocalServerProcess::launch(const std::vector<std::string>& argv, const std::string& log_name) {
  process_ = Process::spawn(argv, (dir_.path() / log_name).string());
}

}  // namespace distlock::testing
