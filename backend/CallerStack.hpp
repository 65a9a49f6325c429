#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace frnccl {

struct SymbolizedFrame {
  std::string name;
  std::string filename;
  int64_t line = 0;
};

// The stack of the thread that issued an op, captured cheaply on the op path
// and turned into names only when a dump asks for it.
class CallerStack {
 public:
  virtual ~CallerStack() = default;
};

enum class CaptureMode : uint8_t { kNone, kPython, kCpp };

// Captures the calling thread's stack (Python frames take the GIL briefly).
std::shared_ptr<CallerStack> captureCallerStack(CaptureMode mode);

// Takes a stack the ring buffer evicted, on the thread that evicted it. If
// nothing else holds it (a dump's snapshot may), the next Python capture on
// this thread fills it instead of allocating a new one.
void recycleCallerStack(std::shared_ptr<CallerStack> stack);

// Symbolizes every stack, innermost frame first. Takes the GIL for Python
// stacks, so call it only where blocking on the GIL is acceptable (a helper
// thread with a bounded wait, or a Python thread). Null stacks give empty lists.
std::vector<std::vector<SymbolizedFrame>> symbolizeStacks(const std::vector<std::shared_ptr<CallerStack>>& stacks);

// Drops the stacks; releasing Python frames needs the GIL, so this too must
// run where waiting for it is acceptable.
void releaseStacks(std::vector<std::shared_ptr<CallerStack>>& stacks);

// Needs the GIL. Checks, on the calling thread, that walking the interpreter's
// own frames (GIL-free) gives what the public frame API gives, and uses it for
// Python stacks if so. Once per process; later calls change nothing.
void setUpStackCapture();

// How Python stacks are captured, in words (empty before setUpStackCapture).
// Needs no GIL: dumps name it in their header.
const char* pythonStackCapture();

// From now on, captures go through the public frame API (for tests that
// compare the two ways).
void usePublicFrameApi();

// Whether the calling thread holds the GIL (false when there is no interpreter).
bool holdsGil();

// Runs `fn` holding the GIL (blocks until it is free); false, without running
// it, when the interpreter is gone or going.
bool runWithGil(const std::function<void()>& fn);

} // namespace frnccl
