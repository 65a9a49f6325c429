// Python-aware stack capture. The only source file that includes Python.h.
#include <Python.h>
#include <frameobject.h>

#include "CallerStack.hpp"
#include "PyFrameWalk.hpp"

#include <atomic>
#include <mutex>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/profiler/combined_traceback.h>

namespace frnccl {

namespace {

constexpr int kMaxPythonFrames = 64;
// Distinct code objects the recorder keeps alive (see the pins below); frames
// of code beyond this are recorded without a name. Only code made at run time
// (exec, compilers) adds to it after the first steps of a training loop.
constexpr size_t kMaxPinnedCode = 1 << 14;

bool pythonUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// ---- code pins ----
// Recorded stacks hold raw code-object pointers. Every code object a stack
// names is pinned (one reference, kept for the life of the process), so
// dropping a stack, e.g. when the ring buffer evicts it, needs no GIL, and an
// op whose code objects are all pinned already captures without the GIL.
// Lock: pins_mutex guards the global set; each thread caches pins it has seen.
std::mutex pins_mutex;
std::unordered_set<PyObject*>* pins = new std::unordered_set<PyObject*>(); // leaked: lives as long as the pins

// A direct-mapped cache of pinned code objects per thread: pinned objects
// never die, so an address found here is pinned for good.
constexpr size_t kPinCacheSlots = 512;
thread_local PyObject* tls_pin_cache[kPinCacheSlots];

inline size_t pinSlot(PyObject* code) {
  return (reinterpret_cast<uintptr_t>(code) >> 4) & (kPinCacheSlots - 1);
}

inline bool knownPinned(PyObject* code) {
  return tls_pin_cache[pinSlot(code)] == code;
}

// Needs the GIL: takes the reference. Returns false when the table is full.
bool pinWithGil(PyObject* code) {
  std::lock_guard<std::mutex> lock(pins_mutex);
  if (pins->count(code) == 0) {
    if (pins->size() >= kMaxPinnedCode) {
      return false;
    }
    Py_INCREF(code);
    pins->insert(code);
  }
  tls_pin_cache[pinSlot(code)] = code;
  return true;
}

// Without the GIL: pinned already by some thread?
bool pinnedElsewhere(PyObject* code) {
  std::lock_guard<std::mutex> lock(pins_mutex);
  if (pins->count(code) == 0) {
    return false;
  }
  tls_pin_cache[pinSlot(code)] = code;
  return true;
}

std::atomic<bool> frame_walk_enabled{false};

// The UTF-8 of a str; the GIL is held. A file name that is not valid UTF-8 on disk holds lone
// surrogates (Python's surrogateescape), for which PyUnicode_AsUTF8 returns nullptr: those are
// written as \udcXX escapes, and the error it set is cleared.
std::string utf8Text(PyObject* s) {
  if (!PyUnicode_Check(s)) {
    return "?";
  }
  Py_ssize_t n = 0;
  if (const char* utf8 = PyUnicode_AsUTF8AndSize(s, &n)) {
    return std::string(utf8, size_t(n));
  }
  PyErr_Clear();
  PyObject* escaped = PyUnicode_AsEncodedString(s, "utf-8", "backslashreplace");
  if (escaped == nullptr) {
    PyErr_Clear();
    return "?";
  }
  std::string out(PyBytes_AS_STRING(escaped), size_t(PyBytes_GET_SIZE(escaped)));
  Py_DECREF(escaped);
  return out;
}

// Code objects (pinned) and where each frame was, innermost first.
class PythonStack final : public CallerStack {
 public:
  bool where_is_line = false;
  std::vector<RawFrame> frames;

