#pragma once

#include <cstdint>
#include <ctime>

namespace frnccl {

// Every timestamp in a dump is CLOCK_REALTIME in ns, so dumps of different
// hosts can be put on one time line (to the accuracy of their NTP sync).
inline int64_t wallNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// For deadlines and intervals: immune to wall-clock steps.
inline int64_t monoNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

} // namespace frnccl
