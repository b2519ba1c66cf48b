// Messages name the user guide where it is: installed beside the binary, in the source tree, or
// (neither found) by title and where an installation keeps it.

#include "launcher/doc_reference.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::TempDir;
namespace fs = std::filesystem;

TEST_CASE("A guide is named at its installed path, its source path, or by title",
          "[doc_reference]") {
  TempDir prefix;
  fs::create_directories(prefix.path() + "/bin");
  fs::create_directories(prefix.path() + "/share/doc/cxxlaunch");
  std::ofstream(prefix.path() + "/share/doc/cxxlaunch/config.md") << "# Configuration\n";
  const fs::path exe = prefix.path() + "/bin/cxxlaunch";
  const std::string source_docs = fs::path(CONFIG_DOC).parent_path().string();

  // Installed: the page beside the binary wins over a source tree.
  CHECK(docReference("config.md", "", exe, source_docs) ==
        "the config guide: " + prefix.path() + "/share/doc/cxxlaunch/config.md");
  // In-tree: no installed page, the source tree's.
  CHECK(docReference("clusters.md", "Slurm", exe, source_docs) ==
        "the clusters guide: " + source_docs + "/clusters.md, section Slurm");
  // Neither: by title, file name and the installed folder; never a path that is not there.
  CHECK(docReference("clusters.md", "MPI", exe, "") ==
        "the clusters guide (clusters.md, section MPI, in PREFIX/share/doc/cxxlaunch/ where "
        "cxxlaunch is installed)");
  CHECK(docReference("config.md", "", fs::path(), prefix.path() + "/nowhere") ==
        "the config guide (config.md, in PREFIX/share/doc/cxxlaunch/ where cxxlaunch is "
        "installed)");
}

TEST_CASE("From this in-tree binary, a guide's path is a file that exists", "[doc_reference]") {
  const std::string reference = docReference("config.md");
  const std::string prefix = "the config guide: ";
  REQUIRE_THAT(reference, Catch::StartsWith(prefix));
  const fs::path path = reference.substr(prefix.size());
  CHECK(path.is_absolute());
  CHECK(fs::equivalent(path, CONFIG_DOC));
}
