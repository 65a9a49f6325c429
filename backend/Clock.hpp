#pragma once

#include <cstdint>
#include <ctime>

namespace frnccl {

inline int64_t toNs(const timespec& ts) {
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

inline int64_t readClockNs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return toNs(ts);
}

// Every timestamp in a dump is CLOCK_REALTIME in ns, so dumps of different
// hosts can be put on one time line (to the accuracy of their NTP sync).
inline int64_t wallNs() {
  return readClockNs(CLOCK_REALTIME);
}

// For deadlines and intervals: immune to wall-clock steps.
inline int64_t monoNs() {
  return readClockNs(CLOCK_MONOTONIC);
}

// For the age of ops in flight, against timeouts of seconds and a 2 ms
// catch-up: on virtual machines a precise clock read costs 0.1-0.2 us, a
// coarse one (the last tick, 1-4 ms old) a few ns, and the op path takes one
// per op. The watchdog compares these ages with the same clock.
inline int64_t coarseMonoNs() {
  return readClockNs(CLOCK_MONOTONIC_COARSE);
}

} // namespace frnccl
