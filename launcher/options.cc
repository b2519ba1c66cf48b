#include "launcher/options.h"

namespace cxxlaunch::launcher {

int StreamSpec::forRank(int local_rank) const {
  if (per_rank.empty()) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? kNone : it->second;
}

bool LaunchOptions::onConsole(int local_rank, int stream) const {
  if (local_ranks_filter && local_ranks_filter->count(local_rank) == 0) return false;
  const bool redirected = (redirects.forRank(local_rank) & stream) != 0;
  const bool teed = (tee.forRank(local_rank) & stream) != 0;
  return !redirected || teed;
}

}  // namespace cxxlaunch::launcher
