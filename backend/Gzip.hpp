#pragma once

#include <string>

namespace frnccl {

// gzip (RFC 1952) through the system's zlib, loaded with dlopen at first use:
// the build needs no zlib.h, and a host without libz.so.1 still writes dumps
// (uncompressed, DumpWriter.cpp). Only plain-C functions of zlib's stable ABI
// are used: compress2 gives a zlib stream (2-byte header, raw deflate, Adler-32
// trailer), whose raw deflate is re-framed with a gzip header, CRC-32 and size.
// No GIL, no global state past the loaded library: safe on any thread.
class Gzip {
 public:
  // The process's zlib (libz.so.1; FRNCCL_TEST_LIBZ names another library, for
  // tests of a host without it), loaded once. Never unloaded.
  static const Gzip& system();

  // Loads `library` now; available() says whether it had what is needed.
  explicit Gzip(const std::string& library);
  Gzip(const Gzip&) = delete;
  Gzip& operator=(const Gzip&) = delete;

  bool available() const {
    return compress2_ != nullptr;
  }
  // Why the library is not available (one line), or "".
  const std::string& unavailableReason() const {
    return reason_;
  }

  // The gzip file of `data` (mtime 0, OS Unix). Throws std::runtime_error when
  // zlib is not available or fails (out of memory).
  std::string compress(const std::string& data, int level) const;

 private:
  using Compress2 = int (*)(unsigned char*, unsigned long*, const unsigned char*, unsigned long, int);
  using CompressBound = unsigned long (*)(unsigned long);
  using Crc32 = unsigned long (*)(unsigned long, const unsigned char*, unsigned int);

  Compress2 compress2_ = nullptr;
  CompressBound compress_bound_ = nullptr;
  Crc32 crc32_ = nullptr;
  std::string reason_;
};

} // namespace frnccl
