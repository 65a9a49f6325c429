#pragma once

// Following synchronous CUDA ops to completion without an end event per op.
//
// A synchronous NCCL op returns no Work. Unless torch's own NCCL watchdog
// settles it (InnerProgress.hpp), the only way to see it finish is an event
// recorded after it on its stream (1-2.5 us of the caller's CPU in place on
// the GPU host, the largest part of frnccl's cost per small op). Work on one
// stream finishes in the order it was placed there, so one completed event
// proves every op placed before it done. Hence:
//  - on the op path, EndEventSampler gives an op its own end event only if
//    the calling thread placed none on that stream in the last interval;
//  - every op, with or without an event, takes a ticket in stream order
//    (CudaMarker.cpp), and the watchdog settles a stream with countSettled;
//  - the last op of a burst may have no event: the watchdog places one after
//    it once it is older than the interval (a "catch-up" end event), so a
//    hung op is still seen pending and times out.
// Pure C++ (no CUDA) so that the logic is unit-tested on CPU builds.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace frnccl {

// Per thread: the stream this thread last issued on and when it last gave an op an end event there.
class EndEventSampler {
 public:
  // True if an op issued now on `stream` of `device` needs its own end event. `interval_ns` <= 0: every op.
  bool due(int device, uint64_t stream, int64_t now_ns, int64_t interval_ns) {
    if (interval_ns <= 0 || device != device_ || stream != stream_ || now_ns - last_event_ns_ >= interval_ns) {
      device_ = device;
      stream_ = stream;
      last_event_ns_ = now_ns;
      return true;
    }
    return false;
  }

 private:
  int device_ = -1;
  uint64_t stream_ = ~uint64_t{0};
  int64_t last_event_ns_ = 0;
};

// Ops of one stream sorted by ticket; `has_event(i)` says whether op i has an
// end event, `completed(i)` asks the driver about it. Returns how many of the
// ops (a prefix) are known complete: all up to the last end event found
// complete. Asks about O(log n) events, never about one without an event.
template <class HasEvent, class Completed>
size_t countSettled(size_t n, HasEvent has_event, Completed completed) {
  std::vector<size_t> anchors;
  for (size_t i = 0; i < n; ++i) {
    if (has_event(i)) {
      anchors.push_back(i);
    }
  }
  size_t done = 0, open = anchors.size(); // the first pending anchor lies in [done, open]
  while (done < open) {
    const size_t mid = done + (open - done) / 2;
    if (completed(anchors[mid])) {
      done = mid + 1;
    } else {
      open = mid;
    }
  }
  return done == 0 ? 0 : anchors[done - 1] + 1;
}

} // namespace frnccl
