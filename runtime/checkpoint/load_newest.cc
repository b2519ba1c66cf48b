#include "runtime/checkpoint/load_newest.h"

#include <iostream>
#include <optional>
#include <vector>

#include "common/error.h"
#include "tensorfile/manifest.h"

namespace cxxlaunch::runtime::checkpoint {

std::string loadNewest(Backend& backend, const std::string& path, const LoadSteps& steps) {
  const int rank = backend.rank(), world = backend.worldSize();
  // The lowest rank for which `failed`, or -1: every rank learns whether all of them succeeded.
  auto lowestFailing = [&](bool failed) {
    int32_t lowest = failed ? rank : world;
    backend.allreduce(&lowest, 1, DType::kInt32, ReduceOp::kMin)->wait();
    return lowest == world ? -1 : lowest;
  };
  // The protocol, for each checkpoint whose files have their sizes, newest first, until one loads
  // on every rank:
  //   1. every rank opens it and checks its counters and `refuse` (format 1's files are checked
  //      against their checksums here, the ranks sharing them; formats 2 and 3 check each chunk
  //      as it is read: one pass);
  //   2. first agreement: a refusal anywhere stops the load on every rank (the older ones were
  //      trained on the same base); a rank that cannot open the files sends every rank to the
  //      next one, so that it never meets the others' collectives inside the restore;
  //   3. every rank restores from it;
  //   4. second agreement: anything wrong on any rank (a checksum, a header, a name or shape, a
  //      permission) sends every rank on to the next one, with a note from the lowest failing
  //      rank; the one loaded last overwrites whatever a failed one had restored.
  std::vector<std::string> skipped, notes;
  // The checkpoints that are not complete (a manifest damaged, missing or failing its checksum, a
  // rank file cut short) are skipped with a note: the same on every rank, said once.
  const auto candidates = tensorfile::complete(path, /*checksums=*/false, &notes);
  if (rank == 0) {
    for (const auto& note : notes) std::cerr << "cxxlaunch: note: " << note << "\n";
  }
  for (const std::string& dir : candidates) {
    std::string problem, refusal;
    std::optional<tensorfile::Reader> reader;
    try {
      reader.emplace(dir);
      reader->checkCounters(rank, world);
      refusal = steps.refuse(*reader);
      if (!reader->checksReads() && !tensorfile::verifyShare(dir, rank, world)) {
        problem = "a file does not match its checksum";
      }
    } catch (const Error& e) {
      problem = e.what();
    }
    if (const int r = lowestFailing(!refusal.empty()); r >= 0) {
      throw InvalidArgument(!refusal.empty()
                                ? refusal
                                : "rank " + std::to_string(r) + " cannot load checkpoint '" + dir +
                                      "' nor an older one (its log says why)");
    }
    int failed = lowestFailing(!problem.empty());
    if (failed < 0) {
      try {
        steps.restore(*reader);
        if (auto corruption = reader->corruption()) problem = *corruption;
      } catch (const Error& e) {  // a peer's failure to read too: the agreement below tells
        problem = e.what();
      }
      failed = lowestFailing(!problem.empty());
      if (failed < 0) return dir;
    }
    if (failed == rank) {  // one note, from the lowest rank that knows why
      // The file is to blame when it no longer matches its manifest; else it does not fit.
      const bool intact = tensorfile::verifyShare(dir, 0, 1);
      std::cerr << "cxxlaunch: checkpoint '" << dir << "' cannot be loaded on rank " << rank
                << (intact ? " (its files match their manifest): " : " (it is corrupt): ")
                << problem << "; trying the previous one\n";
    }
    skipped.push_back(
        dir + (problem.empty() ? " (rank " + std::to_string(failed) + ")" : ": " + problem));
  }
  std::string why;
  for (const auto& s : notes) why += "\n  " + s;
  for (const auto& s : skipped) why += "\n  " + s;
  throw InvalidArgument(
      skipped.empty() && notes.empty()
          ? "no complete checkpoint at '" + path +
                "' (a checkpoint directory has a manifest; a folder of them is searched for the "
                "newest complete one)"
          : "no checkpoint at '" + path + "' can be loaded; each was tried, newest first:" + why +
                "\nMove the folder away (or remove these checkpoints) to start from step 0.");
}

}  // namespace cxxlaunch::runtime::checkpoint