  void symbolize(std::vector<SymbolizedFrame>& out) const {
    for (const auto& f : frames) {
      SymbolizedFrame s;
      if (f.code == nullptr) {
        s.name = "<code not kept: more than " + std::to_string(kMaxPinnedCode) + " distinct code objects seen>";
        s.filename = "?";
      } else {
        auto* code = reinterpret_cast<PyCodeObject*>(f.code);
        s.name = utf8Text(code->co_name);
        s.filename = utf8Text(code->co_filename);
        s.line = where_is_line ? f.where : PyCode_Addr2Line(code, f.where);
      }
      out.push_back(std::move(s));
    }
  }
};

// One spare per thread, refilled by the evictions of that thread's records:
// in steady state a capture allocates nothing.
thread_local std::shared_ptr<PythonStack> tls_spare_stack;

// The last stack this thread captured. A training loop issues its ops from a
// few places, so most ops find the frames of the op before them: they share
// that stack, and neither copy frames nor allocate while the ring fills.
// Stacks are never changed once captured, so sharing them is safe.
thread_local std::shared_ptr<PythonStack> tls_last_stack;

bool sameFrames(const PythonStack& stack, bool where_is_line, const RawFrame* raw, int n) {
  if (stack.where_is_line != where_is_line || stack.frames.size() != size_t(n)) {
    return false;
  }
  for (int i = 0; i < n; ++i) {
    if (stack.frames[i].code != raw[i].code || stack.frames[i].where != raw[i].where) {
      return false;
    }
  }
  return true;
}

class CppStack final : public CallerStack {
 public:
  std::shared_ptr<torch::CapturedTraceback> traceback;
};

std::shared_ptr<CallerStack> capturePython() {
  if (!pythonUsable()) {
    return nullptr; // finalizing: other threads' frames are being torn down
  }
  RawFrame raw[kMaxPythonFrames];
  int n = 0;
  bool where_is_line = false;
  bool all_pinned = true;
#ifdef FRNCCL_FRAME_WALK
  if (frame_walk_enabled.load(std::memory_order_relaxed)) {
    n = walkOwnFrames(raw, kMaxPythonFrames);
    for (int i = 0; i < n && all_pinned; ++i) {
      all_pinned = knownPinned(raw[i].code) || pinnedElsewhere(raw[i].code);
    }
    if (!all_pinned) {
      PyGILState_STATE gil = PyGILState_Ensure();
      for (int i = 0; i < n; ++i) {
        if (!knownPinned(raw[i].code) && !pinWithGil(raw[i].code)) {
          raw[i].code = nullptr;
        }
      }
      PyGILState_Release(gil);
    }
  } else
#endif
  {
    where_is_line = true;
    PyGILState_STATE gil = PyGILState_Ensure();
    n = walkWithPublicApi(raw, kMaxPythonFrames);
    for (int i = 0; i < n; ++i) {
      if (!knownPinned(raw[i].code) && !pinWithGil(raw[i].code)) {
        raw[i].code = nullptr;
      }
    }
    PyGILState_Release(gil);
  }
  if (tls_last_stack && sameFrames(*tls_last_stack, where_is_line, raw, n)) {
    return tls_last_stack;
  }
  std::shared_ptr<PythonStack> stack = std::move(tls_spare_stack);
  if (!stack) {
    stack = std::make_shared<PythonStack>();
  }
  stack->where_is_line = where_is_line;
  stack->frames.assign(raw, raw + n);
  tls_last_stack = stack;
  return stack;
}

} // namespace

std::shared_ptr<CallerStack> captureCallerStack(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::kPython:
      return capturePython();
    case CaptureMode::kCpp: {
      auto stack = std::make_shared<CppStack>();
      stack->traceback = torch::CapturedTraceback::gather(/*python=*/false, /*script=*/false, /*cpp=*/true);
      return stack;
    }
    case CaptureMode::kNone:
      break;
  }
  return nullptr;
}

void recycleCallerStack(std::shared_ptr<CallerStack> stack) {
  if (!stack || tls_spare_stack || typeid(*stack) != typeid(PythonStack) || stack.use_count() != 1) {
    return; // dropped here: frames are pinned code objects, so no GIL is needed
  }
  // Another owner that let go (a dump symbolizing it) did so with a release
  // decrement; this pairs with it before the frames are overwritten.
  std::atomic_thread_fence(std::memory_order_acquire);
  tls_spare_stack = std::static_pointer_cast<PythonStack>(std::move(stack));
}

