#pragma once
// Slurm's hostlist syntax, as SLURM_JOB_NODELIST and SLURM_STEP_NODELIST hold it: host
// expressions separated by commas, each a name with any number of bracket groups of numbers and
// ranges, expanded in order ("gpu[01-02,07],cpu-a[1-2]" -> gpu01 gpu02 gpu07 cpu-a1 cpu-a2;
// "r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). A range's width is its low bound's digits: "[08-10]"
// gives 08 09 10, "[8-10]" gives 8 9 10. Plain functions, no I/O, thread-safe.

#include <cstddef>
#include <string>
#include <vector>

namespace cxxlaunch::launcher {

// Hosts a list may expand to: more is refused as malformed rather than allocated.
inline constexpr size_t kMaxHostlistHosts = 1 << 20;

// The hosts `list` names, in order. Throws InvalidArgument with one line naming what is wrong
// (an unclosed '[', an empty name, a range whose end is below its start, ...).
std::vector<std::string> expandHostlist(const std::string& list);

}  // namespace cxxlaunch::launcher
