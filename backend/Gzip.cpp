#include "Gzip.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

namespace frnccl {

namespace {

constexpr int kZOk = 0; // Z_OK
constexpr size_t kZlibHeader = 2; // CMF, FLG (compress2 sets no preset dictionary)
constexpr size_t kZlibTrailer = 4; // Adler-32

void putLE32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    out.push_back(char((v >> (8 * i)) & 0xFF));
  }
}

} // namespace

const Gzip& Gzip::system() {
  // Leaked, like the library it holds: dumps may be written while the process exits.
  static const Gzip* gzip = [] {
    const char* name = std::getenv("FRNCCL_TEST_LIBZ");
    return new Gzip(name != nullptr && *name != '\0' ? name : "libz.so.1");
  }();
  return *gzip;
}

Gzip::Gzip(const std::string& library) {
  // The handle is never closed: the functions stay in use for the life of the process.
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    reason_ = "cannot load " + library + ": " + (err != nullptr ? err : "unknown error");
    return;
  }
  auto c2 = reinterpret_cast<Compress2>(dlsym(lib, "compress2"));
  auto bound = reinterpret_cast<CompressBound>(dlsym(lib, "compressBound"));
  auto crc = reinterpret_cast<Crc32>(dlsym(lib, "crc32"));
  if (c2 == nullptr || bound == nullptr || crc == nullptr) {
    reason_ = library + " lacks compress2, compressBound or crc32";
    return;
  }
  compress_bound_ = bound;
  crc32_ = crc;
  compress2_ = c2;
}

std::string Gzip::compress(const std::string& data, int level) const {
  if (!available()) {
    throw std::runtime_error("gzip: " + reason_);
  }
  const auto* in = reinterpret_cast<const unsigned char*>(data.data());
  unsigned long zlib_len = compress_bound_(static_cast<unsigned long>(data.size()));
  // 10-byte gzip header, the zlib stream (its 2-byte header overwritten, so
  // the deflate data lands where it belongs), then CRC-32 and size: one buffer,
  // no copy of the compressed bytes.
  constexpr size_t kGzipHeader = 10;
  std::string out(kGzipHeader - kZlibHeader + zlib_len, '\0');
  auto* zlib_start = reinterpret_cast<unsigned char*>(&out[kGzipHeader - kZlibHeader]);
  const int rc = compress2_(zlib_start, &zlib_len, in, static_cast<unsigned long>(data.size()), level);
  if (rc != kZOk || zlib_len < kZlibHeader + kZlibTrailer) {
    throw std::runtime_error("gzip: compress2 failed (zlib error " + std::to_string(rc) + ")");
  }
  // The raw deflate is zlib_len minus header and trailer; drop the Adler-32.
  out.resize(kGzipHeader - kZlibHeader + zlib_len - kZlibTrailer);
  const char xfl = level == 1 ? 4 : level == 9 ? 2 : 0; // RFC 1952: fastest / best
  const char header[kGzipHeader] = {'\x1f', '\x8b', 8 /* deflate */, 0 /* no flags */, 0, 0, 0, 0 /* mtime */, xfl,
                                    3 /* Unix */};
  out.replace(0, kGzipHeader, header, kGzipHeader);
  unsigned long crc = crc32_(0, nullptr, 0);
  constexpr size_t kChunk = 1u << 30; // crc32 takes an unsigned int length
  for (size_t done = 0; done < data.size(); done += kChunk) {
    const size_t n = std::min(kChunk, data.size() - done);
    crc = crc32_(crc, in + done, static_cast<unsigned int>(n));
  }
  putLE32(out, static_cast<uint32_t>(crc));
  putLE32(out, static_cast<uint32_t>(data.size() & 0xFFFFFFFFu)); // ISIZE: the size modulo 2^32
  return out;
}

} // namespace frnccl
