#include "cli/dist/scatter.h"

namespace attnops::cli {

namespace {
std::vector<std::int64_t> shard_shape(std::vector<std::int64_t> shape, const dist::ShardLayout& l, int rank,
                                      int dim) {
  shape[static_cast<std::size_t>(dim)] = l.shard_length(rank);
  return shape;
}
}  // namespace

Tensor scatter_shard(dist::Communicator& comm, const Tensor* full, const TensorMeta& meta,
                     const dist::ShardLayout& layout, int dim, int tag) {
  const int me = comm.rank();
  if (me != 0) {
    Tensor t(meta.dtype, shard_shape(meta.shape, layout, me, dim));
    comm.irecv(t.data(), t.nbytes(), 0, tag)->wait();
    return t;
  }
  // One shard in flight at a time: rank 0 holds at most one extra shard's memory.
  for (int r = 1; r < comm.size(); ++r) {
    const Tensor part = dist::shard(*full, layout, r, dim);
    comm.isend(part.data(), part.nbytes(), r, tag)->wait();
  }
  return dist::shard(*full, layout, 0, dim);
}

std::optional<Tensor> gather_shards(dist::Communicator& comm, const Tensor& mine,
                                    const dist::ShardLayout& layout, int dim, int tag) {
  const int me = comm.rank();
  if (me != 0) {
    comm.isend(mine.data(), mine.nbytes(), 0, tag)->wait();
    return std::nullopt;
  }
  std::vector<std::int64_t> shape = mine.shape();
  shape[static_cast<std::size_t>(dim)] = layout.length();
  Tensor full(mine.dtype(), shape);
  dist::unshard_into(mine, layout, 0, full, dim);
  for (int r = 1; r < comm.size(); ++r) {
    Tensor part(mine.dtype(), shard_shape(shape, layout, r, dim));
    comm.irecv(part.data(), part.nbytes(), r, tag)->wait();
    dist::unshard_into(part, layout, r, full, dim);
  }
  return full;
}

Tensor broadcast_tensor(dist::Communicator& comm, const Tensor* full, const TensorMeta& meta) {
  Tensor t = comm.rank() == 0 ? *full : Tensor(meta.dtype, meta.shape);
  comm.broadcast(t.data(), t.nbytes(), 0);
  return t;
}

}  // namespace attnops::cli
