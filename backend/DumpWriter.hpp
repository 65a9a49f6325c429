#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "Config.hpp"
#include "DumpValue.hpp"
#include "Recorder.hpp"

namespace frnccl {

struct DumpRequest {
  std::string incident_id;
  std::string reason; // timeout | error | signal | manual | teardown | watchdog_stuck | sigterm | abort
  std::string detail;
  int64_t trigger_rank = -1;
  bool symbolize = true;
};

// One list of frames per snapshot entry, innermost first; empty when unknown.
using SymbolizedStacks = std::vector<std::vector<SymbolizedFrame>>;

struct WatchdogHealth {
  int64_t last_heartbeat_ns = 0;
  double max_discovery_lag_ms = 0;
  double mean_discovery_lag_ms = 0;
};

// Turns a snapshot into the dump tree and writes it to disk. Stateless; the
// heartbeat monitor is its only caller.
class DumpWriter {
 public:
  static DumpValue build(
      const Config& config,
      const DumpRequest& request,
      const Snapshot& snapshot,
      const SymbolizedStacks* stacks,
      const std::string& thread_stacks,
      const std::string& nccl_version,
      const WatchdogHealth& health);

  static DumpValue chromeTrace(const DumpValue& dump);

  // Writes every configured format under <dump_dir>/<incident>/. Returns the
  // incident folder, or throws std::runtime_error with a one-line reason.
  // Each file appears complete or not at all; nothing is written through a
  // link, and an existing file is never replaced (DumpFiles.hpp).
  static std::string write(const Config& config, const std::string& incident_id, const DumpValue& dump);
};

} // namespace frnccl
