#pragma once

#include <cstdint>
#include <memory>
#include <utility>

namespace frnccl {

class InnerProgress;

// Completion marker for an op on a device stream: the watchdog polls it for
// ops that return no Work (synchronous NCCL ops on torch 2.11) and for GPU
// times. Implemented in CudaMarker.cpp, which is built only against CUDA torch.
class DeviceMarker {
 public:
  virtual ~DeviceMarker() = default;
  // Records the start event, if timed; called before the op is enqueued.
  virtual void recordStart() = 0;
  // Lets torch's NCCL watchdog settle the op, as `inner_seq` of `progress`
  // (InnerProgress.hpp); called before recordEnd(), which then records no end
  // event unless the op is timed or its stream is not one of torch's own.
  virtual void settleBy(const InnerProgress* progress, int64_t inner_seq) = 0;
  // Takes the op's place in stream order, and records its end event if it is
  // timed or due (StreamOrder.hpp); called after the op is enqueued.
  virtual void recordEnd() = 0;
  // Whether completed() answers for this op itself: it has an end event, or
  // torch's watchdog settles it. Otherwise completion is inferred from a later
  // op on the same stream that does.
  virtual bool knowsCompletion() const = 0;
  // Whether completion is learnt from torch's watchdog, which publishes it
  // once per loop: the op may be seen done that much after it was.
  virtual bool settledByTorchWatchdog() const {
    return false;
  }
  // Watchdog only: records an end event now, after everything already placed
  // on the op's stream, and gives the op a new place in stream order to match.
  // False where that is not safe (a stream frnccl did not see torch create may
  // be destroyed under it; a stream being captured into a CUDA graph).
  virtual bool placeEndEventNow() = 0;
  virtual bool started() = 0; // only meaningful when timed
  virtual bool completed() = 0;
  virtual bool timed() const = 0;
  // Makes the op's device current on the calling (watchdog) thread, so that
  // polling the op's Work never creates a context on another GPU.
  virtual void bindThread() = 0;
  // GPU start and end on the wall clock, and the duration; valid once completed and timed.
  virtual void gpuTimes(int64_t& start_ns, int64_t& end_ns, float& duration_ms) = 0;
  // Called once the watchdog is done with the op. CUDA markers go back to
  // their pool, events and all, so that the op path neither allocates nor
  // creates an event.
  virtual void release() {
    delete this;
  }
  // The device and stream the end event went to, and the event's place on it:
  // end events of one stream complete in ticket order, so the watchdog asks
  // the driver about a few of them and infers the rest. A stream handle alone
  // does not name a stream: every device's default stream is the null handle.
  virtual int device() const = 0;
  virtual uint64_t stream() const = 0;
  virtual uint64_t ticket() const = 0;
};

struct ReleaseMarker {
  void operator()(DeviceMarker* marker) const {
    marker->release();
  }
};
using MarkerPtr = std::unique_ptr<DeviceMarker, ReleaseMarker>;

template <class Marker, class... Args>
MarkerPtr makeMarker(Args&&... args) {
  return MarkerPtr(std::make_unique<Marker>(std::forward<Args>(args)...).release());
}

// Null when the extension was built without CUDA. `end_event_interval_ns`:
// an untimed op gets its own end event only if its thread placed none on the
// stream this long (0: every op; see StreamOrder.hpp).
using DeviceMarkerFactory =
    MarkerPtr (*)(int device_index, bool timed, int64_t end_event_interval_ns);
DeviceMarkerFactory deviceMarkerFactory();
void setDeviceMarkerFactory(DeviceMarkerFactory factory);
// NCCL version of the CUDA build, empty otherwise.
const char* ncclVersionString();
// Why this build has no CUDA parts (setup.py's reason), empty where it has them.
const char* cudaPartsSkipped();
// End events recorded so far in this process: on the op path, and by the
// watchdog after the last op of a burst; and synchronous ops left to torch's
// NCCL watchdog to settle, with no end event. Zero without CUDA.
struct EndEventCounts {
  int64_t own = 0;
  int64_t catch_up = 0;
  int64_t by_torch_watchdog = 0;
};
EndEventCounts endEventCounts();
// GPU times are mapped onto the wall clock through a reference event per
// device, renewed when it is older than this (default 10 s). For tests.
void setClockSyncInterval(int64_t interval_ms);
// References recorded so far (each a mapping of GPU time onto the wall clock); 0 without CUDA.
int64_t clockSyncs();
// A nonzero identity of the calling thread's current stream on CUDA device
// `device`; 0 without CUDA.
uint64_t currentStreamId(int device);

} // namespace frnccl
