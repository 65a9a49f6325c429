#pragma once

#include <string>

namespace frnccl {

// Writes `text` at `path` whole or not at all, for a reader that may open it at any moment (torchrun's agent,
// a restart script): to a private name in the same folder first, then into place, never through a link at
// `path`. `replace`: rename() over a file there (the latest wins); else link(), which never replaces one (then
// false with an empty `why`). False on failure, with `why`.
bool writeFileWhole(const std::string& path, const std::string& text, bool replace, std::string& why);

} // namespace frnccl
