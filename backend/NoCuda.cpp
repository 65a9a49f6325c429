// Built only against CPU-only torch: there is no NCCL to report and no end events.
#include "DeviceMarker.hpp"

namespace frnccl {
const char* ncclVersionString() {
  return "";
}
EndEventCounts endEventCounts() {
  return {};
}
} // namespace frnccl
