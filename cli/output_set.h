// All-or-nothing writing of a command's output files (`attnops run --out --lse-out
// --weights-out`, and whatever outputs a command adds later).
//
//   OutputSet outs;
//   const int o = outs.add(a.out, "--out");      // before the work: fails early on a bad path
//   const int l = outs.add(a.lse_out, "--lse-out");
//   ... compute ...
//   write_npy(outs.fd(o), outs.name(o), result); // fill each output
//   outs.commit();                               // only now do the files appear
//
// The rules (README, "Processes and files"):
//  - add() reserves an output before any work: a missing directory, a directory as target, an
//    unwritable place, a target that is not a regular file, or one file named by two outputs
//    fails at once. "One file" is decided by identity, not spelling: the directory's (device,
//    inode) and the last path component after following symbolic links, or the file's own
//    (device, inode) when it exists, so s.npy, ./s.npy, /abs/s.npy, a/../s.npy, a symlinked
//    directory, a symlink or a hard link to it are all the same output.
//  - Each output is written to a temporary next to its target (same directory, so the final
//    rename is atomic and never crosses file systems), named .attnops-<16 hex digits> whatever
//    the target is called (a name of NAME_MAX bytes works). commit() renames every temporary onto
//    its target once all were written; before that (an exception unwinding past the set) the
//    destructor removes them: a failed command leaves no new file and never a partial one, and
//    existing targets keep their old content. SIGINT, SIGTERM and SIGHUP remove them too
//    (cli/temp_files.h).
//  - A symbolic link is followed (as open() would): the file it ends at is replaced and the link
//    stays. A replaced file keeps its permission bits (its owner becomes the caller).
//  - FIFOs, sockets and devices are refused (a FIFO would block, or hand a reader a partial
//    file); /dev/null is the exception: written in place, the output discarded (several
//    outputs may name it).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "cli/temp_files.h"

namespace attnops::cli {

class OutputSet {
 public:
  OutputSet() = default;
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;
  ~OutputSet();

  // Reserves output `path`; `what` (e.g. "--out") names it in messages. Returns its index.
  int add(const std::string& path, const std::string& what);
  int fd(int index) const;  // where to write the output's bytes
  // Writes all of `bytes` to the output (retrying short writes). Error(io_error) naming it.
  void write(int index, const std::string& bytes) const;
  const std::string& name(int index) const;  // the target path, for messages
  // Closes every file (reporting write errors, e.g. a full disk) and renames the temporaries
  // onto their targets. Throws Error(io_error) naming the output that failed.
  void commit();

 private:
  struct Target {
    std::string dir, name;  // the path split at its last '/' ("." when there is none)
    dev_t dir_dev = 0;
    ino_t dir_ino = 0;
    bool exists = false;
    dev_t dev = 0;  // when it exists
    ino_t ino = 0;
    mode_t mode = 0;
    bool dev_null = false;  // it is /dev/null
    bool same_file(const Target& other) const;
  };
  static Target locate(const std::string& path, const std::string& shown, const std::string& what);

  struct Output {
    std::string path, what, temp;  // temp empty: written in place (/dev/null)
    std::string resolved;          // path with its symbolic links followed: what is replaced
    Target target;
    int fd = -1;
    std::optional<TempFileSlot> slot;  // the temporary in the signal handler's table
  };
  std::vector<Output> outputs_;
  bool committed_ = false;
};

}  // namespace attnops::cli
