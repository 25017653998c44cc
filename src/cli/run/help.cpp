// `distlock run`'s options and help text, and run_under_lease (the runner for `elect`).
#include <CLI/CLI.hpp>
#include <memory>

#include "cli/run/run.hpp"

namespace distlock::cli {

namespace {

using run::RunFlags;
using run::RunSettings;

constexpr const char* kRunDescription =
    "Acquire the lock NAME, run COMMAND while holding it, release it when every process of the job has\n"
    "exited, and exit with COMMAND's status (128+N if it died of signal N). Meant for jobs deployed on many\n"
    "machines that must run on exactly one at a time, and must stop if they lose the lock.\n"
    "\n"
    "COMMAND runs with DISTLOCK_NAME, DISTLOCK_TOKEN (the fencing token, a decimal number that increases\n"
    "with every acquisition of NAME; absent only where the backend has none) and DISTLOCK_URL in its\n"
    "environment. The lease is renewed while it runs. Every signal that would end the runner (INT, TERM,\n"
    "HUP, QUIT, USR1, USR2, ALRM, PWR, real-time ...) is forwarded to the whole job instead.\n"
    "If no renewal succeeds, the whole job gets SIGTERM --grace before the lease's local deadline and\n"
    "SIGKILL at it (before the server can pass the lock on); a loss the runner is told about (lock taken\n"
    "over, file:// lock file removed) kills it at once. The job is reaped, then distlock exits 76.\n"
    "If the runner dies, even of SIGKILL, a watchdog process kills the job's whole process group.\n"
    "\n"
    "With --shared/--exclusive NAME is a read-write lock (readers and a writer, like flock -s/-x): a\n"
    "--shared job gets no DISTLOCK_TOKEN, an --exclusive job the writer's token; a --shared hold that is\n"
    "lost (a reader slot past its TTL) ends its job the same way (exit 76).\n"
    "\n"
    "With --lock A --lock B (and NAME, if given) the runner takes every name or none, in sorted order\n"
    "(overlapping sets never deadlock), within --wait; the job gets DISTLOCK_TOKENS=A=token,B=token and\n"
    "is stopped as above when any one name is lost.";

constexpr const char* kRunFooter =
    "EXIT STATUS\n"
    "  COMMAND's status  COMMAND ran under the lock (128+N if it died of signal N)\n"
    "  0    also: --once-per found this period's run already done (COMMAND not run; one line says so)\n"
    "  64   usage error: bad flag, malformed URL, name or duration, --grace too long for --ttl; --once-per "
    "on\n"
    "       a backend that keeps no records; a --trace-file that cannot be opened\n"
    "  69   the lock service is unreachable or rejected the credentials, or --metrics-port cannot be bound\n"
    "  75   not acquired: held by another owner with --no-wait, or --wait ran out\n"
    "  76   the lock was lost (or about to be) while the job ran, or --max-hold ended it; the job was "
    "stopped\n"
    "       and reaped\n"
    "  126  COMMAND could not be executed;  127  COMMAND was not found\n"
    "  Every error is one line on standard error that names its cause.\n"
    "\n"
    "THE JOB\n"
    "  COMMAND runs in a process group of its own; the runner is a child subreaper and holds the lock\n"
    "  until every process of the job (also those that left the group) has exited, unless --leader-only.\n"
    "  Under a terminal the job's group is the terminal's foreground group (Ctrl-C reaches the whole\n"
    "  job). A job stopped by SIGTSTP/SIGTTIN/SIGTTOU is sent SIGTERM (SIGKILL after --grace); so is a\n"
    "  job the runner forwards a SIGTSTP/SIGTTIN to (a stopped job would hold the lock for ever).\n"
    "\n"
    "ENVIRONMENT\n"
    "  DISTLOCK_URL  the lock service when --url is not given (default: file:// in\n"
    "                $XDG_RUNTIME_DIR/distlock, else /tmp/distlock-<uid>: this host only)\n"
    "  DISTLOCK_LOG  debug|info|warning|error: show the library's diagnostics on standard error\n"
    "  TRACEPARENT   a W3C trace context: the parent of the runner's wait and hold spans; the job gets\n"
    "                the hold span's context in its own TRACEPARENT (a malformed one is ignored, with a\n"
    "                warning). With --lock, the parent of the set's span (distlock.lock_set), itself\n"
    "                the parent of every name's spans and of the job's TRACEPARENT. See docs/tracing.md\n"
    "\n"
    "EXAMPLES\n"
    "  distlock run nightly-report -- /usr/local/bin/report --all\n"
    "  distlock run --shared config -- ./read-config;  distlock run --exclusive config -- ./write-config\n"
    "  distlock run --wait 5s --lock accounts/7 --lock accounts/3 -- ./transfer\n"
    "  distlock run --url redis://10.0.0.5:6379 --no-wait --ttl 30s backup -- /usr/local/bin/backup\n"
    "  */5 * * * *  distlock run --no-wait --url redis://lock:6379 sync -- /opt/sync/run.sh\n"
    "  distlock run --url redis://lock:6379 --shards 16 reindex -- ./reindex.sh   (on every host; see "
    "SHARDS)\n"
    "\n"
    "SHARDS (--shards M GROUP)\n"
    "  The runner joins the shard group GROUP of M shards and runs COMMAND while it owns at least one, with\n"
    "  DISTLOCK_SHARDS (0,5,10), DISTLOCK_TOKENS (same order), DISTLOCK_SHARD_COUNT and "
    "DISTLOCK_SHARDS_FILE.\n"
    "  A change of the set is written to that file, then COMMAND gets SIGHUP (--on-change hup: read the\n"
    "  file in the main loop after clearing a flag the handler sets, not in the handler; SIGHUPs come in\n"
    "  bursts and a handler run inside another can report an older set last), or COMMAND\n"
    "  is started again (--on-change restart); --per-shard runs one COMMAND per shard (DISTLOCK_SHARD,\n"
    "  DISTLOCK_TOKEN). A shard given up or lost is told (file + SIGHUP) or killed (SIGKILL) before another\n"
    "  member can own it. A terminating signal is forwarded to every job; the runner then leaves the group\n"
    "  and exits 128+N. `distlock status --shards GROUP` shows who owns what. See docs/cli.md.\n";

/// The lock, its service and how long to wait for it and hold it.
void add_lease_options(CLI::App* run, const std::shared_ptr<RunFlags>& flags) {
  run->add_option("--url", flags->url,
                  "Lock service URL: redis://[user:password@]host:port[/db], file:///dir, ... "
                  "(default: $DISTLOCK_URL, else this host's file:// directory)")
      ->option_text("URL");
  run->add_option("--ttl", flags->ttl,
                  "Lease length on the server; renewed every ttl/3 while COMMAND runs. A runner that cannot "
                  "renew (paused, server unreachable) declares the lock lost before the server could pass "
                  "it on")
      ->option_text("DUR (default 30s)");
  flags->wait_option = run->add_option("--wait", flags->wait,
                                       "Give up (exit 75) if the lock is not acquired within DUR "
                                       "(default: wait as long as it takes)")
                           ->option_text("DUR");
  auto* no_wait = run->add_flag("--no-wait", flags->no_wait, "Try once; exit 75 at once if the lock is held");
  flags->wait_option->excludes(no_wait);
  flags->grace_option =
      run->add_option(
             "--grace", flags->grace,
             "With no renewal, the job gets SIGTERM when DUR is left before the lease's local deadline "
             "and SIGKILL at it; must be below ttl - margin - renew interval (default 5s, or ttl/4)")
          ->option_text("DUR");
  run->add_flag("--verbose,-v", flags->verbose,
                "While waiting, print the runner's place in the lock's queue to stderr each time it "
                "changes (\"distlock: waiting: 3rd in line behind host=H pid=P cmd=C\"); only where the "
                "backend queues its waiters (redis, redis+sentinel, etcd, zk)");
  run->add_flag("--leader-only", flags->leader_only,
                "Release the lock when COMMAND's first process exits, leaving any process it started "
                "running unprotected (for commands that start daemons). Default: hold the lock until every "
                "process of the job has exited");
}

/// What runs beside the job: metrics, tracing, hold limits, once-per, permits, read-write modes.
void add_job_options(CLI::App* run, const std::shared_ptr<RunFlags>& flags) {
  run->add_option(
         "--trace-file", flags->trace_file,
         "Append the spans of the wait, the hold, each renewal and a loss to PATH as OTLP/JSON lines "
         "(one ExportTraceServiceRequest per line). Their parent is $TRACEPARENT when set; with --lock, "
         "a span of the set (distlock.lock_set) is their parent and the job's. See docs/tracing.md")
      ->option_text("PATH");
  run->add_option("--metrics-port", flags->metrics_port,
                  "Serve this runner's metrics in the Prometheus text format at http://ADDR:PORT/metrics "
                  "while it waits and runs (0: any free port; the command gets it in "
                  "$DISTLOCK_METRICS_ADDR). See docs/metrics.md")
      ->option_text("PORT")
      ->check(CLI::Range(0, 65535));
  flags->metrics_addr_option =
      run->add_option("--metrics-addr", flags->metrics_addr,
                      "Numeric address the metrics endpoint binds (default 127.0.0.1; e.g. ::1, 0.0.0.0)")
          ->option_text("ADDR");
  run->add_option("--max-hold", flags->max_hold,
                  "Hold the lock at most DUR from the grant, even while renewals succeed: the command gets "
                  "SIGTERM --grace before, SIGKILL at it (a hung job cannot keep the lock); exit 76")
      ->option_text("DUR");
  run->add_option("--lock-delay", flags->lock_delay,
                  "After this run's lease is lost (killed, cut off, expired; not a normal release), "
                  "nobody gets the lock before the loss plus DUR (at most 60s), by the server's clock")
      ->option_text("DUR");
  run->add_option(
         "--min-hold", flags->min_hold,
         "After COMMAND ends, keep holding (renewing) the lock until DUR has passed since the grant, "
         "so another host cannot run the job again at once (ShedLock's lockAtLeastFor)")
      ->option_text("DUR");
  run->add_option("--once-per", flags->once_per,
                  "At most one successful run per period slot (floor(unix time / DUR)): under the lock, "
                  "skip (exit 0) if this slot already has one, else run and, on exit 0, record the slot")
      ->option_text("DUR");
  run->add_option("--permits", flags->permits,
                  "Take one of N permits of the semaphore NAME instead of the lock NAME: up to N jobs run at "
                  "once (every runner of NAME must give the same N); the job gets its permit number in "
                  "$DISTLOCK_PERMIT")
      ->option_text("N");
  run->add_flag("--shared", flags->shared,
                "Take a reader's hold of the read-write lock NAME instead of the lock NAME (like flock -s): "
                "--shared runners run at the same time, never beside an --exclusive one. The command gets "
                "no DISTLOCK_TOKEN (readers have no fencing token)");
  run->add_flag("--exclusive", flags->exclusive,
                "Take the writer's hold of the read-write lock NAME (like flock -x): runs alone, after the "
                "--shared runners are gone; a waiting --exclusive runner keeps new --shared ones out. "
                "DISTLOCK_TOKEN is the writer's fencing token");
}

/// --shards M GROUP: the command runs for the shards this runner owns in the shard group.
void add_shard_options(CLI::App* run, const std::shared_ptr<RunFlags>& flags) {
  run->add_option("--shards", flags->shards,
                  "NAME is a shard group of M shards (every member must give the same M): join it and run "
                  "COMMAND while this runner owns at least one shard, with $DISTLOCK_SHARDS (e.g. 0,5,10), "
                  "$DISTLOCK_TOKENS (one fencing token per shard, same order), $DISTLOCK_SHARD_COUNT and "
                  "$DISTLOCK_SHARDS_FILE. See docs/sharding.md")
      ->option_text("M");
  run->add_flag("--per-shard", flags->per_shard,
                "With --shards: one COMMAND per owned shard, with $DISTLOCK_SHARD and $DISTLOCK_TOKEN; "
                "started when the shard is gained, killed (SIGKILL) before it is handed over or when lost");
  run->add_option("--on-change", flags->on_change,
                  "With --shards: how COMMAND learns that its set changed. hup (default): the new set is "
                  "written to $DISTLOCK_SHARDS_FILE (atomically), then COMMAND gets SIGHUP — before a lost "
                  "shard can be owned by another member. restart: COMMAND is ended (SIGKILL before a lost "
                  "shard is handed over; SIGTERM, SIGKILL after --grace, when it gains one) and started "
                  "again with the new set")
      ->option_text("hup|restart");
  run->add_option("--rebalance-period", flags->rebalance_period,
                  "With --shards: the re-plan and retry period (default 1s). Where the group is "
                  "watched (redis, redis+sentinel, etcd, zk, postgres) joins and deaths are events "
                  "and this is the period of retries and of re-planning from the view; elsewhere "
                  "(file, mysql, redis+cluster, redlock) the member lists the group once a period")
      ->option_text("DUR");
}

}  // namespace

int run_under_lease(const LeaseRun& r) {
  RunFlags flags;
  flags.url = r.url;
  flags.ttl = r.ttl;
  flags.wait = r.wait;
  flags.wait_given = !r.wait.empty();
  flags.no_wait = r.no_wait;
  flags.grace = r.grace;
  flags.grace_given = !r.grace.empty();
  flags.name = r.name;
  flags.command = r.command;
  RunSettings settings = run::validate(flags, r.after_dashes);
  settings.acquire = r.acquire;
  settings.env = r.env;
  return run::run_locked(settings);
}

void add_run_command(CLI::App& app, int& exit_code, const std::vector<std::string>& command_after_dashes) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* run = app.add_subcommand("run", "Run a command while holding a lock (exit 75 if not acquired)");
  run->description(kRunDescription);
  run->footer(kRunFooter);
  add_lease_options(run, flags);
  add_job_options(run, flags);
  add_shard_options(run, flags);
  flags->name_option =
      run->add_option("NAME", flags->name,
                      "Lock name (any bytes but NUL, at most 4096); may be left out when --lock is given")
          ->type_name("");
  run->add_option(
         "--lock", flags->locks,
         "Take the lock NAME too (repeatable): every --lock name and NAME, if given, are acquired "
         "together (all or none, in sorted order so overlapping sets never deadlock, within "
         "--wait); the job gets $DISTLOCK_TOKENS=name=token,... and is killed if any one is lost. "
         "Not with --shards, --permits, --shared, --exclusive, --once-per. Write COMMAND after \"--\"")
      ->option_text("NAME")
      ->allow_extra_args(false);
  run->add_option("COMMAND", flags->command, "Program and arguments, after \"--\"")->type_name("");
  run->callback([flags, &exit_code, &command_after_dashes] {
    const RunSettings settings = run::validate(*flags, command_after_dashes);
    exit_code = settings.shards > 0 ? run::run_shards(settings) : run::run_locked(settings);
  });
}

}  // namespace distlock::cli
