#include "runtime/checkpoint/strategy_state.h"

#include "runtime/checkpoint/state_load.h"
#include "runtime/strategy/strategy.h"

namespace cxxlaunch::runtime::checkpoint {

StrategyState strategyState(Strategy& strategy, StateDictType type, bool with_frozen,
                            int64_t optimizer_steps) {
  StrategyState state;
  state.counters = strategy.stateCounters(optimizer_steps);
  state.stream = strategy.stateStream(type, with_frozen);
  return state;
}

void loadStrategyState(Strategy& strategy, const tensorfile::Reader& reader, Backend& backend) {
  StateLoad load(reader, backend);
  strategy.fillState(load);
  load.finish();
}

void loadStrategyState(Strategy& strategy, const tensorfile::Source& source) {
  StateLoad load(source);
  strategy.fillState(load);
  load.finish();
}

}  // namespace cxxlaunch::runtime::checkpoint
