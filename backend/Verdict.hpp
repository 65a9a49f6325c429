#pragma once

// The verdict a job-wide dump's trigger prints once every rank wrote (or the dump deadline passed): who broke
// the job, computed from the ranks' store summaries (RankSummary.hpp) alone, without the GIL and without the
// dump files (which may sit on other hosts). It follows the analyzer's blame rules (analyzer/findings.py) on
// the little a summary holds, and says it cannot decide rather than name a rank the rules do not name.
//
// VerdictBoard keeps this process's latest incident and its verdict, for the DistBackendError frnccl raises
// and for Python (fr_backend._C.incident_verdict). Lock: its own mutex, which errorNote also waits on (a
// condition variable, bounded by kMaxVerdictWaitMs); every other holder only copies strings.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace frnccl {

// The store key of an incident's verdict line (the first line the trigger prints).
inline std::string verdictKey(const std::string& incident_id) {
  return "frnccl/verdict/" + incident_id;
}
constexpr size_t kMaxVerdictLineBytes = 1024;
// The most an error raised on a caller's wait waits, in all, for the incident its failure opens or joins and
// for that incident's verdict: a failing job must not be slowed; the verdict is in the trigger's log anyway.
constexpr int64_t kMaxVerdictWaitMs = 2500;
// Of that, the most it waits for the incident to be noted (the failure opens or joins it a moment later).
constexpr int64_t kIncidentNoteWaitMs = 1000;
// An incident whose verdict deadline passed this long ago is not the one a new error belongs to.
constexpr int64_t kVerdictRelevantMs = 60 * 1000;

// The store's value of verdictKey: "culprits=1,3\n", the line, "\n", then the verdict's JSON (VerdictFile.hpp), so
// that every rank learns which ranks the verdict names (torchrun's root cause must be one of them) and can hand
// the whole verdict to fr_backend.on_verdict. Read back from a value any store client may have written:
// `decodeVerdictValue` keeps ranks in [0, world_size), at most kMaxVerdictCulprits, a printable line, and JSON
// text of at most kMaxVerdictJsonText bytes that Python checks again before any callback sees it.
constexpr size_t kMaxVerdictCulprits = 64;
constexpr size_t kMaxVerdictJsonText = 8192;
std::string encodeVerdictValue(const std::string& line, const std::vector<int64_t>& culprits, const std::string& json);
void decodeVerdictValue(const std::string& raw, int64_t world_size, std::string& line, std::vector<int64_t>& culprits,
                        std::string& json);

struct VerdictInput {
  int64_t world_size = 0;
  std::string incident_id;
  std::string incident_dir; // <FRNCCL_DUMP_DIR>/<incident_id> on the trigger's host
  // Per rank: its summary as read from the store (any client may have written it), nullopt if none.
  std::vector<std::optional<std::string>> summaries;
  int64_t wrote = 0; // ranks that wrote their part
  double seconds = 0; // how long the trigger waited for them
};

struct VerdictCulprit {
  int64_t rank = -1;
  std::optional<std::string> host; // from its summary; nullopt when it left none
  std::optional<int64_t> pid;
};

struct Verdict {
  bool decided = false;
  std::string kind; // left_with_exception, not_joined, p2p_unmatched, left_early, op_mismatch, size_mismatch, dtype_mismatch, missing_dump; "" if undecided
  std::vector<int64_t> culprits;
  std::vector<std::string> lines; // 1-3 lines, each beginning "frnccl: "
  // What the verdict is about, for its JSON (VerdictFile.hpp): the op, its group and seq, who waits in it.
  std::string op, pg, pg_desc;
  int64_t seq = -1; // -1: none
  bool p2p = false;
  std::vector<int64_t> victims;
  std::vector<VerdictCulprit> where; // one per culprit
  std::string undecided_reason;

  void about(const std::string& op_name, const std::string& group, const std::string& desc, int64_t seq_id, bool is_p2p,
             std::vector<int64_t> waiting) {
    op = op_name;
    pg = group;
    pg_desc = desc;
    seq = seq_id;
    p2p = is_p2p;
    victims = std::move(waiting);
    std::sort(victims.begin(), victims.end());
  }
};

