// Slurm's hostlists and the cluster pickup (launcher/hostlist.h, launcher/cluster_env.h): which
// variable sets which setting, and that flags and CXXLAUNCH_* variables still win.

#include <catch2/catch.hpp>
#include <map>

#include "common/error.h"
#include "launcher/cli.h"
#include "launcher/cluster_env.h"
#include "launcher/hostlist.h"

using namespace cxxlaunch::launcher;
using Hosts = std::vector<std::string>;
using Vars = std::map<std::string, std::string>;

namespace {

ClusterEnv pickup(const Vars& vars) {
  return detectCluster([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string setting(const ClusterEnv& env, const std::string& key) {
  for (const auto& s : env.settings) {
    if (s.key == key) return s.value + " from " + s.flag;
  }
  return "unset";
}

HostInfo hostUnder(const Vars& vars, std::map<std::string, std::string> cxx_env = {}) {
  HostInfo h;
  h.cpus = 8;
  h.path = "/usr/bin:/bin";
  h.env = std::move(cxx_env);
  h.cluster = pickup(vars);
  if (h.cluster.cpus > 0) h.cpus = h.cluster.cpus;
  return h;
}

const Vars kSrunStep = {{"SLURM_JOB_ID", "4242"},
                        {"SLURM_STEP_ID", "1"},
                        {"SLURM_NNODES", "4"},
                        {"SLURM_STEP_NUM_NODES", "4"},
                        {"SLURM_STEP_NUM_TASKS", "4"},
                        {"SLURM_NODEID", "2"},
                        {"SLURM_JOB_NODELIST", "gpu[01-04]"},
                        {"SLURM_STEP_NODELIST", "gpu[01-03,07]"},
                        {"SLURM_GPUS_ON_NODE", "8"},
                        {"SLURM_CPUS_ON_NODE", "32"}};

}  // namespace

TEST_CASE("Slurm hostlists expand ranges, padding, lists and several bracket groups",
          "[cluster][hostlist]") {
  CHECK(expandHostlist("node7") == Hosts{"node7"});
  CHECK(expandHostlist("a,b,c") == Hosts{"a", "b", "c"});
  CHECK(expandHostlist("gpu[01-04,07],cpu-a[1-2]") ==
        Hosts{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu-a1", "cpu-a2"});
  CHECK(expandHostlist("n[8-10]") == Hosts{"n8", "n9", "n10"});     // width of the low bound
  CHECK(expandHostlist("n[08-10]") == Hosts{"n08", "n09", "n10"});  // zero padding kept
  CHECK(expandHostlist("n[001-002]") == Hosts{"n001", "n002"});
  CHECK(expandHostlist("n[3]") == Hosts{"n3"});
  CHECK(expandHostlist("r[1-2]n[1-2]") == Hosts{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(expandHostlist("rack[1-2]-gpu[09-10].example.org") ==
        Hosts{"rack1-gpu09.example.org", "rack1-gpu10.example.org", "rack2-gpu09.example.org",
              "rack2-gpu10.example.org"});
  CHECK(expandHostlist("127.0.0.[1-2]") == Hosts{"127.0.0.1", "127.0.0.2"});
  CHECK(expandHostlist("[1-2]x") == Hosts{"1x", "2x"});
}

TEST_CASE("Malformed Slurm hostlists are refused with one clear line", "[cluster][hostlist]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "it is empty"},
      {"gpu[01-04", "a '[' without its ']'"},
      {"gpu01-04]", "a ']' without its '['"},
      {"a,,b", "an empty host name"},
      {"a,", "an empty host name"},
      {"gpu[04-01]", "ends below its start"},
      {"gpu[a-b]", "not a number or a range"},
      {"gpu[]", "not a number or a range"},
      {"gpu[1,,2]", "not a number or a range"},
      {"gpu[1-2-3]", "not a number or a range"},
      {"gpu[1[2]]", "brackets inside brackets"},
      {"gpu 1", "a space or control character"},
      {"n[0-99999999]", "more than"},
      {"a[0-1023]b[0-1023]c[0-1]", "more than"},
  };
  for (const auto& [list, why] : cases) {
    INFO(list);
    try {
      expandHostlist(list);
      FAIL("accepted");
    } catch (const cxxlaunch::InvalidArgument& e) {
      const std::string message = e.what();
      CHECK_THAT(message, Catch::Contains(why));
      CHECK_THAT(message, Catch::StartsWith("malformed Slurm hostlist '" + list + "'"));
      CHECK(message.find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("No cluster variables: no pickup", "[cluster]") {
  const ClusterEnv env = pickup({{"PATH", "/bin"}, {"MASTER_ADDR", "10.0.0.1"}});
  CHECK(env.source.empty());
  CHECK(env.settings.empty());
  CHECK(env.error.empty());
}

TEST_CASE("srun: nodes, node rank, first host, run id and GPUs from Slurm's variables",
          "[cluster][slurm]") {
  const ClusterEnv env = pickup(kSrunStep);
  REQUIRE(env.error.empty());
  CHECK(env.source == "Slurm");
  CHECK(setting(env, "num_machines") == "4 from SLURM_STEP_NUM_NODES");
  CHECK(setting(env, "machine_rank") == "2 from SLURM_NODEID");
  CHECK(setting(env, "main_process_ip") == "gpu01 from SLURM_STEP_NODELIST");
  CHECK(setting(env, "main_process_port") == "unset");  // the config's default: 29500
  CHECK(setting(env, "cxxlaunch.rdzv_id") == "slurm-4242.1 from SLURM_JOB_ID");
  CHECK(setting(env, "num_processes") == "32 from SLURM_GPUS_ON_NODE");
  CHECK(env.cpus == 32);

  const LaunchOptions o = parseRunArgs({"/bin/true"}, hostUnder(kSrunStep));
  CHECK(o.rdzv.min_nodes == 4);
  CHECK(o.rdzv.max_nodes == 4);
  CHECK(o.rdzv.node_rank == 2);
  CHECK(o.rdzv.backend == "static");
  CHECK(o.rdzv.endpoint == "gpu01:29500");
  CHECK(o.run_id == "slurm-4242.1");
  CHECK(o.nproc_per_node == 8);
  CHECK(parseRunArgs({"--nproc_per_node=cpu", "/bin/true"}, hostUnder(kSrunStep)).nproc_per_node ==
        32);
}

TEST_CASE("Flags, CXXLAUNCH_* and MASTER_ADDR/PORT win over Slurm's variables",
          "[cluster][slurm]") {
  Vars vars = kSrunStep;
  const LaunchOptions f = parseRunArgs({"--nnodes=2", "--node_rank=1", "--rdzv_endpoint=ctl:1234",
                                        "--rdzv_id=mine", "--nproc_per_node=3", "/bin/true"},
                                       hostUnder(vars));
  CHECK(f.rdzv.max_nodes == 2);
  CHECK(f.rdzv.node_rank == 1);
  CHECK(f.rdzv.endpoint == "ctl:1234");
  CHECK(f.run_id == "mine");
  CHECK(f.nproc_per_node == 3);
  const LaunchOptions e =
      parseRunArgs({"/bin/true"}, hostUnder(vars, {{"CXXLAUNCH_MAIN_PROCESS_PORT", "31000"},
                                                   {"CXXLAUNCH_NUM_PROCESSES", "8"},
                                                   {"CXXLAUNCH_RDZV_ID", "env-id"}}));
  CHECK(e.rdzv.endpoint == "gpu01:31000");
  CHECK(e.nproc_per_node == 2);  // num_processes is the whole job's: 8 over 4 nodes
  CHECK(e.run_id == "env-id");
  vars["MASTER_ADDR"] = "10.1.2.3";
  vars["MASTER_PORT"] = "29999";
  CHECK(parseRunArgs({"/bin/true"}, hostUnder(vars)).rdzv.endpoint == "10.1.2.3:29999");
  // Turned off, the allocation means nothing to the launcher.
  const LaunchOptions off = parseRunArgs({"--use_cluster_env=false", "/bin/true"}, hostUnder(vars));
  CHECK(off.rdzv.max_nodes == 1);
  CHECK(off.nproc_per_node == 1);
  CHECK(parseRunArgs({"/bin/true"}, hostUnder(vars, {{"CXXLAUNCH_USE_CLUSTER_ENV", "false"}}))
            .rdzv.max_nodes == 1);
}

TEST_CASE("A one-node allocation's batch script launches, a multi-node one must use srun",
          "[cluster][slurm]") {
  const Vars batch1 = {{"SLURM_JOB_ID", "9"},
                       {"SLURM_NNODES", "1"},
                       {"SLURM_NODEID", "0"},
                       {"SLURM_JOB_NODELIST", "gpu07"},
                       {"SLURM_GPUS_ON_NODE", "4"}};
  const LaunchOptions o = parseRunArgs({"/bin/true"}, hostUnder(batch1));
  CHECK(o.rdzv.max_nodes == 1);
  CHECK(o.rdzv.endpoint.empty());
  CHECK(o.nproc_per_node == 4);
  CHECK(o.run_id == "slurm-9");
  Vars batch4 = batch1;
  batch4["SLURM_NNODES"] = "4";
  batch4["SLURM_JOB_NODELIST"] = "gpu[01-04]";
  CHECK_THROWS_WITH(parseRunArgs({"/bin/true"}, hostUnder(batch4)),
                    Catch::Contains("srun --ntasks-per-node=1 cxxlaunch run"));
  CHECK(parseRunArgs({"--use_cluster_env=false", "/bin/true"}, hostUnder(batch4)).rdzv.max_nodes ==
        1);
}

TEST_CASE("Contradictory or malformed Slurm variables are refused naming the variable",
          "[cluster][slurm]") {
  auto error = [](Vars vars) {
    const ClusterEnv env = pickup(vars);
    CHECK(env.error.find('\n') == std::string::npos);
    return env.error;
  };
  Vars v = kSrunStep;
  v["SLURM_STEP_NUM_TASKS"] = "8";
  CHECK_THAT(error(v), Catch::Contains("srun started 8 tasks on 4 nodes"));
  v = kSrunStep;
  v["SLURM_NODEID"] = "4";
  CHECK_THAT(error(v), Catch::Contains("SLURM_NODEID='4' is not a number from 0 to 3"));
  v = kSrunStep;
  v["SLURM_STEP_NUM_NODES"] = "x";
  CHECK_THAT(error(v), Catch::Contains("SLURM_STEP_NUM_NODES='x'"));
  v = kSrunStep;
  v["SLURM_STEP_NODELIST"] = "gpu[01-02]";
  CHECK_THAT(error(v), Catch::Contains("SLURM_STEP_NODELIST names 2 hosts but "
                                       "SLURM_STEP_NUM_NODES is 4"));
  v = kSrunStep;
  v["SLURM_STEP_NODELIST"] = "gpu[01-04";
  CHECK_THAT(error(v), Catch::Contains("SLURM_STEP_NODELIST: malformed Slurm hostlist"));
  CHECK_THROWS_WITH(parseRunArgs({"/bin/true"}, hostUnder(v)),
                    Catch::StartsWith("Slurm: SLURM_STEP_NODELIST: malformed"));
}

TEST_CASE("mpirun: each process is one node agent", "[cluster][mpi]") {
  const Vars ompi = {{"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                     {"OMPI_MCA_ess_base_jobid", "146800641"},
                     // mpirun inside an allocation: MPI's numbers win over the allocation's
                     {"SLURM_JOB_ID", "5"},
                     {"SLURM_NNODES", "3"}};
  const ClusterEnv env = pickup(ompi);
  REQUIRE(env.error.empty());
  CHECK(env.source == "Open MPI");
  CHECK(setting(env, "num_machines") == "2 from OMPI_COMM_WORLD_SIZE");
  CHECK(setting(env, "machine_rank") == "1 from OMPI_COMM_WORLD_RANK");
  CHECK(setting(env, "main_process_ip") == "127.0.0.1 from OMPI_COMM_WORLD_LOCAL_SIZE");
  CHECK(setting(env, "cxxlaunch.rdzv_id") == "mpi-146800641 from OMPI_MCA_ess_base_jobid");
  const LaunchOptions o = parseRunArgs({"--nproc_per_node=1", "/bin/true"}, hostUnder(ompi));
  CHECK(o.rdzv.max_nodes == 2);
  CHECK(o.rdzv.node_rank == 1);
  CHECK(o.rdzv.endpoint == "127.0.0.1:29500");
  CHECK(o.run_id == "mpi-146800641");

  // MPICH and Intel MPI (Hydra): PMI_RANK/PMI_SIZE, MPI_LOCALNRANKS; no job id, so the run id
  // is derived from the endpoint, the same for every rank.
  Vars pmi = {{"PMI_SIZE", "3"},        {"PMI_RANK", "0"},       {"MPI_LOCALRANKID", "0"},
              {"MPI_LOCALNRANKS", "1"}, {"MASTER_ADDR", "head"}, {"MASTER_PORT", "40000"}};
  const LaunchOptions p = parseRunArgs({"/bin/true"}, hostUnder(pmi));
  CHECK(p.rdzv.max_nodes == 3);
  CHECK(p.rdzv.node_rank == 0);
  CHECK(p.rdzv.endpoint == "head:40000");
  CHECK(p.run_id == "accelerate-head-40000");
  // Across hosts nothing says where rank 0 is.
  pmi.erase("MASTER_ADDR");
  CHECK_THAT(pickup(pmi).error, Catch::Contains("mpirun -x MASTER_ADDR="));
  pmi["PMI_RANK"] = "3";
  CHECK_THAT(pickup(pmi).error, Catch::Contains("PMI_RANK='3' is not a number from 0 to 2"));
}
