#pragma once
// A strategy's state in a checkpoint, saved and loaded one way: through the strategy's state views
// (state_view.h), so that the Accelerator never handles the views and the strategy never a file.
//
//   saving:   strategyState(strategy, ...)              its stream and counters, for save() or an
//                                                        AsyncSaver to write (checkpoint.h)
//   loading:  loadStrategyState(strategy, reader, b)    from a checkpoint, state every rank holds
//                                                        whole read once over the ranks
//             loadStrategyState(strategy, source)       from an exported model (parameters only)
//
// Thread-safety: one training thread; loading is a collective.

#include <cstdint>

#include "runtime/comm/backend.h"
#include "runtime/env.h"  // StateDictType
#include "runtime/state_view.h"
#include "tensorfile/manifest.h"
#include "tensorfile/reader.h"

namespace cxxlaunch::runtime {
class Strategy;
}  // namespace cxxlaunch::runtime

namespace cxxlaunch::runtime::checkpoint {

// What a save writes of the strategy: this rank's state in the layout `type` asks for (frozen
// parameters left out unless `with_frozen`), and the strategy's counters beside the job's
// `optimizer_steps`.
struct StrategyState {
  StateStream stream;
  tensorfile::Counters counters;
};
StrategyState strategyState(Strategy& strategy, StateDictType type, bool with_frozen,
                            int64_t optimizer_steps);

// Fills the strategy's parameters and optimizer state; throws the first read that failed, once
// every rank finished the load's collectives. The checkpoint's corruption (a chunk that failed
// its checksum) is the reader's to tell, after this returns.
void loadStrategyState(Strategy& strategy, const tensorfile::Reader& reader, Backend& backend);
void loadStrategyState(Strategy& strategy, const tensorfile::Source& source);

}  // namespace cxxlaunch::runtime::checkpoint
