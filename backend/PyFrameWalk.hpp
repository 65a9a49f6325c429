#pragma once
// Walks the calling thread's Python frames. Header-only and needs nothing but
// Python.h, so it can be checked against any interpreter on its own. Include
// it from one translation unit.
#include <Python.h>
#include <frameobject.h>

#include <cstdint>

namespace frnccl {

struct RawFrame {
  PyObject* code;
  int32_t where; // byte offset of the instruction (frame walk) or line number (public API)
};

// The calling thread is inside a C call from Python, so its interpreter frames
// hold still and keep their code objects alive; no other thread changes them.
// The public frame API would need the GIL and materialize a frame object per
// frame (garbage for the collector); these mirror the head of CPython's
// _PyInterpreterFrame (Include/internal/pycore_frame.h) for 3.11-3.13 instead,
// and frameWalkAgrees() compares them with the public API before they are used.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#define FRNCCL_FRAME_WALK 1
using CodeUnit = uint16_t; // _Py_CODEUNIT: an opcode byte and its argument byte
constexpr char kOwnedByGenerator = 1;
constexpr char kOwnedByCStack = 3; // 3.12+: the C entry's shim frame
#if PY_VERSION_HEX < 0x030C0000
struct InterpreterFrame {
  PyObject* f_func;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyCodeObject* f_code;
  PyFrameObject* frame_obj;
  InterpreterFrame* previous;
  const CodeUnit* instr; // prev_instr
  int stacktop;
  bool is_entry;
  char owner;
};
inline InterpreterFrame* currentFrame(PyThreadState* ts) {
  return ts->cframe ? reinterpret_cast<InterpreterFrame*>(ts->cframe->current_frame) : nullptr;
}
inline PyObject* frameCode(const InterpreterFrame* f) {
  return reinterpret_cast<PyObject*>(f->f_code);
}
#else
struct InterpreterFrame {
  PyObject* f_code; // 3.13: f_executable, a code object or None
  InterpreterFrame* previous;
  PyObject* f_funcobj;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyFrameObject* frame_obj;
  const CodeUnit* instr; // 3.12: prev_instr; 3.13: instr_ptr
  int stacktop;
  uint16_t return_offset;
  char owner;
};
inline InterpreterFrame* currentFrame(PyThreadState* ts) {
#if PY_VERSION_HEX < 0x030D0000
  return ts->cframe ? reinterpret_cast<InterpreterFrame*>(ts->cframe->current_frame) : nullptr;
#else
  return reinterpret_cast<InterpreterFrame*>(ts->current_frame);
#endif
}
inline PyObject* frameCode(const InterpreterFrame* f) {
  return f->f_code;
}
#endif
#endif

#ifdef FRNCCL_FRAME_WALK
// Fills `out` with the calling thread's frames, innermost first; no GIL.
inline int walkOwnFrames(RawFrame* out, int max) {
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr) {
    return 0;
  }
  int n = 0;
  for (const InterpreterFrame* f = currentFrame(ts); f != nullptr && n < max; f = f->previous) {
    PyObject* code = frameCode(f);
    if (f->owner == kOwnedByCStack || code == nullptr || !PyCode_Check(code)) {
      continue;
    }
    auto* co = reinterpret_cast<PyCodeObject*>(code);
    const auto* first = reinterpret_cast<const CodeUnit*>(co->co_code_adaptive);
    if (f->owner != kOwnedByGenerator && f->instr < first + co->_co_firsttraceable) {
      continue; // not started yet: the public API hides these too
    }
    out[n++] = {code, int32_t((f->instr - first) * int(sizeof(CodeUnit)))};
  }
  return n;
}
#endif

// Needs the GIL. Fills `out` innermost first; `where` is the line number.
inline int walkWithPublicApi(RawFrame* out, int max) {
  PyFrameObject* frame = PyEval_GetFrame(); // borrowed
  Py_XINCREF(frame);
  int n = 0;
  while (frame != nullptr && n < max) {
    PyObject* code = reinterpret_cast<PyObject*>(PyFrame_GetCode(frame)); // new reference
    out[n++] = {code, PyFrame_GetLineNumber(frame)};
    Py_DECREF(code); // the frame keeps it alive while we look
    PyFrameObject* back = PyFrame_GetBack(frame); // new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  return n;
}

#ifdef FRNCCL_FRAME_WALK
// Needs the GIL. True when walking the interpreter's frames gives the same
// code objects and lines as the public API, on the calling thread, now.
inline bool frameWalkAgrees(int max_frames) {
  constexpr int kMax = 256;
  RawFrame walked[kMax];
  RawFrame reference[kMax];
  const int limit = max_frames < kMax ? max_frames : kMax;
  const int n_walked = walkOwnFrames(walked, limit);
  const int n_reference = walkWithPublicApi(reference, limit);
  bool same = n_walked == n_reference && n_walked > 0;
  for (int i = 0; same && i < n_walked; ++i) {
    same = walked[i].code == reference[i].code &&
        PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(walked[i].code), walked[i].where) == reference[i].where;
  }
  return same;
}
#endif

} // namespace frnccl
