#pragma once

#include <cstddef>
#include <cstdint>
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

// A job's tag tells apart the incidents of two jobs that share a dump folder (torchft's replica groups, two
// runs with one FRNCCL_DUMP_DIR): 8 lowercase hex digits. Every rank takes the one its store holds, so a tag
// that arrives from there is checked, and anything else is hashed into one (still the same on every rank).
constexpr size_t kJobTagLength = 8;

inline bool validJobTag(const std::string& tag) {
  if (tag.size() != kJobTagLength) {
    return false;
  }
  for (char c : tag) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return true;
}

// FNV-1a of at most the first 4096 bytes of `text`, as a tag.
inline std::string jobTagOf(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < text.size() && i < 4096; ++i) {
    h = (h ^ static_cast<unsigned char>(text[i])) * 1099511628211ULL;
  }
  static const char* kHex = "0123456789abcdef";
  std::string out(kJobTagLength, '0');
  const uint32_t folded = static_cast<uint32_t>(h ^ (h >> 32));
  for (size_t i = 0; i < kJobTagLength; ++i) {
    out[kJobTagLength - 1 - i] = kHex[(folded >> (4 * i)) & 15];
  }
  return out;
}

// The part of an incident id that names its job: "job.<tag>-", or "" where the tag is unknown. A reason
// never holds a dot (incidentIdReason), so the analyzer finds it without mistaking a reason for it.
inline std::string incidentIdJob(const std::string& job_tag) {
  return validJobTag(job_tag) ? "job." + job_tag + "-" : std::string();
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
