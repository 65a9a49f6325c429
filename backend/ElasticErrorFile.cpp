#include "ElasticErrorFile.hpp"

#include "DumpValue.hpp"
#include "WholeFile.hpp"

namespace frnccl {

bool writeElasticErrorFile(const std::string& path, const std::string& message, const std::string& callstack,
                           int64_t timestamp_s, std::string& why) {
  DumpValue info = DumpValue::dict();
  info.set("py_callstack", callstack);
  info.set("timestamp", std::to_string(static_cast<long long>(timestamp_s)));
  DumpValue inner = DumpValue::dict();
  inner.set("message", message);
  inner.set("extraInfo", std::move(info));
  DumpValue top = DumpValue::dict();
  top.set("message", std::move(inner));
  // Whole or not at all: the agent may read the file as soon as the process is gone; never replacing a file
  // there (@record's).
  return writeFileWhole(path, top.toJson(), /*replace=*/false, why);
}

} // namespace frnccl
