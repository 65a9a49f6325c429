#include "ElasticErrorFile.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "DumpValue.hpp"

namespace frnccl {

bool writeElasticErrorFile(const std::string& path, const std::string& message, const std::string& callstack,
                           int64_t timestamp_s, std::string& why) {
  DumpValue info = DumpValue::dict();
  info.set("py_callstack", callstack);
  info.set("timestamp", std::to_string(static_cast<long long>(timestamp_s)));
  DumpValue inner = DumpValue::dict();
  inner.set("message", message);
  inner.set("extraInfo", std::move(info));
  DumpValue top = DumpValue::dict();
  top.set("message", std::move(inner));
  const std::string text = top.toJson();
  // Whole or not at all: the agent may read the file as soon as the process is gone. The text goes to a
  // private name in the same folder first, then link() gives it `path`: link never replaces a file there
  // (@record's: EEXIST) and never follows a link at `path`.
  const size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string tmp = folder + ".frnccl-error-" + std::to_string(static_cast<long long>(::getpid())) + ".tmp";
  // A leftover of a process that had this pid before, which died between its open and its unlink: ours to
  // remove (a link there is removed, never followed).
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    why = std::strerror(errno);
    return false;
  }
  auto fail = [&](const std::string& reason) {
    why = reason;
    ::unlink(tmp.c_str());
    return false;
  };
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      const std::string reason = n < 0 ? std::strerror(errno) : "short write";
      ::close(fd);
      return fail(reason);
    }
    done += size_t(n);
  }
  if (::close(fd) != 0) {
    return fail(std::strerror(errno));
  }
  if (::link(tmp.c_str(), path.c_str()) != 0) {
    return fail(errno == EEXIST ? "" : std::strerror(errno));
  }
  ::unlink(tmp.c_str());
  return true;
}

} // namespace frnccl
