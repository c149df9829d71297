// The in-process world: per destination rank, the sends not yet received and the receives not
// yet matched, in posting order, under one mutex; whoever posts second copies the bytes.
#include "attnops/dist/local_communicator.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "attnops/error.h"

namespace attnops::dist {

namespace {

struct Op {
  int peer = 0;   // a send's destination / a receive's source
  int owner = 0;  // the rank that posted it
  int tag = 0;
  const char* send_data = nullptr;  // a send's bytes (or eager_copy's)
  char* recv_data = nullptr;
  std::size_t bytes = 0;
  std::vector<char> eager_copy;
  bool done = false;
};
using OpPtr = std::shared_ptr<Op>;

}  // namespace

struct LocalWorld::State {
  explicit State(int n, std::size_t eager)
      : size(n), eager_limit(eager), sends(static_cast<std::size_t>(n)), recvs(static_cast<std::size_t>(n)) {}
  const int size;
  const std::size_t eager_limit;
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  std::string why;
  std::vector<std::deque<OpPtr>> sends;  // [dest]: unmatched sends to dest
  std::vector<std::deque<OpPtr>> recvs;  // [dest]: unmatched receives posted by dest

  void check_aborted() const {
    if (aborted) throw Error(ErrorCode::internal, "in-process world aborted: " + why);
  }
  // Copies a matched pair (mu held) and completes both.
  void complete(Op& send, Op& recv) {
    if (send.bytes > recv.bytes)
      throw Error(ErrorCode::internal, "in-process message of " + std::to_string(send.bytes) +
                                           " bytes from rank " + std::to_string(send.owner) + " (tag " +
                                           std::to_string(send.tag) + ") into a receive of " +
                                           std::to_string(recv.bytes) + " bytes");
    if (send.bytes > 0) std::memcpy(recv.recv_data, send.send_data, send.bytes);
    send.done = recv.done = true;
    cv.notify_all();
  }
};

namespace {

class LocalRequest final : public Request {
 public:
  LocalRequest(std::shared_ptr<LocalWorld::State> s, OpPtr op, bool is_send)
      : s_(std::move(s)), op_(std::move(op)), is_send_(is_send) {}
  ~LocalRequest() override {
    // An incomplete request (an exception unwound past it) is withdrawn: its buffer may go away.
    std::lock_guard lock(s_->mu);
    if (op_->done) return;
    auto& q = is_send_ ? s_->sends[static_cast<std::size_t>(op_->peer)]
                       : s_->recvs[static_cast<std::size_t>(op_->owner)];
    for (auto it = q.begin(); it != q.end(); ++it)
      if (*it == op_) {
        q.erase(it);
        break;
      }
  }
  bool test() override {
    std::lock_guard lock(s_->mu);
    if (op_->done) return true;
    s_->check_aborted();
    return false;
  }
  void wait() override {
    std::unique_lock lock(s_->mu);
    s_->cv.wait(lock, [&] { return op_->done || s_->aborted; });
    if (!op_->done) s_->check_aborted();
  }

 private:
  std::shared_ptr<LocalWorld::State> s_;
  OpPtr op_;
  bool is_send_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalWorld::State> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  std::string describe() const override {
    return "in-process (" + std::to_string(s_->size) + " ranks as threads, eager limit " +
           std::to_string(s_->eager_limit) + " B)";
  }

  RequestPtr isend(const void* data, std::size_t bytes, int dest, int tag) override {
    check_peer(dest, "isend");
    auto op = std::make_shared<Op>();
    op->peer = dest, op->owner = rank_, op->tag = tag, op->bytes = bytes;
    op->send_data = static_cast<const char*>(data);
    std::lock_guard lock(s_->mu);
    s_->check_aborted();
    auto& waiting = s_->recvs[static_cast<std::size_t>(dest)];
    for (auto it = waiting.begin(); it != waiting.end(); ++it)
      if ((*it)->peer == rank_ && (*it)->tag == tag) {
        OpPtr r = *it;
        waiting.erase(it);
        s_->complete(*op, *r);
        return std::make_unique<LocalRequest>(s_, op, true);
      }
    if (bytes <= s_->eager_limit) {  // eager: the bytes are copied now, the send is complete
      op->eager_copy.assign(op->send_data, op->send_data + bytes);
      op->send_data = op->eager_copy.data();
      op->done = true;
    }
    s_->sends[static_cast<std::size_t>(dest)].push_back(op);
    return std::make_unique<LocalRequest>(s_, op, true);
  }

  RequestPtr irecv(void* data, std::size_t bytes, int source, int tag) override {
    check_peer(source, "irecv");
    auto op = std::make_shared<Op>();
    op->peer = source, op->owner = rank_, op->tag = tag, op->bytes = bytes;
    op->recv_data = static_cast<char*>(data);
    std::lock_guard lock(s_->mu);
    s_->check_aborted();
    auto& pending = s_->sends[static_cast<std::size_t>(rank_)];
    for (auto it = pending.begin(); it != pending.end(); ++it)
      if ((*it)->owner == source && (*it)->tag == tag) {
        OpPtr sd = *it;
        pending.erase(it);
        s_->complete(*sd, *op);  // an eager send is already complete; its bytes are in eager_copy
        return std::make_unique<LocalRequest>(s_, op, false);
      }
    s_->recvs[static_cast<std::size_t>(rank_)].push_back(op);
    return std::make_unique<LocalRequest>(s_, op, false);
  }

 private:
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= s_->size)
      throw Error(ErrorCode::invalid_argument, std::string(what) + ": rank " + std::to_string(peer) +
                                                   " outside a world of " + std::to_string(s_->size));
  }
  std::shared_ptr<LocalWorld::State> s_;
  int rank_;
};

}  // namespace

LocalWorld::LocalWorld(int size, std::size_t eager_limit) {
  if (size < 1)
    throw Error(ErrorCode::invalid_argument, "LocalWorld: size must be >= 1, got " + std::to_string(size));
  state_ = std::make_shared<State>(size, eager_limit);
}

int LocalWorld::size() const {
  return state_->size;
}

std::unique_ptr<Communicator> LocalWorld::communicator(int rank) {
  if (rank < 0 || rank >= state_->size)
    throw Error(ErrorCode::invalid_argument, "LocalWorld: rank " + std::to_string(rank) +
                                                 " outside a world of " + std::to_string(state_->size));
  return std::make_unique<LocalCommunicator>(state_, rank);
}

void LocalWorld::abort(const std::string& why) {
  std::lock_guard lock(state_->mu);
  if (!state_->aborted) {
    state_->aborted = true;
    state_->why = why;
  }
  state_->cv.notify_all();
}

void run_local_ranks(int size, const std::function<void(Communicator&)>& fn, std::size_t eager_limit) {
  LocalWorld world(size, eager_limit);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = world.communicator(r);
        fn(*comm);
      } catch (...) {
        std::string what = "rank " + std::to_string(r) + " failed";
        try {
          throw;
        } catch (const std::exception& e) {
          what += ": ";
          what += e.what();
        } catch (...) {
        }
        {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
        }
        world.abort(what);
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace attnops::dist
