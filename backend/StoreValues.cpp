#include "StoreValues.hpp"

#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace frnccl {

std::optional<std::string> readIfPresent(c10d::Store& store, const std::string& key) {
  static const std::string kAbsent = "frnccl: no such key \x01";
  const std::vector<uint8_t> absent(kAbsent.begin(), kAbsent.end());
  const std::vector<uint8_t> value = store.compareSet(key, absent, absent);
  if (value == absent) {
    return std::nullopt;
  }
  return std::string(value.begin(), value.end());
}

std::optional<int64_t> readCounter(c10d::Store& store, const std::string& key, std::string& raw) {
  const std::optional<std::string> value = readIfPresent(store, key);
  if (!value) {
    return 0;
  }
  raw = *value;
  size_t used = 0;
  try {
    const long long n = std::stoll(raw, &used);
    if (used == raw.size() && !raw.empty() && raw[0] != ' ') {
      return n;
    }
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

} // namespace frnccl
