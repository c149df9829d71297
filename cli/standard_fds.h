// Descriptors 0, 1 and 2 are open before the program opens anything: a process started with
// one of them closed (`attnops run ... 2>&-`) would otherwise get its next file (an output's
// temporary) as that descriptor, and whatever is written to stderr (the dispatch log, warnings)
// would land in the output. Robust Unix programs do the same (coreutils, OpenSSH).
#pragma once

namespace attnops::cli {

// Opens /dev/null on each of 0, 1, 2 that is closed (read-only for 0, write-only for 1 and 2).
// Returns false when one could not be opened; the caller then exits (nothing was written yet).
bool ensure_standard_descriptors() noexcept;

}  // namespace attnops::cli
