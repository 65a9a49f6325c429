#include "FrWork.hpp"

#include <c10/util/Exception.h>
#include <ATen/core/ivalue_inl.h>

#include <algorithm>
#include <cstdio>

#include "CallerStack.hpp"
#include "Clock.hpp"
#include "ErrorText.hpp"
#include "Runtime.hpp"
#include "Verdict.hpp"
#include "Watchdog.hpp"

namespace frnccl {

namespace {

// Communication failures (timeouts, Gloo's transport errors, torch's Dist*
// errors) are re-raised naming the op; torch's own argument errors (a plain
// c10::Error, e.g. a reduce op the dtype does not support) stay exactly as
// torch raises them without frnccl, however late the caller waits for them.
// `caller_waits`: raised on the caller's wait (not from exception(), which the watchdog may call): the
// error may then wait, bounded by the incident's dump deadline, for the incident's verdict.
[[noreturn]] void throwNamed(const OpLabel& label, const std::exception_ptr& cause, bool caller_waits) {
  bool argument_error = false;
  try {
    std::rethrow_exception(cause);
  } catch (const c10::DistError&) {
  } catch (const c10::Error&) {
    argument_error = true;
  } catch (...) {
  }
  if (argument_error) {
    std::rethrow_exception(cause);
  }
  if (Watchdog* watchdog = Runtime::get().watchdogOf(label.life)) {
    watchdog->noteFailure(NotedFailure{label.record_id, label.pg_index, label.op, label.seq, label.p2p,
                                       label.timeout_ms, label.created_mono_ns, cause});
  }
  std::string text = describeFailure(label, errorText(cause));
  // The incident this rank took part in: its verdict once known, else its id and where its dumps are. Waited
  // for briefly (kMaxVerdictWaitMs) and only where one can come: never while this thread holds the GIL (the
  // dump that the verdict follows may need it), nor without a monitor that reaches the store.
  const bool may_wait = caller_waits && !holdsGil() && Runtime::get().mayGetVerdict(label.life);
  const std::string note = VerdictBoard::get().errorNote(may_wait ? kMaxVerdictWaitMs : 0,
                                                         may_wait ? kIncidentNoteWaitMs : 0, label.created_mono_ns);
  if (!note.empty()) {
    text += "\n" + note;
  }
  C10_THROW_ERROR(DistBackendError, text);
}

// The caller saw the op finish, though its Work does not say so (see
// Watchdog::noteCompletion).
void noteWaited(const OpLabel& label) {
  if (Watchdog* watchdog = Runtime::get().watchdogOf(label.life)) {
    watchdog->noteCompletion(label.record_id, wallNs());
  }
}

} // namespace

std::atomic<bool> g_date_completions{false};

std::string describeFailure(const OpLabel& label, const std::string& cause) {
  std::string pg_name = std::to_string(label.pg_index);
  std::string pg_desc;
  const std::vector<PgInfo> pgs = Recorder::get().pgs();
  // A group of an earlier life may have handed its slot on (Recorder::registerPg): its name is not that group's.
  if (label.pg_index >= 0 && size_t(label.pg_index) < pgs.size() && pgs[label.pg_index].life == label.life) {
    pg_name = pgs[label.pg_index].name;
    pg_desc = pgs[label.pg_index].desc;
  }
  const int64_t elapsed_ns = monoNs() - label.created_mono_ns;
  const double elapsed_s = double(elapsed_ns) / 1e9;
  // The time is the caller's, who may wait long after the op failed: an error
  // is called a timeout only if it also says so (Gloo: "Timed out waiting ...").
  const bool says_timeout = cause.find("imed out") != std::string::npos || cause.find("imeout") != std::string::npos;
  const bool timed_out = says_timeout && failedAtTimeout(elapsed_ns, label.timeout_ms);
  char when[96];
  std::snprintf(when, sizeof(when), "%s after %.1f s (timeout %lld ms)", timed_out ? "timed out" : "failed",
                elapsed_s, static_cast<long long>(label.timeout_ms));
  std::string text = "frnccl: gloo:";
  text += opName(label.op);
  text += " on process group '" + pg_name + "'";
  if (!pg_desc.empty()) {
    text += " (" + pg_desc + ")";
  }
  text += label.p2p ? ", p2p_seq_id " : ", collective_seq_id ";
  text += std::to_string(label.seq) + ", " + when + ": " + cause;
  return text;
}

FrWork::FrWork(c10::intrusive_ptr<c10d::Work> inner, int rank, OpLabel label)
    : c10d::Work(rank, inner->retrieveOpType()), inner_(std::move(inner)), label_(label) {}

bool FrWork::isCompleted() {
  return inner_->isCompleted();
}

bool FrWork::isSuccess() const {
  return inner_->isSuccess();
}

std::exception_ptr FrWork::exception() const {
  std::exception_ptr cause = inner_->exception();
  if (!cause) {
    return cause;
  }
  try {
    throwNamed(label_, cause, /*caller_waits=*/false);
  } catch (...) {
    return std::current_exception();
  }
}

int FrWork::sourceRank() const {
  return inner_->sourceRank();
}

std::vector<at::Tensor> FrWork::result() {
  return inner_->result();
}

void FrWork::synchronize() {
  try {
    inner_->synchronize();
  } catch (...) {
    throwNamed(label_, std::current_exception(), /*caller_waits=*/true);
  }
}

bool FrWork::wait(std::chrono::milliseconds timeout) {
  bool done = false;
  try {
    done = inner_->wait(timeout);
  } catch (...) {
    throwNamed(label_, std::current_exception(), /*caller_waits=*/true);
  }
  // A Work that never says it completed needs the wait as proof; for the others it dates the completion
  // closer than the watchdog's poll, for the slow-rank detector (Watchdog::noteCompletion).
  if (done && (g_date_completions.load(std::memory_order_relaxed) || !inner_->isCompleted())) {
    noteWaited(label_);
  }
  return done;
}

void FrWork::abort() {
  inner_->abort();
}

c10::intrusive_ptr<c10::ivalue::Future> FrWork::getFuture() {
  auto future = inner_->getFuture();
  if (!future) {
    return future;
  }
  const OpLabel label = label_;
  return future->then(
      [label](c10::ivalue::Future& done) -> c10::IValue {
        if (done.hasError()) {
          throwNamed(label, done.exception_ptr(), /*caller_waits=*/false); // on the inner backend's thread
        }
        noteWaited(label);
        return done.value();
      },
      future->elementType());
}

c10::intrusive_ptr<c10::ivalue::Future> FrWork::getFutureResult() {
  return inner_->getFutureResult();
}

float FrWork::getDuration() const {
  return inner_->getDuration();
}

uint64_t FrWork::getSequencenumber() const {
  return inner_->getSequencenumber();
}

WorkList::WorkList(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, c10d::OpType::COALESCED), works_(std::move(works)) {}

bool WorkList::isCompleted() {
  for (auto& work : works_) {
    if (!work->isCompleted()) {
      return false;
    }
  }
  return true;
}

bool WorkList::isSuccess() const {
  for (const auto& work : works_) {
    if (!work->isSuccess()) {
      return false;
    }
  }
  return true;
}

std::exception_ptr WorkList::exception() const {
  for (const auto& work : works_) {
    if (auto cause = work->exception()) {
      return cause;
    }
  }
  return nullptr;
}

void WorkList::synchronize() {
  for (auto& work : works_) {
    work->synchronize();
  }
}

bool WorkList::wait(std::chrono::milliseconds timeout) {
  if (timeout == kNoTimeout) {
    for (auto& work : works_) {
      work->wait();
    }
    return true;
  }
  // One budget for the whole block, as for a single Work.
  const int64_t deadline = monoNs() + int64_t(timeout.count()) * 1000000;
  for (auto& work : works_) {
    const int64_t left_ms = std::max<int64_t>(0, (deadline - monoNs()) / 1000000);
    if (!work->wait(std::chrono::milliseconds(left_ms))) {
      return false;
    }
  }
  return true;
}

void WorkList::abort() {
  for (auto& work : works_) {
    work->abort();
  }
}

} // namespace frnccl
