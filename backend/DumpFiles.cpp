#include "DumpFiles.hpp"
#include "UniqueFd.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace frnccl {

namespace {

// A folder on the way disappeared while we wrote: another rank that failed to
// write removes an incident's folders while they are empty
// (removeEmptyIncidentFolders), which can fall between our mkdir and our
// link. Writing again is the answer.
struct FolderVanished : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  const std::string message = what + " " + path + ": " + std::strerror(err);
  if (err == ENOENT) {
    throw FolderVanished(message);
  }
  throw std::runtime_error(message);
}


// The dump folder itself, created if missing (links on its path are the
// user's choice, so they are followed).
int openDumpDir(const std::string& path) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (!partial.empty() && mkdir(partial.c_str(), 0750) != 0 && errno != EEXIST) {
      fail("cannot create", partial, errno);
    }
  }
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    fail("cannot open", path, errno);
  }
  return fd;
}

// `name` in the folder `parent`, created if missing: a folder of this user's,
// never followed through a link.
int openOwnFolder(int parent, const std::string& path, const std::string& name) {
  if (mkdirat(parent, name.c_str(), 0750) != 0 && errno != EEXIST) {
    fail("cannot create", path, errno);
  }
  const int fd = openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP || err == ENOTDIR) {
      throw std::runtime_error("refusing to write into " + path + ": it is a symbolic link or not a folder");
    }
    fail("cannot open", path, err);
  }
  UniqueFd owned(fd);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    fail("cannot check", path, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    throw std::runtime_error("refusing to write into " + path + ": not a folder");
  }
  if (st.st_uid != geteuid()) {
    throw std::runtime_error("refusing to write into " + path + ": it belongs to user " + std::to_string(st.st_uid) +
                             ", not to this process's user " + std::to_string(geteuid()));
  }
  return owned.release();
}

// Writes all of `data` to `fd`; 0 or the errno that stopped it.
int writeAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return errno;
    }
    done += size_t(n);
  }
  if (fchmod(fd, 0640) != 0 || fsync(fd) != 0) {
    return errno;
  }
  return 0;
}

[[noreturn]] void alreadyThere(const std::string& path) {
  throw std::runtime_error(path + " already exists; not replaced");
}

// Links the named temporary `tmp` under `name` only if that name is free.
int linkNoReplace(int dir, const std::string& tmp, const std::string& name) {
  if (linkat(dir, tmp.c_str(), dir, name.c_str(), 0) == 0) {
    return 0;
  }
  const int err = errno;
  if (err != EPERM && err != EOPNOTSUPP && err != ENOSYS) {
    return err;
  }
  // A filesystem without hard links.
  return renameat2(dir, tmp.c_str(), dir, name.c_str(), RENAME_NOREPLACE) == 0 ? 0 : errno;
}

// Each file appears under its final name complete, or not at all. The data
// goes to an unnamed file (O_TMPFILE) that is linked in only once written and
// synced, so a rank killed mid-write (SIGTERM from the launcher, SIGKILL)
// leaves nothing behind. Filesystems without O_TMPFILE get a named temporary
// file, which a kill can leave behind as a dot file. linkat never follows a
// link at the new name, and fails if anything is there.
void writeFileIn(int dir, const std::string& dir_path, const std::string& name, const std::string& data) {
  const std::string final_path = dir_path + "/" + name;
  struct stat st {};
  if (fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    alreadyThere(final_path); // before the work of writing; linking checks again
  }
  UniqueFd fd(openat(dir, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0640));
  if (fd.ok()) {
    int err = writeAll(fd.get(), data);
    if (err != 0) {
      fail("cannot write", final_path, err);
    }
    const std::string fd_path = "/proc/self/fd/" + std::to_string(fd.get());
    if (linkat(AT_FDCWD, fd_path.c_str(), dir, name.c_str(), AT_SYMLINK_FOLLOW) == 0) {
      return;
    }
    err = errno;
    if (err == EEXIST) {
      alreadyThere(final_path);
    }
    // ENOENT: the folder vanished (the caller writes again), or /proc is not
    // mounted to link through (written again the other way, below).
    struct stat folder {};
    if (err != ENOENT || fstat(dir, &folder) != 0 || folder.st_nlink == 0) {
      fail("cannot write", final_path, err);
    }
  } else if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
    fail("cannot write", final_path, errno);
  }
  const std::string tmp = "." + name + "." + std::to_string(getpid()) + ".partial";
  UniqueFd named(openat(dir, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640));
  if (!named.ok()) {
    fail("cannot write", dir_path + "/" + tmp, errno);
  }
  int err = writeAll(named.get(), data);
  const int close_err = named.reset();
  if (err == 0) {
    err = close_err;
  }
  if (err == 0) {
    err = linkNoReplace(dir, tmp, name);
  }
  unlinkat(dir, tmp.c_str(), 0);
  if (err == EEXIST) {
    alreadyThere(final_path);
  }
  if (err != 0) {
    fail("cannot write", final_path, err);
  }
}

void writeOnce(
    const std::string& dump_dir,
    const std::string& incident,
    const std::string& format,
    const std::string& name,
    const std::string& data) {
  UniqueFd root(openDumpDir(dump_dir));
  const std::string incident_path = dump_dir + "/" + incident;
  UniqueFd incident_dir(openOwnFolder(root.get(), incident_path, incident));
  const std::string format_path = incident_path + "/" + format;
  UniqueFd format_dir(openOwnFolder(incident_dir.get(), format_path, format));
  writeFileIn(format_dir.get(), format_path, name, data);
}

} // namespace

void writeDumpFile(
    const std::string& dump_dir,
    const std::string& incident,
    const std::string& format,
    const std::string& name,
    const std::string& data) {
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    try {
      writeOnce(dump_dir, incident, format, name, data);
      return;
    } catch (const FolderVanished& e) {
      if (attempt == kAttempts) {
        throw std::runtime_error(e.what());
      }
    }
  }
}

void removeEmptyIncidentFolders(const std::string& dump_dir, const std::string& incident) {
  UniqueFd root(open(dump_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.ok()) {
    return;
  }
  UniqueFd incident_dir(openat(root.get(), incident.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (incident_dir.ok()) {
    // unlinkat(AT_REMOVEDIR) leaves a non-empty folder, and a link, alone.
    for (const char* format : {"compact", "pickle", "json", "chrome"}) {
      unlinkat(incident_dir.get(), format, AT_REMOVEDIR);
    }
  }
  unlinkat(root.get(), incident.c_str(), AT_REMOVEDIR);
}

} // namespace frnccl