Verdict computeVerdict(const VerdictInput& in);

class VerdictBoard {
 public:
  static VerdictBoard& get();
  // This rank takes part in `incident_id` (its verdict, if any, is due by `deadline_mono_ns`). Only a failure
  // incident gets a verdict: a dump asked for on a healthy job (manual, signal) never does.
  // `opened_here`: this rank opened it (it judges it, and prints the verdict in its own log). `lag_ms`: how
  // long after its opening a rank may take part in it (the coordination's polling period).
  void noteIncident(const std::string& incident_id, const std::string& incident_dir, int64_t deadline_mono_ns,
                    bool failure, bool opened_here, int64_t lag_ms);
  // The verdict's first line for `incident_id` and the ranks it names (ignored if it is not the latest incident).
  void setVerdict(const std::string& incident_id, const std::string& line, std::vector<int64_t> culprits,
                  const std::string& json);
  // The latest incident as torchrun's error file tells it: empty `id` if none.
  struct Record {
    std::string id;
    std::string dir;
    std::string verdict; // "" until it came
    std::vector<int64_t> culprits; // the ranks the verdict names
    bool failure = false;
    // The error-file timestamp of a rank the verdict names (wall seconds): before the incident opened (this
    // rank took part at most `lag_ms` after it), so earlier than any victim's raise, whatever the rounding.
    int64_t named_stamp_s = 0;
    // A failure incident whose verdict came within kVerdictRelevantMs: what an error file may say.
    bool recent = false;
    // This process raised an error that carries this incident (its DistBackendError's note).
    bool raised = false;
    std::string json; // the verdict's JSON, "" if none came with it
  };
  // Waits up to `wait_ms` for a failure incident's verdict, then reads the record.
  Record record(int64_t wait_ms) const;
  // Waits up to `wait_ms` for a verdict of an incident other than `seen_id`; its record, or one with an empty
  // id if none came. For fr_backend.on_verdict's thread.
  Record nextVerdict(const std::string& seen_id, int64_t wait_ms) const;
  // Ends every nextVerdict wait in progress at once (the Python thread that waits is being stopped at exit).
  void wakeVerdictWaiters();
  // The latest failure incident without a verdict yet whose deadline has not passed; "" if none.
  std::string awaitedIncident() const;
  // What an error of an op created at `op_created_mono_ns` says of the incident: the verdict of the failure
  // incident noted since the op was created, else that incident's id and that the verdict follows in the log;
  // only the id of an older incident (it was not opened for this failure); "" if there is none or it is long
  // past. Waits in all at most `wait_ms`: up to `incident_wait_ms` of it for an incident noted since the op
  // was created (not while a dump that gets no verdict is open), then for a failure incident's verdict, or a
  // newer incident. 0, 0: never waits.
  std::string errorNote(int64_t wait_ms, int64_t incident_wait_ms, int64_t op_created_mono_ns) const;
  std::string verdict() const; // the latest incident's verdict line, "" if none
  std::string incident() const;
  // Both, read together.
  std::pair<std::string, std::string> incidentAndVerdict() const;
  // What metrics show (MetricsSnapshot.hpp): incidents this process took part in, and the latest verdict it
  // learned, which a later incident without one (a manual dump) does not clear.
  struct Tally {
    int64_t incidents = 0;
    int64_t failure_incidents = 0;
    std::string verdict_incident; // "" until a verdict came
    std::string verdict;
    std::vector<int64_t> culprits;
    std::string json;
  };
  Tally tally() const;

 private:
  VerdictBoard() = default;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::string incident_;
  std::string incident_dir_;
  std::string verdict_;
  std::vector<int64_t> culprits_;
  std::string verdict_json_;
  int64_t deadline_mono_ns_ = 0;
  int64_t noted_wall_ns_ = 0;
  int64_t noted_mono_ns_ = 0;
  int64_t lag_ms_ = 0;
  int64_t verdict_mono_ns_ = 0;
  mutable std::string raised_incident_; // set by errorNote, which the raising paths call
  uint64_t waiter_wakes_ = 0;
  bool failure_ = false;
  bool opened_here_ = false;
  Tally tally_;

  Record recordLocked() const;
};

} // namespace frnccl
