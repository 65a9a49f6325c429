#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace frnccl {

// Why this process is leaving the job: the uncaught Python exception that
// ends it (fr_backend's excepthook records it before the interpreter exits).
// The dump writer puts it in every dump this rank writes afterwards, so the
// incident the rank opens on its way out says why it left.
struct ExitNote {
  std::string type; // e.g. "RuntimeError" or "torch.OutOfMemoryError"
  std::string message;
  std::string frame; // innermost user frame: "train.py:8 in forward"
  std::string traceback; // innermost frames last, one per line
  int64_t time_ns = 0; // CLOCK_REALTIME when recorded

  // "RuntimeError: CUDA out of memory at train.py:8 in forward", on one line.
  std::string oneLine() const;
};

// Bounds of each field, in bytes; the longer ones are cut (at a UTF-8
// character boundary) and marked with "...".
constexpr size_t kExitTypeMax = 200;
constexpr size_t kExitMessageMax = 1000;
constexpr size_t kExitFrameMax = 400;
constexpr size_t kExitTracebackMax = 4000;

// Records the note, replacing an earlier one (a later exception is the one that
// ends the process). Control characters are escaped as \xNN (the traceback keeps
// its line breaks); invalid UTF-8 bytes likewise. Any thread.
void noteExit(const std::string& type, const std::string& message, const std::string& frame, const std::string& traceback);
// The recorded note, if any. Any thread.
std::optional<ExitNote> exitNote();
// Forgets it (a new life of the process: the exception was caught after all).
void clearExitNote();

// `text` with control characters and invalid UTF-8 escaped, cut to `max` bytes.
// `keep_newlines`: '\n' passes as is.
std::string escapedText(const std::string& text, size_t max, bool keep_newlines);

} // namespace frnccl
