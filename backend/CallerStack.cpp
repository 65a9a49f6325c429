// Python-aware stack capture. The only source file that includes Python.h.
#include <Python.h>
#include <frameobject.h>

#include "CallerStack.hpp"

#include <mutex>

#include <torch/csrc/profiler/combined_traceback.h>

namespace frnccl {

namespace {

constexpr int kMaxPythonFrames = 64;

bool pythonUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Code objects and line numbers, innermost first. Holding the code object
// (not the frame) keeps names alive without keeping locals alive.
class PythonStack final : public CallerStack {
 public:
  struct Frame {
    PyObject* code;
    int line;
  };
  std::vector<Frame> frames;

  ~PythonStack() override {
    if (frames.empty() || !pythonUsable()) {
      return; // at interpreter exit the references are simply left behind
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    for (auto& f : frames) {
      Py_XDECREF(f.code);
    }
    PyGILState_Release(gil);
  }

  void symbolize(std::vector<SymbolizedFrame>& out) const {
    for (const auto& f : frames) {
      auto* code = reinterpret_cast<PyCodeObject*>(f.code);
      SymbolizedFrame s;
      s.name = PyUnicode_Check(code->co_name) ? PyUnicode_AsUTF8(code->co_name) : "?";
      s.filename = PyUnicode_Check(code->co_filename) ? PyUnicode_AsUTF8(code->co_filename) : "?";
      s.line = f.line;
      out.push_back(std::move(s));
    }
  }
};

class CppStack final : public CallerStack {
 public:
  std::shared_ptr<torch::CapturedTraceback> traceback;
};

std::shared_ptr<CallerStack> capturePython() {
  if (!pythonUsable()) {
    return nullptr;
  }
  auto stack = std::make_shared<PythonStack>();
  stack->frames.reserve(16);
  PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* frame = PyEval_GetFrame(); // borrowed
  Py_XINCREF(frame);
  int depth = 0;
  while (frame != nullptr && depth++ < kMaxPythonFrames) {
    PyObject* code = reinterpret_cast<PyObject*>(PyFrame_GetCode(frame)); // new reference
    stack->frames.push_back({code, PyFrame_GetLineNumber(frame)});
    PyFrameObject* back = PyFrame_GetBack(frame); // new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  PyGILState_Release(gil);
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
    PyGILState_STATE gil = PyGILState_Ensure();
    for (size_t i = 0; i < stacks.size(); ++i) {
      if (auto* p = dynamic_cast<PythonStack*>(stacks[i].get())) {
        p->symbolize(out[i]);
      }
    }
    PyGILState_Release(gil);
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
