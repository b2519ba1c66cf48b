// DeepSpeed's hostfile and filters (launcher/hostfile.h), the command each host runs
// (launcher/remote.h), and how flags and accelerate's keys become the hostfile start.

#include "launcher/hostfile.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "launcher/cli.h"
#include "launcher/remote.h"
#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::run;
using cxxlaunch::testing::TempDir;

namespace {

std::string describe(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const auto& h : hosts) {
    out += (out.empty() ? "" : " ") + h.host + ":";
    for (size_t i = 0; i < h.slots.size(); ++i) out += (i ? "," : "") + std::to_string(h.slots[i]);
  }
  return out;
}

const char* kHosts =
    "# the cluster\n"
    "worker-0 slots=4\n"
    "\n"
    "  worker-1   slots=2   # trailing comment\n"
    "worker-2 slots=1\n";

HostInfo plainHost() {
  HostInfo h;
  h.cpus = 4;
  h.path = "/usr/bin:/bin";
  return h;
}

}  // namespace

TEST_CASE("Hostfiles parse as DeepSpeed writes them", "[hostfile]") {
  CHECK(describe(parseHostfile(kHosts, "hosts")) == "worker-0:0,1,2,3 worker-1:0,1 worker-2:0");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"worker-0\n", "hosts:1: 'worker-0' is not 'HOST slots=N'"},
      {"a slots=2\nb slots=0\n", "hosts:2: 'b slots=0' is not"},
      {"a slots=x\n", "is not 'HOST slots=N'"},
      {"a slot=2\n", "is not 'HOST slots=N'"},
      {"a slots=2 extra\n", "is not 'HOST slots=N'"},
      {"-oProxyCommand=x slots=1\n", "is not 'HOST slots=N'"},
      {"a slots=2\n# c\na slots=1\n", "hosts:3: host 'a' is listed twice"},
      {"# nothing\n\n", "hosts: no host in the hostfile"},
  };
  for (const auto& [text, why] : bad) {
    INFO(text);
    CHECK_THROWS_WITH(parseHostfile(text, "hosts"), Catch::Contains(why));
  }
  CHECK_THROWS_WITH(readHostfile("/nonexistent/hosts"), Catch::Contains("is not a file"));
}

TEST_CASE("Filters (include, exclude, num_nodes, num_gpus) pick hosts and slots", "[hostfile]") {
  const auto hosts = parseHostfile(kHosts, "hosts");
  auto pick = [&](HostFilter f) { return describe(filterHosts(hosts, f)); };
  CHECK(pick({}) == "worker-0:0,1,2,3 worker-1:0,1 worker-2:0");
  CHECK(pick({"worker-0:0,2@worker-2", "", 0, 0}) == "worker-0:0,2 worker-2:0");
  CHECK(pick({"worker-2@worker-0:3", "", 0, 0}) == "worker-0:3 worker-2:0");  // file order
  CHECK(pick({"", "worker-1", 0, 0}) == "worker-0:0,1,2,3 worker-2:0");
  CHECK(pick({"", "worker-0:0,1@worker-2:0", 0, 0}) == "worker-0:2,3 worker-1:0,1");
  CHECK(pick({"", "", 2, 0}) == "worker-0:0,1,2,3 worker-1:0,1");
  CHECK(pick({"", "", 0, 1}) == "worker-0:0 worker-1:0 worker-2:0");
  CHECK(pick({"", "", 2, 2}) == "worker-0:0,1 worker-1:0,1");
  const std::vector<std::pair<HostFilter, std::string>> bad = {
      {{"worker-9", "", 0, 0}, "--include: host 'worker-9' is not in the hostfile"},
      {{"worker-1:2", "", 0, 0}, "--include: host 'worker-1' has no slot 2 (it has 2)"},
      {{"worker-1:x", "", 0, 0}, "include"},
      {{"@worker-1", "", 0, 0}, "HOST[:SLOT,...] specs joined by '@'"},
      {{"worker-1", "worker-2", 0, 0}, "--include and --exclude go one at a time"},
      {{"worker-1", "", 1, 0}, "do not go with --include or --exclude"},
      {{"", "worker-0@worker-1@worker-2", 0, 0}, "--exclude leaves no host"},
      {{"", "", 4, 0}, "--num_nodes 4: the hostfile has 3 hosts"},
      {{"", "", 0, 2}, "--num_gpus 2: host 'worker-2' has 1 slots"},
  };
  for (const auto& [filter, why] : bad) {
    INFO(why);
    CHECK_THROWS_WITH(filterHosts(hosts, filter), Catch::Contains(why));
  }
}

