#pragma once

#include <string>

namespace frnccl {

// The file-system side of writing a dump. FRNCCL_DUMP_DIR is trusted (the
// user chose it, and its permissions say who may write there); everything
// below it is not: an incident id comes from the job's TCPStore, and anyone
// who can write in the dump folder can plant links in it. So, from the dump
// folder down:
//  - each folder is created, then opened with O_DIRECTORY|O_NOFOLLOW and
//    checked to be a folder owned by this process's user;
//  - a file is written unnamed (O_TMPFILE), or as a temporary file opened with
//    O_CREAT|O_EXCL|O_NOFOLLOW, and linked under its final name only if that
//    name is free: an existing file is never replaced, and no link is followed.

// Writes `data` to <dump_dir>/<incident>/<format>/<name>, whole or not at all.
// Throws std::runtime_error with a one-line reason.
void writeDumpFile(
    const std::string& dump_dir,
    const std::string& incident,
    const std::string& format,
    const std::string& name,
    const std::string& data);

// After a failed write: removes the incident's folders that are left empty.
void removeEmptyIncidentFolders(const std::string& dump_dir, const std::string& incident);

} // namespace frnccl
