#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace frnccl {

enum class StackMode : uint8_t { kNone, kPython, kCpp };
enum class OnTimeout : uint8_t { kRaise, kExit };

// Process-wide settings. Parsed and validated in Python (fr_backend/config.py),
// handed to C++ once, before the first group is created; read-only afterwards.
struct Config {
  size_t buffer_size = 20000;
  StackMode stacks = StackMode::kPython;
  std::string dump_dir;
  std::string verdict_file; // FRNCCL_VERDICT_FILE: where the latest verdict's JSON goes too; "" for none
  // The compact format (CompactEncoding.hpp) is the default; the others are opt-in.
  bool write_compact = true;
  bool write_pickle = false;
  bool write_json = false;
  bool write_chrome = false;
  int64_t coord_check_ms = 1000;
  int64_t heartbeat_timeout_ms = 480 * 1000;
  int64_t dump_timeout_ms = 60 * 1000;
  // The storm bound on job-wide dumps this process did not ask for itself:
  // at most one failure and one other dump per interval, and this many in all
  // (0: no cap). HeartbeatMonitor::admitJobDump.
  int64_t dump_min_interval_ms = 10 * 1000;
  int64_t dump_max_count = 100;
  int64_t watchdog_poll_ms = 100;
  int64_t symbolize_timeout_ms = 2000;
  OnTimeout on_timeout = OnTimeout::kRaise;
  int dump_signal = 0; // 0: no signal handler
  int stacks_signal = 0; // signal faulthandler answers with all thread stacks; 0: none
  int stacks_fd = -1; // file faulthandler writes to
  bool dump_on_teardown = false;
  // On SIGTERM or SIGABRT while a group is alive: how long the signal waits for this rank's dump; 0: both are
  // left alone.
  int64_t terminate_dump_ms = 0;
  // A rank leaving with an uncaught exception: its whole wait for the incident it opens (FRNCCL_DUMP_ON_EXCEPTION_MS).
  int64_t exception_exit_ms = 3000;
  // GPU timing: 0 = off, 1 = every op, N = every Nth op.
  int64_t gpu_timing_every = 0;
  // 0 (default): every synchronous CUDA op gets its own end event. N: at most one every N us
  // per thread and stream; the others complete with a later one (StreamOrder.hpp).
  int64_t end_event_interval_us = 0;
  // Synchronous NCCL ops of a group that ran only collectives on one stream are
  // settled by torch's own NCCL watchdog, with no end event (InnerProgress.hpp).
  bool settle_by_torch_watchdog = true;

  // Self-describing header fields, computed in Python where they are easy to find.
  int64_t rank = 0;
  int64_t local_rank = -1;
  int64_t world_size = 1;
  std::string hostname;
  std::string job_id;
  // Set by the life's HeartbeatMonitor from the job's store (jobTag in IncidentId.hpp); "" before.
  std::string job_tag;
  int64_t attempt = 0;
  std::string torch_version;
  std::string frnccl_version;
};

} // namespace frnccl
