// Built only against CPU-only torch: there is no NCCL to report.
namespace frnccl {
const char* ncclVersionString() {
  return "";
}
} // namespace frnccl
