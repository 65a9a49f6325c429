#pragma once

#include <cstdint>
#include <memory>

namespace frnccl {

// Completion marker for an op on a device stream: the watchdog polls it for
// ops that return no Work (synchronous NCCL ops on torch 2.11) and for GPU
// times. Implemented in CudaMarker.cpp, which is built only against CUDA torch.
class DeviceMarker {
 public:
  virtual ~DeviceMarker() = default;
  // Records the start event, if timed; called before the op is enqueued.
  virtual void recordStart() = 0;
  // Records the end event; called after the op is enqueued.
  virtual void recordEnd() = 0;
  virtual bool started() = 0; // only meaningful when timed
  virtual bool completed() = 0;
  virtual bool timed() const = 0;
  // Makes the op's device current on the calling (watchdog) thread, so that
  // polling the op's Work never creates a context on another GPU.
  virtual void bindThread() = 0;
  // GPU start and end on the wall clock, and the duration; valid once completed and timed.
  virtual void gpuTimes(int64_t& start_ns, int64_t& end_ns, float& duration_ms) = 0;
  // The stream the end event went to, and the event's place on it: end
  // events of one stream complete in ticket order, so the watchdog asks the
  // driver about a few of them and infers the rest.
  virtual uint64_t stream() const = 0;
  virtual uint64_t ticket() const = 0;
};

// Null when the extension was built without CUDA.
using DeviceMarkerFactory = std::unique_ptr<DeviceMarker> (*)(int device_index, bool timed);
DeviceMarkerFactory deviceMarkerFactory();
void setDeviceMarkerFactory(DeviceMarkerFactory factory);
// NCCL version of the CUDA build, empty otherwise.
const char* ncclVersionString();

} // namespace frnccl