TEST_CASE("Each host's command is one sh script that survives the login shell's quoting",
          "[hostfile]") {
  CHECK(shellQuote("it's") == "'it'\\''s'");
  RemoteLaunch r;
  r.hosts = {{"a", {0, 1}}, {"b", {1, 3}}};
  r.endpoint = "a:29500";
  r.run_id = "job";
  r.launcher = "/opt/cx/bin/cxxlaunch";
  r.cwd = "/home/u/my job";
  r.flags = {"--max_restarts=1"};
  r.env = {{"CXXLAUNCH_HOSTFILE", ""}, {"NCCL_DEBUG", "INFO"}};
  r.command = {"/bin/echo", "it's", "${local_rank}", "$HOME"};
  const std::string first = remoteCommand(r, 0), second = remoteCommand(r, 1);
  CHECK_THAT(first, Catch::StartsWith("sh -c '"));
  CHECK_THAT(first, Catch::Contains("'\\''--node_rank=0'\\''") && Catch::Contains("is_host=1") &&
                        Catch::Contains("--nproc_per_node=2") && !Catch::Contains("--gpus"));
  // Slots other than the first N name the devices.
  CHECK_THAT(second, Catch::Contains("--node_rank=1") && Catch::Contains("is_host=0") &&
                         Catch::Contains("--gpus=1,3"));
  // What the login shell hands to sh: the script, each word of the agent's command intact.
  const std::string script = run({"/bin/sh", "-c", "printf %s " + first.substr(6)}).out;
  CHECK_THAT(script, Catch::StartsWith("cd '/home/u/my job' || exit 1\n"));
  const std::string exec = script.substr(script.find("exec env"));
  const auto words =
      run({"/bin/sh", "-c", "printf '%s\\n' " + exec.substr(5, exec.find(" </dev/null") - 5)}).out;
  CHECK(words ==
        "env\nCXXLAUNCH_HOSTFILE=\nNCCL_DEBUG=INFO\n/opt/cx/bin/cxxlaunch\nrun\n"
        "--use_cluster_env=false\n--nnodes=2\n--node_rank=0\n--rdzv_backend=static\n"
        "--rdzv_endpoint=a:29500\n--rdzv_id=job\n--max_restarts=1\n--rdzv_conf=is_host=1\n"
        "--nproc_per_node=2\n--\n/bin/echo\nit's\n${local_rank}\n$HOME\n");
}

TEST_CASE("The hostfile flags and accelerate's deepspeed_* keys plan the start", "[hostfile]") {
  TempDir dir;
  const std::string hosts = dir.path() + "/hosts";
  std::ofstream(hosts) << kHosts;
  const LaunchOptions o = parseRunArgs(
      {"--hostfile", hosts, "--exclude=worker-1", "--ssh_opts", "-p 2222  -i key",
       "--max_restarts=2", "--nproc_per_node=7", "--rdzv_id=j1", "--cpu", "/bin/echo", "hi"},
      plainHost());
  REQUIRE(o.remote);
  const RemoteLaunch& r = *o.remote;
  CHECK(describe(r.hosts) == "worker-0:0,1,2,3 worker-2:0");
  CHECK(r.ssh == std::vector<std::string>{"ssh", "-p", "2222", "-i", "key"});
  CHECK(r.endpoint == "worker-0:29500");
  CHECK(r.run_id == "j1");
  // The user's flags go on, but for those the start sets per host.
  CHECK(r.flags == std::vector<std::string>{"--max_restarts=2", "--cpu"});
  CHECK(r.command == std::vector<std::string>{"/bin/echo", "hi"});
  CHECK(r.env.at("CXXLAUNCH_HOSTFILE").empty());
  CHECK(parseRunArgs(
            {"--hostfile", hosts, "--rdzv_endpoint=ctl:7000", "--main_process_port=1", "/bin/true"},
            plainHost())
            .remote->endpoint == "ctl:7000");
  CHECK(
      parseRunArgs({"--hostfile", hosts, "--main_process_port=31000", "--num_nodes=1", "/bin/true"},
                   plainHost())
          .remote->endpoint == "worker-0:31000");

  // accelerate's file: the hostfile counts with num_machines > 1 and the pdsh launcher.
  auto config = [&](const std::string& text) {
    const std::string path = dir.path() + "/c.yaml";
    std::ofstream(path) << text;
    return path;
  };
  const std::string ds =
      "distributed_type: DEEPSPEED\nnum_machines: 2\nmain_process_ip: worker-0\n"
      "deepspeed_config:\n  deepspeed_hostfile: " +
      hosts + "\n  deepspeed_inclusion_filter: worker-1@worker-2:0\n";
  const LaunchOptions a = parseRunArgs({"--config_file", config(ds), "/bin/true"}, plainHost());
  REQUIRE(a.remote);
  CHECK(describe(a.remote->hosts) == "worker-1:0,1 worker-2:0");
  CHECK(a.remote->endpoint == "worker-1:29500");
  // standard: accelerate then runs one launcher per machine, the hostfile unused.
  CHECK_FALSE(
      parseRunArgs({"--config_file", config(ds + "  deepspeed_multinode_launcher: standard\n"),
                    "--machine_rank=1", "/bin/true"},
                   plainHost())
          .remote);
  CHECK_THROWS_WITH(
      parseRunArgs(
          {"--config_file", config(ds + "  deepspeed_multinode_launcher: openmpi\n"), "/bin/true"},
          plainHost()),
      Catch::Contains("deepspeed_multinode_launcher openmpi: run mpirun -np NODES cxxlaunch run"));
  CHECK_THROWS_WITH(
      parseRunArgs(
          {"--config_file", config(ds + "  deepspeed_multinode_launcher: slurm\n"), "/bin/true"},
          plainHost()),
      Catch::Contains("run srun cxxlaunch run"));
  // One machine: accelerate does not read the hostfile, and neither do we.
  CHECK_FALSE(parseRunArgs(
                  {"--config_file",
                   config("deepspeed_config:\n  deepspeed_hostfile: " + hosts + "\n"), "/bin/true"},
                  plainHost())
                  .remote);
  CHECK_THROWS_WITH(parseRunArgs({"--hostfile", dir.path() + "/none", "/bin/true"}, plainHost()),
                    Catch::Contains("--hostfile: '" + dir.path() + "/none' is not a file"));
}