std::vector<std::vector<SymbolizedFrame>> symbolizeStacks(const std::vector<std::shared_ptr<CallerStack>>& stacks) {
  std::vector<std::vector<SymbolizedFrame>> out(stacks.size());
  std::vector<torch::CapturedTraceback*> cpp;
  std::vector<size_t> cpp_index;
  bool have_python = false;
  for (size_t i = 0; i < stacks.size(); ++i) {
    if (auto* c = dynamic_cast<CppStack*>(stacks[i].get())) {
      if (c->traceback) {
        cpp.push_back(c->traceback.get());
        cpp_index.push_back(i);
      }
    } else if (stacks[i]) {
      have_python = true;
    }
  }
  if (have_python && pythonUsable()) {
    // Ops issued from one place share their stack (see tls_last_stack): each
    // is symbolized once, under the GIL, and copied to the rest after.
    std::unordered_map<const CallerStack*, size_t> first_seen;
    std::vector<std::pair<size_t, size_t>> copies; // (to, from)
    PyGILState_STATE gil = PyGILState_Ensure();
    for (size_t i = 0; i < stacks.size(); ++i) {
      if (auto* p = dynamic_cast<PythonStack*>(stacks[i].get())) {
        auto [seen, fresh] = first_seen.emplace(p, i);
        if (fresh) {
          p->symbolize(out[i]);
        } else {
          copies.emplace_back(i, seen->second);
        }
      }
    }
    PyGILState_Release(gil);
    for (const auto& [to, from] : copies) {
      out[to] = out[from];
    }
  }
  if (!cpp.empty()) {
    torch::SymbolizedTracebacks sym = torch::symbolize(cpp);
    for (size_t k = 0; k < sym.tracebacks.size() && k < cpp_index.size(); ++k) {
      for (uint64_t idx : sym.tracebacks[k]) {
        const auto& f = sym.all_frames.at(idx);
        out[cpp_index[k]].push_back({f.funcname, f.filename, int64_t(f.lineno)});
      }
    }
  }
  return out;
}

// A string literal, so that the monitor thread can read it without a lock.
std::atomic<const char*> stack_capture_words{""};

void setUpStackCapture() {
  if (*stack_capture_words.load()) {
    return;
  }
#ifdef FRNCCL_FRAME_WALK
  const bool same = frameWalkAgrees(kMaxPythonFrames);
  frame_walk_enabled.store(same);
  stack_capture_words.store(same ? "interpreter frames, GIL-free once a code object is pinned"
                                 : "public frame API under the GIL (the interpreter frame walk disagreed with it)");
#else
  stack_capture_words.store("public frame API under the GIL (no interpreter frame walk for Python " PY_VERSION ")");
#endif
}

const char* pythonStackCapture() {
  return stack_capture_words.load();
}

void usePublicFrameApi() {
  frame_walk_enabled.store(false);
  stack_capture_words.store("public frame API under the GIL (chosen by a test)");
}

bool holdsGil() {
  return Py_IsInitialized() && PyGILState_Check() == 1;
}

bool runWithGil(const std::function<void()>& fn) {
  if (!pythonUsable()) {
    return false;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  fn();
  PyGILState_Release(gil);
  return true;
}

void releaseStacks(std::vector<std::shared_ptr<CallerStack>>& stacks) {
  if (stacks.empty()) {
    return;
  }
  if (!pythonUsable()) {
    // Leak rather than touch a dying interpreter.
    static std::mutex graveyard_mutex;
    static auto* graveyard = new std::vector<std::shared_ptr<CallerStack>>();
    std::lock_guard<std::mutex> lock(graveyard_mutex);
    for (auto& s : stacks) {
      graveyard->push_back(std::move(s));
    }
    stacks.clear();
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  stacks.clear(); // destructors re-enter PyGILState_Ensure, which nests
  PyGILState_Release(gil);
}

} // namespace frnccl
