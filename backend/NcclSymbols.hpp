#pragma once
// Whether the NCCL library this process loaded defines a function, asked before frnccl forwards a call
// whose only way through the inner backend is that function.
//
// A torch wheel is linked against the NCCL it was built with, but runs against whichever libnccl.so.2 the
// loader finds first (an image's, a system's). NCCL functions are bound lazily, so one that the loaded
// library lacks is found missing only at its first call, and the dynamic linker then ends the process
// ("symbol lookup error"), with no dump and no Python error. torch 2.15's wheel calls ncclCommMemStats,
// ncclCommSuspend and ncclCommResume, which NCCL 2.28 does not have.
//
// Plain dlopen/dlsym: built into every frnccl, with or without its CUDA parts, since a build without them
// still forwards to torch's NCCL backends.

#include <string>

namespace frnccl {

// Empty when `function` can be called: the loaded libnccl.so.2 defines it, or no libnccl.so.2 is loaded
// (NCCL linked into torch statically), leaving nothing to check. Otherwise the one-line reason `what`
// cannot be served, naming the function, the loaded NCCL's version and its file.
std::string ncclLacks(const char* function, const char* what);

} // namespace frnccl
