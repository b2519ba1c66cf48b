#include "runtime/comm/backend.h"

#include <algorithm>

#include "common/error.h"

namespace cxxlaunch::runtime {

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUInt8:
      return 1;
  }
  return 1;
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
  }
  return "?";
}

int rankInGroup(const std::vector<int>& ranks, int rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end() || !std::is_sorted(ranks.begin(), ranks.end())) {
    throw InvalidArgument("subgroup: rank " + std::to_string(rank) +
                          " must be one of the group's ranks, given in ascending order");
  }
  return static_cast<int>(it - ranks.begin());
}

std::string groupKey(const std::vector<int>& ranks, const std::string& partition) {
  std::string key = "group/" + partition;
  for (int r : ranks) {
    key += '/';  // not `"/" + to_string(r)`: GCC 12 at -O3 warns of a false overflow in it
    key += std::to_string(r);
  }
  return key;
}

BackendOptions subgroupOptions(const BackendOptions& world, const std::vector<int>& ranks,
                               const std::string& partition) {
  BackendOptions options = world;
  options.rank = rankInGroup(ranks, world.rank);
  options.world_size = static_cast<int>(ranks.size());
  options.prefix = world.prefix + "/" + groupKey(ranks, partition);
  return options;
}

}  // namespace cxxlaunch::runtime
