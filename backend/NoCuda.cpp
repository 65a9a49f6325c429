// Built where the CUDA parts are not (a CPU-only torch, or a CUDA torch whose
// runtime headers setup.py could not find): no NCCL to report and no end events.
#include "DeviceMarker.hpp"
#include "InnerProgress.hpp"

#ifndef FRNCCL_CUDA_SKIPPED
#define FRNCCL_CUDA_SKIPPED "torch is a CPU build"
#endif

namespace frnccl {
const char* cudaPartsSkipped() {
  return FRNCCL_CUDA_SKIPPED;
}
const char* ncclVersionString() {
  return "";
}
EndEventCounts endEventCounts() {
  return {};
}
void setClockSyncInterval(int64_t) {}
int64_t clockSyncs() {
  return 0;
}
uint64_t currentStreamId(int) {
  return 0;
}
InnerProgress* innerProgressOf(c10d::Backend&) {
  return nullptr;
}
bool innerProgressBuilt() {
  return false;
}
} // namespace frnccl
