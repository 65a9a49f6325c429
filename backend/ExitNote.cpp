#include "ExitNote.hpp"

#include <algorithm>
#include <mutex>

#include "Clock.hpp"

namespace frnccl {

namespace {

// Owns the note; g_mutex guards it. Written by the excepthook's thread, read by
// whichever thread writes a dump.
std::mutex g_mutex;
std::optional<ExitNote> g_note;

// Length of the UTF-8 sequence starting at `i`, or 0 if it is not a valid one.
size_t utf8Length(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
  } else {
    return 0;
  }
  if (i + n > s.size()) {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) {
      return 0;
    }
  }
  return n;
}

} // namespace

std::string escapedText(const std::string& text, size_t max, bool keep_newlines) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(text.size(), max) + 4);
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::string piece;
    size_t used = 1;
    if ((c >= 0x20 && c < 0x7f) || (keep_newlines && c == '\n')) {
      piece.assign(1, static_cast<char>(c));
    } else if (c >= 0x80 && (used = utf8Length(text, i)) != 0) {
      piece = text.substr(i, used);
    } else {
      used = 1;
      piece = "\\x";
      piece.push_back(kHex[c >> 4]);
      piece.push_back(kHex[c & 15]);
    }
    if (out.size() + piece.size() > max) {
      out += "...";
      break;
    }
    out += piece;
    i += used;
  }
  return out;
}

std::string ExitNote::oneLine() const {
  std::string out = type;
  if (!message.empty()) {
    // The message's first line: a CUDA error's text runs on for lines.
    const size_t end = message.find('\n');
    out += ": " + message.substr(0, end);
    if (end != std::string::npos) {
      out += " ...";
    }
  }
  if (!frame.empty()) {
    out += " at " + frame;
  }
  return out;
}

void noteExit(const std::string& type, const std::string& message, const std::string& frame, const std::string& traceback) {
  ExitNote note;
  note.type = escapedText(type, kExitTypeMax, false);
  note.message = escapedText(message, kExitMessageMax, true);
  note.frame = escapedText(frame, kExitFrameMax, false);
  // The innermost frames matter most: a long traceback loses its outer ones.
  const std::string tail = traceback.size() > kExitTracebackMax ? traceback.substr(traceback.size() - kExitTracebackMax) : traceback;
  note.traceback = escapedText(tail, kExitTracebackMax + 3, true);
  note.time_ns = wallNs();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_note = std::move(note);
}

std::optional<ExitNote> exitNote() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_note;
}

void clearExitNote() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_note.reset();
}

} // namespace frnccl
