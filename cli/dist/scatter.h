// Moving whole tensors between rank 0 and the shards of every rank (attnops run under mpirun:
// rank 0 reads the files and writes the results).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnops/dist/communicator.h"
#include "attnops/dist/layout.h"
#include "attnops/tensor.h"

namespace attnops::cli {

// What every rank knows about a tensor rank 0 holds.
struct TensorMeta {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
};

// Rank 0 sends every rank its shard of `full` along `dim`; returns this rank's shard.
Tensor scatter_shard(dist::Communicator& comm, const Tensor* full, const TensorMeta& meta,
                     const dist::ShardLayout& layout, int dim, int tag);
// Every rank sends its shard to rank 0, which returns the whole tensor (other ranks: nullopt).
std::optional<Tensor> gather_shards(dist::Communicator& comm, const Tensor& mine,
                                    const dist::ShardLayout& layout, int dim, int tag);
// Rank 0's tensor on every rank.
Tensor broadcast_tensor(dist::Communicator& comm, const Tensor* full, const TensorMeta& meta);

}  // namespace attnops::cli
