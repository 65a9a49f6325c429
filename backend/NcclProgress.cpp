// CUDA-only: reads the progress that torch's ProcessGroupNCCL publishes
// (InnerProgress.hpp). Its header needs the NCCL headers; setup.py defines
// FRNCCL_WITH_NCCL_HEADERS when it finds them, and without them no group is
// settled this way (every synchronous op gets end events).
#include "InnerProgress.hpp"

#include <mutex>
#include <type_traits>
#include <vector>

#if defined(FRNCCL_WITH_NCCL_HEADERS)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL // torch's own CUDA build defines it; ProcessGroupNCCL.hpp is empty without it
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace frnccl {

#if defined(FRNCCL_WITH_NCCL_HEADERS)
namespace {

// The status is a protected member: naming it through a derived class gives
// a pointer to member that applies to any ProcessGroupNCCL.
struct StatusAccess : c10d::ProcessGroupNCCL {
  static std::shared_ptr<c10d::ProcessGroupStatus> of(c10d::ProcessGroupNCCL& group) {
    return group.*(&StatusAccess::pgStatus_);
  }
};

} // namespace

static_assert(
    std::is_same_v<decltype(c10d::ProcessGroupStatus::lastEnqueuedSeq), int64_t> &&
        std::is_same_v<decltype(c10d::ProcessGroupStatus::lastCompletedSeq), int64_t>,
    "frnccl: torch's ProcessGroupStatus changed; build with FRNCCL_SETTLE_BY_TORCH_WATCHDOG_BUILD=0");

InnerProgress* innerProgressOf(c10d::Backend& backend) {
  auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(&backend);
  if (nccl == nullptr) {
    return nullptr;
  }
  std::shared_ptr<c10d::ProcessGroupStatus> status = StatusAccess::of(*nccl);
  if (!status) {
    return nullptr;
  }
  // One per NCCL group ever created, like the recorder's record of the group:
  // markers of ops still in flight when a group goes away keep pointing here,
  // and the status itself outlives the group through `owner`.
  static std::mutex mutex;
  static auto* all = std::make_unique<std::vector<std::unique_ptr<InnerProgress>>>().release();
  const int64_t* enqueued = &status->lastEnqueuedSeq;
  const int64_t* completed = &status->lastCompletedSeq;
  auto progress = std::make_unique<InnerProgress>(std::move(status), enqueued, completed);
  std::lock_guard<std::mutex> lock(mutex);
  all->push_back(std::move(progress));
  return all->back().get();
}

bool innerProgressBuilt() {
  return true;
}

#else

InnerProgress* innerProgressOf(c10d::Backend&) {
  return nullptr;
}

bool innerProgressBuilt() {
  return false;
}

#endif

} // namespace frnccl
