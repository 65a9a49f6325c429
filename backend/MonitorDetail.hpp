#pragma once

// What the monitor's three source files share, and nothing else includes:
// the store keys and limits of the coordination protocol, how a request is
// encoded in the store, incident ids, and the monitor's log line.
//   HeartbeatMonitor.cpp     the thread, the local request queue, leaving, the watchdog check
//   MonitorCoordination.cpp  job-wide incidents through the store (locks, requests, counts, reconnects)
//   MonitorDumps.cpp         writing this rank's dump (stacks, the GIL, dumps at SIGTERM/SIGABRT)
//   StoreWaiter.cpp          the pushed wake-up that replaces polling the store

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "Clock.hpp"
#include "Config.hpp"
#include "DumpWriter.hpp"
#include "IncidentId.hpp"

namespace frnccl {
namespace monitor_detail {


// Set by the dump signal handler (async-signal-safe), read by the monitor thread.
inline std::atomic<bool> g_signal_pending{false};
// Monitor threads running in this process (their run() loops): the dump signal has someone to serve it.
inline std::atomic<int> g_running_monitors{0};
// Python is finalizing: no GIL to take, so no symbolizing and no faulthandler.
inline std::atomic<bool> g_python_finalizing{false};

constexpr const char* kSeqKey = "frnccl/incident_seq";
constexpr const char* kActiveKey = "frnccl/active";
constexpr int64_t kLoopTickMs = 50;
// How long a dump that does not symbolize waits for the GIL before it reads
// thread stacks without it.
constexpr int64_t kThreadStacksGilWaitMs = 200;
// How long a dump waits for the watchdog's next pass (it takes well under a
// millisecond): a watchdog that misses it is stuck, and the monitor says so.
constexpr int64_t kFreshPollWaitMs = 200;
// Why a store call was not made, once store_lost_ is set.
constexpr const char* kStoreLostText = "its connection was lost earlier";
// A request number whose request never appeared (its trigger died between
// the two store calls) is skipped after this long. The grace runs once per
// gap: the numbers still missing when it ends are all skipped at once.
constexpr int64_t kMissingRequestGraceMs = 10000;
// How long a leaving rank waits for a request whose number is taken: a live
// trigger sets the request right after it takes the number.
constexpr int64_t kLeavingRequestWaitMs = 1000;
// How long a leaving rank waits to learn whether the store's server is there.
constexpr int64_t kLeavingProbeMs = 500;
// How long after the waiter's connection closed the monitor first asks whether the store host is still there
// (and polls nobody meanwhile): a host process that is ending closes its clients' connections a moment before
// its listening socket, and a poll in that moment fails with torch's warning and backtrace.
constexpr int64_t kWaiterFailureSettleMs = 300;
// Ranks that left (teardown or exit) and how many: "frnccl/left/<rank>" is
// set, and the count raised, once per leaving; a process of that rank that
// registers again takes its mark back.
constexpr const char* kLeftCountKey = "frnccl/left_count";
// The same as a list, "+<rank>," when a rank leaves and "-<rank>," when a
// process of it registers again: one read names every rank that left.
constexpr const char* kLeftRanksKey = "frnccl/left_ranks";
// How long after registering rank 0 compacts kLeftRanksKey: the other ranks'
// appends of a (re)start are done by then, so its compareSet is not raced.
constexpr int64_t kCompactLeftAfterMs = 5000;
// How many wake keys a trigger sets per multiSet: one request of a few tens of
// KiB, which the store server parses in one go without holding its loop long.
constexpr size_t kWakeBatch = 1024;
// How long after an incident's dump deadline its verdict may still come (read, computed, posted).
constexpr int64_t kVerdictGraceMs = 5000;
// How many summaries the trigger reads per multiGet: at most ~2 MiB of reply.
constexpr size_t kSummaryBatch = 1024;
// Summaries of ranks that did not count themselves written, read key by key: at most this many.
constexpr size_t kMaxNonWriterSummaries = 256;
// Only one trigger at a time publishes (it holds frnccl/active), so a rank is
// never more than a few requests behind; a bigger jump of the request number
// is a bad store value, and only its last requests are read.
constexpr int64_t kMaxRequestBacklog = 16;
// What a request read from the store may carry into a dump header.
constexpr size_t kMaxRequestReasonBytes = 64;
constexpr size_t kMaxRequestDetailBytes = 4096;
// Reconnecting after a network error: a probe of the store host's port (so a
// host that is gone costs no torch warning), then a fresh client. Tries back
// off from 1 s to 60 s; this many failures in a row end them for good, and so
// does this many connections replaced in all.
constexpr int64_t kReconnectProbeMs = 1000;
constexpr int64_t kReconnectTimeoutMs = 3000;
constexpr int kMaxReconnectFailures = 6;
constexpr int kMaxReconnects = 32;
// The store client's timeout (Runtime::attach sets the same).
constexpr int64_t kStoreTimeoutMs = 10000;

// A SIGTERM this soon after this rank wrote its part of a failure incident (or
// two dump deadlines, if longer) is that failure's aftermath: the launcher
// stopping the job once a rank exited on it.
constexpr int64_t kFailureAftermathMs = 60000;

// How long a SIGTERM that finds no incident in progress waits before it looks
// again, then writes its own.
constexpr int64_t kIncidentAfterSigtermMs = 200;

// A request that joined another incident waits at least this long after
// joining before it takes that incident over: joining polls the store at once,
// and the takeover polls again, so the request has had its chance to arrive.
constexpr int64_t kJoinedMinWaitMs = 1000;

// When the frnccl/active value "<id>|<wall ns>" was taken, by its holder's
// clock; 0 (long ago) if it cannot be read.
inline int64_t lockTakenNs(const std::string& held) {
  const auto bar = held.rfind('|');
  if (bar == std::string::npos) {
    return 0;
  }
  try {
    return std::stoll(held.substr(bar + 1));
  } catch (const std::exception&) {
    return 0;
  }
}

inline std::string requestKey(int64_t seq) {
  return "frnccl/incident/" + std::to_string(seq);
}
inline std::string writtenKey(const std::string& id) {
  return "frnccl/written/" + id;
}
// The ranks that wrote their part of an incident: each appends "<rank>,", so
// one read names them all (and the missing ones), however many ranks.
inline std::string writersKey(const std::string& id) {
  return "frnccl/writers/" + id;
}
inline std::string leftKey(int64_t rank) {
  return "frnccl/left/" + std::to_string(rank);
}
// This rank's wake key: a trigger sets every rank's once its request is
// published, which ends that rank's StoreWaiter wait.
inline std::string wakeKey(int64_t rank) {
  return "frnccl/wake/" + std::to_string(rank);
}
// The ranks of `world_size` named in a list of "<rank>," (frnccl/writers/<id>),
// or of "+<rank>," and "-<rank>," where the last entry of a rank counts
// (kLeftRanksKey). Entries that are not a rank of the job (any client of the
// store may append) are skipped.
inline std::vector<bool> ranksInList(const std::string& list, int64_t world_size) {
  std::vector<bool> in(static_cast<size_t>(std::max<int64_t>(world_size, 0)), false);
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) {
      end = list.size();
    }
    bool on = true;
    size_t digits = pos;
    if (digits < end && (list[digits] == '+' || list[digits] == '-')) {
      on = list[digits] == '+';
      ++digits;
    }
    int64_t rank = 0;
    bool valid = digits < end && end - digits <= 9;
    for (size_t i = digits; valid && i < end; ++i) {
      valid = list[i] >= '0' && list[i] <= '9';
      rank = rank * 10 + (list[i] - '0');
    }
    if (valid && rank < world_size) {
      in[static_cast<size_t>(rank)] = on;
    }
    pos = end + 1;
  }
  return in;
}

