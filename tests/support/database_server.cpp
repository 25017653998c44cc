#include "support/database_server.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "support/harness_setup.hpp"

namespace distlock::testing {

DatabaseServer::DatabaseServer(std::string program, std::string product, const std::string& tmp_prefix,
                               int shutdown_signal, std::chrono::milliseconds ready_within)
    : dir_(tmp_prefix),
      program_(std::move(program)),
      product_(std::move(product)),
      shutdown_signal_(shutdown_signal),
      ready_within_(ready_within) {}

void DatabaseServer::kill() {
  if (pid_ <= 0) return;
  process_.signal(SIGKILL);
  process_.signal(SIGCONT);
  process_.wait_for(std::chrono::seconds(10));
  pid_ = -1;
}

void DatabaseServer::pause() {
  if (pid_ > 0) process_.signal(SIGSTOP);
}

void DatabaseServer::resume() {
  if (pid_ > 0) process_.signal(SIGCONT);
}

void DatabaseServer::stop() {
  resume();
  if (pid_ <= 0) return;
  process_.signal(shutdown_signal_);
  if (process_.wait_for(std::chrono::seconds(10)) != -1) {
    pid_ = -1;
    return;
  }
  kill();
}

void DatabaseServer::wipe_and_restart() {
  kill();
  const std::string d = dir_.path().string();
  std::filesystem::remove_all(d + "/data");
  if (const std::string error = run_to_end({"cp", "-a", template_, d + "/data"}, d + "/cp.log");
      !error.empty()) {
    throw std::runtime_error("cannot give " + product_ + " an empty data directory: " + error);
  }
  restart();
}

void DatabaseServer::restart() {
  stop();
  std::string failures;
  for (int attempt = 0; attempt < 3; ++attempt) {
    start();
    if (wait_ready(ready_within_)) return;
    failures += log() + "\n";
    kill();
  }
  throw std::runtime_error(program_ + " did not restart on port " + std::to_string(port_) + ":\n" + failures);
}

void DatabaseServer::start_from_template(const std::string& tmpl, const std::string& built_marker,
                                         const std::function<std::string()>& build) {
  {
    const int lock_fd = ::open((tmpl + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd >= 0) ::flock(lock_fd, LOCK_EX);
    std::string error;
    if (!std::filesystem::exists(tmpl + "/data/" + built_marker)) error = build();
    template_ = tmpl + "/data";
    const std::string d = dir_.path().string();
    if (error.empty()) error = run_to_end({"cp", "-a", template_, d + "/data"}, d + "/cp.log");
    if (lock_fd >= 0) ::close(lock_fd);
    if (!error.empty()) fail_setup(error);
  }
  std::string failures;
  for (int attempt = 0; attempt < 3; ++attempt) {
    port_ = free_port();
    start();
    if (wait_ready(ready_within_)) return;
    failures += "port " + std::to_string(port_) + ":\n" + log() + "\n";
    kill();
  }
  fail_setup(program_ + " did not start; its log:\n" + failures);
}

std::string DatabaseServer::log() const {
  return file_text(dir_.path() / "server.log");
}

}  // namespace distlock::testing
