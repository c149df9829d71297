#include "attnops/dist/mpi_communicator.h"

#include <chrono>
#include <climits>
#include <thread>
#include <vector>

#include "attnops/error.h"

namespace attnops::dist {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(ErrorCode::internal,
              std::string(what) + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

// Messages are split into pieces of at most 1 GiB (MPI counts are int); the pieces of one
// message travel in order (same pair, same tag), so the receiver's pieces match them.
constexpr std::size_t kPiece = std::size_t{1} << 30;

class MpiRequest final : public Request {
 public:
  std::vector<MPI_Request> reqs;
  ~MpiRequest() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Request& r : reqs)
      if (r != MPI_REQUEST_NULL) {
        // Only on error paths (an exception unwound past the request): cancel what can be.
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
  }
  bool test() override {
    if (reqs.empty()) return true;
    int flag = 0;
    check(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    return flag != 0;
  }
  void wait() override {
    if (reqs.empty()) return;
    check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
};

bool fits_int(const std::vector<std::size_t>& v) {
  for (std::size_t x : v)
    if (x > static_cast<std::size_t>(INT_MAX)) return false;
  return true;
}

std::vector<int> as_int(const std::vector<std::size_t>& v) {
  return std::vector<int>(v.begin(), v.end());
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw Error(ErrorCode::invalid_argument,
                "MpiCommunicator: MPI is not initialised (the program calls MPI_Init_thread with at least "
                "MPI_THREAD_FUNNELED; attnops never initialises MPI)");
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_FUNNELED)
    throw Error(ErrorCode::invalid_argument,
                "MpiCommunicator: MPI was initialised with thread level " + std::to_string(level) +
                    ", need at least MPI_THREAD_FUNNELED (the kernels run OpenMP threads between MPI calls)");
  if (level == MPI_THREAD_FUNNELED) {
    int main_thread = 0;
    MPI_Is_thread_main(&main_thread);
    if (!main_thread)
      throw Error(ErrorCode::invalid_argument,
                  "MpiCommunicator: MPI_THREAD_FUNNELED and this is not the thread that initialised MPI");
  }
  check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string v(version, static_cast<std::size_t>(len));
  if (auto nl = v.find_first_of("\r\n,"); nl != std::string::npos) v.resize(nl);
  const char* lv = level == MPI_THREAD_FUNNELED     ? "funneled"
                   : level == MPI_THREAD_SERIALIZED ? "serialized"
                                                    : "multiple";
  describe_ = "mpi (" + v + ", " + std::to_string(size_) + " ranks, thread level " + lv + ")";
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

RequestPtr MpiCommunicator::isend(const void* data, std::size_t bytes, int dest, int tag) {
  auto r = std::make_unique<MpiRequest>();
  const char* p = static_cast<const char*>(data);
  std::size_t off = 0;
  do {  // at least one message, also for 0 bytes
    const std::size_t n = std::min(kPiece, bytes - off);
    MPI_Request q;
    check(MPI_Isend(p + off, static_cast<int>(n), MPI_BYTE, dest, tag, comm_, &q), "MPI_Isend");
    r->reqs.push_back(q);
    off += n;
  } while (off < bytes);
  return r;
}

RequestPtr MpiCommunicator::irecv(void* data, std::size_t bytes, int source, int tag) {
  auto r = std::make_unique<MpiRequest>();
  char* p = static_cast<char*>(data);
  std::size_t off = 0;
  do {
    const std::size_t n = std::min(kPiece, bytes - off);
    MPI_Request q;
    check(MPI_Irecv(p + off, static_cast<int>(n), MPI_BYTE, source, tag, comm_, &q), "MPI_Irecv");
    r->reqs.push_back(q);
    off += n;
  } while (off < bytes);
  return r;
}

void MpiCommunicator::barrier() {
  check(MPI_Barrier(comm_), "MPI_Barrier");
}

void MpiCommunicator::quiet_barrier() {
  MPI_Request r;
  check(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
  int flag = 0;
  for (;;) {
    check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void MpiCommunicator::allgather(const void* send, std::size_t bytes, void* recv) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) return Communicator::allgather(send, bytes, recv);
  check(
      MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE, comm_),
      "MPI_Allgather");
}

void MpiCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) return Communicator::broadcast(data, bytes, root);
  check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_), "MPI_Bcast");
}

void MpiCommunicator::alltoallv(const void* send, const std::vector<std::size_t>& send_bytes,
                                const std::vector<std::size_t>& send_offsets, void* recv,
                                const std::vector<std::size_t>& recv_bytes,
                                const std::vector<std::size_t>& recv_offsets) {
  if (!fits_int(send_bytes) || !fits_int(send_offsets) || !fits_int(recv_bytes) || !fits_int(recv_offsets))
    return Communicator::alltoallv(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
  const std::vector<int> sc = as_int(send_bytes), so = as_int(send_offsets), rc = as_int(recv_bytes),
                         ro = as_int(recv_offsets);
  check(MPI_Alltoallv(send, sc.data(), so.data(), MPI_BYTE, recv, rc.data(), ro.data(), MPI_BYTE, comm_),
        "MPI_Alltoallv");
}

}  // namespace attnops::dist