// kLeftRanksKey with one "+<rank>," per rank whose last entry is "+", in rank
// order; ranks at or past the world size are kept (a job that shrank may grow back).
inline std::string compactRanksList(const std::string& list) {
  std::map<int64_t, bool> last;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) {
      end = list.size();
    }
    bool on = true;
    size_t digits = pos;
    if (digits < end && (list[digits] == '+' || list[digits] == '-')) {
      on = list[digits] == '+';
      ++digits;
    }
    int64_t rank = 0;
    bool valid = digits < end && end - digits <= 9;
    for (size_t i = digits; valid && i < end; ++i) {
      valid = list[i] >= '0' && list[i] <= '9';
      rank = rank * 10 + (list[i] - '0');
    }
    if (valid) {
      last[rank] = on;
    }
    pos = end + 1;
  }
  std::string out;
  for (const auto& [rank, on] : last) {
    if (on) {
      out += "+" + std::to_string(rank) + ",";
    }
  }
  return out;
}

// Reasons whose incident is what the job fails for: a rank's later failures
// follow from it (cascadeOf). "exception": a rank left the job with an uncaught
// Python exception; its peers' ops then fail on its closed connections.
inline bool isFailure(const std::string& reason) {
  return reason == "timeout" || reason == "error" || reason == "exception";
}

