#include "NcclSymbols.hpp"

#include <dlfcn.h>

namespace frnccl {

std::string ncclLacks(const char* function, const char* what) {
  // RTLD_NOLOAD: only the library torch already loaded (matched by its soname), never a second copy.
  void* lib = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) {
    return "";
  }
  std::string reason;
  if (dlsym(lib, function) == nullptr) {
    std::string version = "unknown";
    std::string file = "libnccl.so.2";
    using GetVersion = int (*)(int*);
    void* get = dlsym(lib, "ncclGetVersion");
    int v = 0;
    if (get != nullptr && reinterpret_cast<GetVersion>(get)(&v) == 0 && v > 0) {
      // MAJOR*10000 + MINOR*100 + PATCH since NCCL 2.9.
      version = std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
    }
    Dl_info info{};
    if (get != nullptr && dladdr(get, &info) != 0 && info.dli_fname != nullptr) {
      file = info.dli_fname;
    }
    reason = std::string("frnccl: ") + what + " needs " + function + ", which the loaded NCCL " + version + " (" +
        file + ") lacks; calling it would end the process. Load the NCCL that this torch was built against";
  }
  dlclose(lib);
  return reason;
}

} // namespace frnccl
