// A minimal extension around backend/PyFrameWalk.hpp, built by test/test_frame_walk.py against
// every CPython found on the machine: the frame walk must agree with the public frame API there.
#include "PyFrameWalk.hpp"
static PyObject* agrees(PyObject*, PyObject*) {
#ifdef FRNCCL_FRAME_WALK
  return PyBool_FromLong(frnccl::frameWalkAgrees(64));
#else
  Py_RETURN_NONE;
#endif
}
static PyObject* walk_released(PyObject*, PyObject*) {
  // like the op path: walk with the GIL released, then compare under the GIL
#ifdef FRNCCL_FRAME_WALK
  frnccl::RawFrame a[64], b[64];
  int na;
  Py_BEGIN_ALLOW_THREADS
  na = frnccl::walkOwnFrames(a, 64);
  Py_END_ALLOW_THREADS
  int nb = frnccl::walkWithPublicApi(b, 64);
  if (na != nb) return PyLong_FromLong(-1);
  for (int i = 0; i < na; ++i) if (a[i].code != b[i].code || PyCode_Addr2Line((PyCodeObject*)a[i].code, a[i].where) != b[i].where) return PyLong_FromLong(-2 - i);
  return PyLong_FromLong(na);
#else
  Py_RETURN_NONE;
#endif
}
static PyMethodDef m[] = {{"agrees", agrees, METH_NOARGS, ""}, {"walk_released", walk_released, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef mod = {PyModuleDef_HEAD_INIT, "fw", nullptr, -1, m};
PyMODINIT_FUNC PyInit_fw() { return PyModule_Create(&mod); }
