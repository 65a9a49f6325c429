#pragma once

#include <cstddef>
#include <string>

namespace frnccl {

// An incident id names a folder under FRNCCL_DUMP_DIR, and ids come from the
// job's TCPStore, which any process of the job can write. Only a plain name is
// accepted: 1-128 of [A-Za-z0-9._-], not starting with a dot (so never ".",
// "..", a hidden file, or anything with a path separator).
constexpr size_t kMaxIncidentIdLength = 128;

inline bool incidentIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
      c == '-';
}

inline bool validIncidentId(const std::string& id) {
  if (id.empty() || id.size() > kMaxIncidentIdLength || id[0] == '.') {
    return false;
  }
  for (char c : id) {
    if (!incidentIdChar(c)) {
      return false;
    }
  }
  return true;
}

// The part of an incident id that names its reason: a reason given to
// fr_backend.dump() is free text, kept whole in the dump header only. Here
// every run of other characters (dots too) becomes one '_', and the result is
// cut to 40 characters, so that the whole id stays valid and short.
inline std::string incidentIdReason(const std::string& reason) {
  constexpr size_t kMaxLength = 40;
  std::string out;
  for (char c : reason) {
    if (out.size() >= kMaxLength) {
      break;
    }
    if (incidentIdChar(c) && c != '.') {
      out.push_back(c);
    } else if (out.empty() || out.back() != '_') {
      out.push_back('_');
    }
  }
  return out.empty() ? std::string("dump") : out;
}

// Text from the store or a caller, for a log line: control characters and
// non-ASCII bytes escaped (no terminal escapes, no forged lines), cut to `max`.
inline std::string printable(const std::string& text, size_t max = 200) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

} // namespace frnccl