inline std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
inline std::string text(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

inline void logLine(const Config& config, const char* fmt, ...) {
  char msg[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, args);
  va_end(args);
  std::fprintf(stderr, "[frnccl rank %lld] %s\n", static_cast<long long>(config.rank), msg);
  std::fflush(stderr);
}

// "<UTC time to the ms>-job.<tag>-<reason>-r<rank>[-<n>]": sorts by time, the
// job's tag (Config::job_tag; left out where unknown) keeps two jobs' incidents
// apart, and the counter keeps two dumps of one rank within a millisecond
// apart. The reason enters as a plain name (incidentIdReason); the header keeps it whole.
inline std::string newIncidentId(const std::string& reason, int64_t rank, const std::string& job_tag) {
  static std::atomic<int64_t> issued{0};
  const int64_t ns = wallNs();
  const std::time_t seconds = static_cast<std::time_t>(ns / 1000000000LL);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[48];
  const size_t n = std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &utc);
  std::snprintf(stamp + n, sizeof(stamp) - n, ".%03lld", static_cast<long long>((ns / 1000000LL) % 1000));
  std::string id = std::string(stamp) + "-" + incidentIdJob(job_tag) + incidentIdReason(reason) + "-r" + std::to_string(rank);
  const int64_t count = issued.fetch_add(1);
  return count == 0 ? id : id + "-" + std::to_string(count);
}

// "<id>\n<reason>\n<trigger>\n<detail>"
inline std::string encodeRequest(const DumpRequest& r) {
  return r.incident_id + "\n" + r.reason + "\n" + std::to_string(r.trigger_rank) + "\n" + r.detail;
}
inline DumpRequest decodeRequest(const std::string& s) {
  DumpRequest r;
  std::istringstream in(s);
  std::string trigger;
  std::getline(in, r.incident_id);
  std::getline(in, r.reason);
  std::getline(in, trigger);
  std::getline(in, r.detail, '\0');
  try {
    r.trigger_rank = std::stoll(trigger);
  } catch (...) {
    r.trigger_rank = -1;
  }
  // Any client of the store wrote this: the header gets no more than this much of it.
  auto cut = [](std::string& text, size_t max) {
    if (text.size() > max) {
      text = text.substr(0, max) + "... (cut from " + std::to_string(text.size()) + " bytes)";
    }
  };
  cut(r.reason, kMaxRequestReasonBytes);
  cut(r.detail, kMaxRequestDetailBytes);
  return r;
}

} // namespace monitor_detail
} // namespace frnccl
