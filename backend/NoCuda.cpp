// Built only against CPU-only torch: there is no NCCL to report and no end events.
#include "DeviceMarker.hpp"
#include "InnerProgress.hpp"

namespace frnccl {
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
