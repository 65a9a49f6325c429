#include "ElasticErrorFile.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "DumpValue.hpp"

namespace frnccl {

bool writeElasticErrorFile(const std::string& path, const std::string& message, const std::string& callstack, std::string& why) {
  DumpValue info = DumpValue::dict();
  info.set("py_callstack", callstack);
  info.set("timestamp", std::to_string(static_cast<long long>(std::time(nullptr))));
  DumpValue inner = DumpValue::dict();
  inner.set("message", message);
  inner.set("extraInfo", std::move(info));
  DumpValue top = DumpValue::dict();
  top.set("message", std::move(inner));
  const std::string text = top.toJson();
  // O_EXCL: a file there is someone's report (@record's); O_NOFOLLOW: not through a link.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    why = errno == EEXIST ? "" : std::strerror(errno);
    return false;
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      why = n < 0 ? std::strerror(errno) : "short write";
      ::close(fd);
      return false;
    }
    done += size_t(n);
  }
  if (::close(fd) != 0) {
    why = std::strerror(errno);
    return false;
  }
  return true;
}

} // namespace frnccl
