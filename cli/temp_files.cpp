#include "cli/temp_files.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "attnops/error.h"

namespace attnops::cli {
namespace {

constexpr int kSlots = 32;      // outputs of one command: run has at most 8, bench 3
constexpr int kMaxPath = 4096;  // PATH_MAX on Linux
enum State : int { kFree = 0, kTaken = 1, kArmed = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  char path[kMaxPath];
};
Slot g_slots[kSlots];  // static storage: no allocation, valid until the process ends
static_assert(std::atomic<int>::is_always_lock_free, "the handler reads the states");

void remove_temporaries_and_die(int sig) {
  for (Slot& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == kArmed) ::unlink(s.path);
  ::signal(sig, SIG_DFL);  // then die of the same signal: the caller sees 128 + sig
  ::raise(sig);
}

}  // namespace

void install_signal_handlers() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = remove_temporaries_and_die;
    sigemptyset(&sa.sa_mask);
    for (const int other : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sa.sa_mask, other);  // one cleanup at a time
    ::sigaction(sig, &sa, nullptr);
  }
  ::signal(SIGXFSZ, SIG_IGN);
}

TempFileSlot::TempFileSlot() {
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (g_slots[i].state.compare_exchange_strong(expected, kTaken)) {
      index_ = i;
      return;
    }
  }
  throw Error(ErrorCode::io_error, "too many output files at once (at most " + std::to_string(kSlots) + ")");
}

TempFileSlot::TempFileSlot(TempFileSlot&& other) noexcept : index_(other.index_) {
  other.index_ = -1;
}

TempFileSlot::~TempFileSlot() {
  if (index_ >= 0) g_slots[index_].state.store(kFree, std::memory_order_release);
}

void TempFileSlot::arm(const std::string& path) {
  if (path.size() >= static_cast<std::size_t>(kMaxPath))
    throw Error(ErrorCode::io_error, "path too long: " + path.substr(0, 64) + "...");
  Slot& s = g_slots[index_];
  s.state.store(kTaken, std::memory_order_release);  // the handler must not read a half-written path
  std::memcpy(s.path, path.c_str(), path.size() + 1);
  s.state.store(kArmed, std::memory_order_release);
}

void TempFileSlot::disarm() {
  g_slots[index_].state.store(kTaken, std::memory_order_release);
}

}  // namespace attnops::cli
