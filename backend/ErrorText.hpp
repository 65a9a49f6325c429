#pragma once

#include <exception>
#include <string>

#include <c10/util/Exception.h>

namespace frnccl {

// An exception's message without torch's C++ backtrace (c10::Error::what()
// carries one, many lines long, which would swamp a log line).
inline std::string errorText(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

inline std::string errorText(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return errorText(e);
  } catch (...) {
    return "unknown error";
  }
}

// Joins lines with "; ", for log lines and one-line messages.
inline std::string oneLine(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\n' || c == '\r') {
      if (!out.empty() && out.back() != ' ') {
        out += "; ";
      }
    } else {
      out.push_back(c);
    }
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) {
    out.pop_back();
  }
  return out;
}

// errorText on one line.
inline std::string oneLineErrorText(const std::exception& e) {
  return oneLine(errorText(e));
}

inline std::string oneLineErrorText(const std::exception_ptr& error) {
  return oneLine(errorText(error));
}

} // namespace frnccl
