// Cluster pickup and remote start against the real thing (docs/clusters.md): a one-node Slurm
// cluster (munged, slurmctld, slurmd from Debian's packages) configured and started on loopback
// in a temporary folder, Open MPI's mpirun, and sshd (hostfile_test.cc). Everything these tests
// start binds loopback on ports chosen free, and is stopped when the test ends.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "support/subprocess.h"
#include "support/worker_lines.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;
namespace fs = std::filesystem;

namespace {

std::multiset<std::string> valueSet(const std::string& out, const std::string& name) {
  auto v = values(out, name);
  return {v.begin(), v.end()};
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  REQUIRE(fs::exists(path));
}

std::string shortHostName() {
  char name[256] = {};
  REQUIRE(::gethostname(name, sizeof(name) - 1) == 0);
  std::string host(name);
  return host.substr(0, host.find('.'));
}

// A two-node Slurm cluster on this machine: munged, slurmctld and one slurmd per node in the
// foreground, each in its own process group (killed with the cluster), configured under a
// temporary folder. The nodes are cxxnode1 at 127.0.0.1 and cxxnode2 at 127.0.0.2, each slurmd
// on a port of its own (-N names the node it serves); the controller must carry this machine's
// host name (slurmctld checks).
class SlurmCluster {
 public:
  SlurmCluster() {
    const std::string d = dir_.path();
    conf_ = d + "/slurm.conf";
    REQUIRE(run({"/bin/sh", "-c",
                 "set -e; cd " + d +
                     "; mkdir state spool-cxxnode1 spool-cxxnode2; head -c 1024 /dev/urandom > "
                     "munge.key; "
                     "chmod 600 munge.key"})
                .exit_code == 0);
    const std::string socket = d + "/munge.sock";
    munged_ = std::make_unique<Subprocess>(
        Args{"/usr/sbin/munged", "--foreground", "--force", "--socket=" + socket,
             "--key-file=" + d + "/munge.key", "--pid-file=" + d + "/munged.pid",
             "--log-file=" + d + "/munged.log", "--seed-file=" + d + "/munge.seed"});
    INFO(munged_->err());
    REQUIRE(eventually([&] { return fs::exists(socket); }, 10s));
    writeFile(conf_,
              "ClusterName=cxxtest\n"
              "SlurmctldHost=" +
                  shortHostName() +
                  "(127.0.0.1)\n"
                  "SlurmctldPort=" +
                  std::to_string(freePort()) +
                  "\n"
                  "SlurmdPort=" +
                  std::to_string(freePort()) +
                  "\n"
                  "AuthType=auth/munge\nCredType=cred/munge\n"
                  "AuthInfo=socket=" +
                  socket +
                  "\n"
                  // One process group per task: what reaches the workers is what the
                  // launcher forwards.
                  "ProctrackType=proctrack/pgid\nTaskPlugin=task/none\n"
                  "SlurmUser=root\nSlurmdUser=root\n"
                  "StateSaveLocation=" +
                  d + "/state\nSlurmdSpoolDir=" + d + "/spool-%n\nSlurmctldPidFile=" + d +
                  "/slurmctld.pid\nSlurmdPidFile=" + d + "/slurmd-%n.pid\nSlurmctldLogFile=" + d +
                  "/slurmctld.log\nSlurmdLogFile=" + d +
                  "/slurmd-%n.log\n"
                  "SchedulerType=sched/builtin\nSelectType=select/cons_tres\n"
                  "SelectTypeParameters=CR_Core\nReturnToService=2\nMpiDefault=none\n"
                  "JobAcctGatherType=jobacct_gather/none\n"
                  "AccountingStorageType=accounting_storage/none\n"
                  // Slurm's own grace between SIGTERM and SIGKILL, longer than the
                  // launcher's in the tests: what ends a worker is the launcher's.
                  "KillWait=30\n"
                  // The node is what this file says, whatever this machine has.
                  "SlurmdParameters=config_overrides\n"
                  "NodeName=cxxnode1 NodeAddr=127.0.0.1 Port=" +
                  std::to_string(freePort()) +
                  " CPUs=2 State=UNKNOWN\n"
                  "NodeName=cxxnode2 NodeAddr=127.0.0.2 Port=" +
                  std::to_string(freePort()) +
                  " CPUs=2 State=UNKNOWN\n"
                  "PartitionName=debug Nodes=cxxnode[1-2] Default=YES MaxTime=INFINITE "
                  "State=UP\n");
    ctld_ =
        std::make_unique<Subprocess>(Args{"/usr/sbin/slurmctld", "-D", "-i", "-f", conf_}, env());
    for (const char* node : {"cxxnode1", "cxxnode2"}) {
      slurmds_.push_back(std::make_unique<Subprocess>(
          Args{"/usr/sbin/slurmd", "-D", "-f", conf_, "-N", node}, env()));
    }
    const bool idle = eventually(
        [&] {
          auto state = run({"/usr/bin/sinfo", "-h", "-N", "-o", "%t"}, env(), 10s);
          return state.exit_code == 0 && state.out == "idle\nidle\n";
        },
        30s);
    INFO("slurmctld: " << ctld_->err() << readFile(d + "/slurmctld.log"));
    INFO("slurmd: " << slurmds_[0]->err() << readFile(d + "/slurmd-cxxnode1.log")
                    << slurmds_[1]->err() << readFile(d + "/slurmd-cxxnode2.log"));
    REQUIRE(idle);
  }
  ~SlurmCluster() {
    // The controller first: the node daemon then has no job to start.
    ctld_.reset();
    slurmds_.clear();
    munged_.reset();
  }

  Env env() const { return {{"SLURM_CONF", conf_}}; }
  const std::string& dir() const { return dir_.path(); }

 private:
  TempDir dir_;
  std::string conf_;
  std::unique_ptr<Subprocess> munged_, ctld_;
  std::vector<std::unique_ptr<Subprocess>> slurmds_;
};

void checkTwoWorkersOfOneSlurmNode(const std::string& out) {
  CHECK(valueSet(out, "RANK") == std::multiset<std::string>{"0", "1"});
  CHECK(valueSet(out, "WORLD_SIZE") == std::multiset<std::string>{"2", "2"});
  CHECK(valueSet(out, "LOCAL_WORLD_SIZE") == std::multiset<std::string>{"2", "2"});
  CHECK(valueSet(out, "GROUP_RANK") == std::multiset<std::string>{"0", "0"});
  CHECK(valueSet(out, "GROUP_WORLD_SIZE") == std::multiset<std::string>{"1", "1"});
  CHECK(valueSet(out, "MASTER_ADDR") == std::multiset<std::string>{"127.0.0.1", "127.0.0.1"});
  // The run id is the job's and its step's.
  const auto ids = values(out, "TORCHELASTIC_RUN_ID");
  REQUIRE(ids.size() == 2);
  CHECK(ids[0] == ids[1]);
  CHECK(std::regex_match(ids[0], std::regex("slurm-[0-9]+\\.0")));
}

Env twoNodeEnv(const SlurmCluster& slurm) {
  Env env = slurm.env();
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(freePort());
  env["CXXLAUNCH_JOIN_TIMEOUT"] = "60";
  return env;
}

void checkFourWorkersOfTwoSlurmNodes(const std::string& out) {
  CHECK(valueSet(out, "RANK") == std::multiset<std::string>{"0", "1", "2", "3"});
  CHECK(valueSet(out, "WORLD_SIZE") == std::multiset<std::string>{"4", "4", "4", "4"});
  CHECK(valueSet(out, "LOCAL_WORLD_SIZE") == std::multiset<std::string>{"2", "2", "2", "2"});
  CHECK(valueSet(out, "GROUP_RANK") == std::multiset<std::string>{"0", "0", "1", "1"});
  CHECK(valueSet(out, "GROUP_WORLD_SIZE") == std::multiset<std::string>{"2", "2", "2", "2"});
  CHECK(valueSet(out, "MASTER_ADDR") ==
        std::multiset<std::string>{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1"});
  const auto ids = values(out, "TORCHELASTIC_RUN_ID");
  REQUIRE(ids.size() == 4);
  CHECK(std::set<std::string>(ids.begin(), ids.end()).size() == 1);
  CHECK(std::regex_match(ids[0], std::regex("slurm-[0-9]+\\.0")));
}

}  // namespace

TEST_CASE("Under a real two-node Slurm, srun and an sbatch script give workers the job's place",
          "[clusters][slurm][integration]") {
  SlurmCluster slurm;
  // srun on one node: one launcher (one task), two workers; nothing else needed.
  const Finished r = run({"/usr/bin/srun", "-N1", "-n1", "-J", "envjob", CXXLAUNCH_BIN, "run",
                          "--nproc_per_node=2", TEST_WORKER, "env"},
                         slurm.env(), 60s);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  checkTwoWorkersOfOneSlurmNode(r.out);

  // Both nodes, one launcher each. The test's node names have no address (DNS): MASTER_ADDR
  // names the first one's, as a site without DNS for its nodes would.
  const Env both = twoNodeEnv(slurm);
  const Finished n = run({"/usr/bin/srun", "-N2", "--ntasks-per-node=1", "-J", "envjob2",
                          CXXLAUNCH_BIN, "run", "--nproc_per_node=2", TEST_WORKER, "env"},
                         both, 90s);
  INFO(n.out << n.err);
  REQUIRE(n.exit_code == 0);
  checkFourWorkersOfTwoSlurmNodes(n.out);

  // docs/clusters.md's sbatch script, as it is written there (one launcher per node); sbatch
  // passes the submitting environment on, MASTER_ADDR too.
  const std::string script = slurm.dir() + "/train.sbatch", out = slurm.dir() + "/train.out";
  writeFile(script, std::string("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n") +
                        "srun " + CXXLAUNCH_BIN + " run --nproc_per_node=2 " + TEST_WORKER +
                        " env\n");
  const Finished b = run({"/usr/bin/sbatch", "--wait", "-o", out, script}, both, 90s);
  INFO(b.out << b.err << readFile(out));
  REQUIRE(b.exit_code == 0);
  checkFourWorkersOfTwoSlurmNodes(readFile(out));
}

TEST_CASE("scancel --signal=USR1 reaches the workers, SIGTERM stops them within our grace",
          "[clusters][slurm][integration]") {
  SlurmCluster slurm;
  // Two nodes, two workers each. Rank 1 ignores SIGTERM: the launcher's grace (1 s here,
  // Slurm's KillWait is 30 s) ends it.
  Subprocess job({"/usr/bin/srun", "-N2", "--ntasks-per-node=1", "-J", "sigjob", CXXLAUNCH_BIN,
                  "run", "--nproc_per_node=2", "--shutdown_grace=1", TEST_WORKER, "trap", "rank",
                  "1", "ignore-term", "rank", "all", "print", "ready", "wait"},
                 twoNodeEnv(slurm));
  const bool ready = eventually([&] { return count(job.out(), "ready") == 4; }, 60s);
  INFO(job.out() << job.err());
  REQUIRE(ready);
  REQUIRE(run({"/usr/bin/scancel", "--signal=USR1", "--name=sigjob"}, slurm.env()).exit_code == 0);
  CHECK(eventually([&] { return count(job.out(), "got SIGUSR1") == 4; }, 20s));
  sleepFor(500ms);
  CHECK(count(job.out(), "got SIGUSR1") == 4);  // once each: the job goes on
  CHECK(count(job.out(), "ready") == 4);
  const auto cancelled = std::chrono::steady_clock::now();
  REQUIRE(run({"/usr/bin/scancel", "--name=sigjob"}, slurm.env()).exit_code == 0);
  const auto finished = job.wait(40s);
  REQUIRE(finished);
  const auto took = std::chrono::steady_clock::now() - cancelled;
  INFO(finished->out << finished->err);
  CHECK(finished->exit_code != 0);
  for (const char* rank : {"[rank 0:0]", "[rank 1:2]", "[rank 1:3]"}) {
    CHECK(count(finished->out, std::string(rank) + ": got SIGTERM") == 1);
  }
  CHECK(count(finished->out, "[rank 0:1]: got SIGTERM") == 0);  // ignored: killed after 1 s
  CHECK(count(finished->err, "received SIGTERM, stopping 2 workers") == 2);
  CHECK(took < 15s);  // the launcher's grace, not Slurm's KillWait
}

TEST_CASE("Two launchers under a faked two-node srun step form one world",
          "[clusters][slurm][integration]") {
  // What srun gives each node of a two-node step whose hosts have addresses for names
  // (127.0.0.[1-2]): the rendezvous is the first host of SLURM_STEP_NODELIST, no MASTER_ADDR.
  std::multiset<std::string> ranks;
  std::set<std::string> ids, masters;
  for (int attempt = 0; attempt < 3 && ranks.empty(); ++attempt) {
    const std::string port = std::to_string(freePort());
    std::vector<std::unique_ptr<Subprocess>> nodes;
    for (int n = 0; n < 2; ++n) {
      nodes.push_back(std::make_unique<Subprocess>(
          Args{CXXLAUNCH_BIN, "run", "--nproc_per_node=1", TEST_WORKER, "env"},
          Env{{"SLURM_JOB_ID", "321"},
              {"SLURM_STEP_ID", "4"},
              {"SLURM_NNODES", "2"},
              {"SLURM_STEP_NUM_NODES", "2"},
              {"SLURM_STEP_NUM_TASKS", "2"},
              {"SLURM_NODEID", std::to_string(n)},
              {"SLURM_JOB_NODELIST", "127.0.0.[1-2]"},
              {"SLURM_STEP_NODELIST", "127.0.0.[1-2]"},
              {"CXXLAUNCH_MAIN_PROCESS_PORT", port},
              {"CXXLAUNCH_KEEP_ALIVE_INTERVAL", "0.3"},
              {"CXXLAUNCH_KEEP_ALIVE_MAX_MISSES", "7"},
              {"CXXLAUNCH_JOIN_TIMEOUT", "60"}}));
    }
    std::vector<Finished> done;
    for (auto& node : nodes) {
      auto f = node->wait(90s);
      REQUIRE(f);
      done.push_back(*f);
    }
    if (done[0].exit_code != 0 && done[0].err.find("cannot listen") != std::string::npos) continue;
    for (const auto& f : done) {
      INFO(f.out << f.err);
      REQUIRE(f.exit_code == 0);
      for (const auto& v : values(f.out, "RANK")) ranks.insert(v);
      CHECK(values(f.out, "WORLD_SIZE") == std::vector<std::string>{"2"});
      for (const auto& v : values(f.out, "TORCHELASTIC_RUN_ID")) ids.insert(v);
      for (const auto& v : values(f.out, "MASTER_ADDR")) masters.insert(v);
    }
    CHECK(values(done[1].out, "GROUP_RANK") == std::vector<std::string>{"1"});
  }
  CHECK(ranks == std::multiset<std::string>{"0", "1"});
  CHECK(ids == std::set<std::string>{"slurm-321.4"});
  CHECK(masters == std::set<std::string>{"127.0.0.1"});
}

namespace {

Args mpirun(const std::string& port, const Args& command) {
  Args argv = {"/usr/bin/mpirun",
               "-np",
               "2",
               "--oversubscribe",
               "--allow-run-as-root",
               "-x",
               "CXXLAUNCH_MAIN_PROCESS_PORT=" + port,
               "-x",
               "CXXLAUNCH_JOIN_TIMEOUT=60",
               "-x",
               "CXXLAUNCH_KEEP_ALIVE_INTERVAL=0.3",
               "-x",
               "CXXLAUNCH_KEEP_ALIVE_MAX_MISSES=7",
               CXXLAUNCH_BIN,
               "run",
               "--nproc_per_node=1"};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::vector<float> floats(const std::string& path) {
  const std::string bytes = readFile(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

const Args kGpt = {"--model",   "gpt", "--steps",  "6", "--batch_size", "4", "--seq_len",     "16",
                   "--d_model", "32",  "--layers", "2", "--heads",      "2", "--print_every", "3"};

}  // namespace

TEST_CASE("mpirun -np 2 starts two launchers that form one world and train as one",
          "[clusters][mpi][integration]") {
  const Finished r = run(mpirun(std::to_string(freePort()), {TEST_WORKER, "env"}), {}, 90s);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(valueSet(r.out, "RANK") == std::multiset<std::string>{"0", "1"});
  CHECK(valueSet(r.out, "WORLD_SIZE") == std::multiset<std::string>{"2", "2"});
  CHECK(valueSet(r.out, "GROUP_RANK") == std::multiset<std::string>{"0", "1"});
  const auto ids = values(r.out, "TORCHELASTIC_RUN_ID");
  REQUIRE(ids.size() == 2);
  CHECK(ids[0] == ids[1]);
  CHECK(ids[0].starts_with("mpi-"));

  // The example trainer: two mpirun processes of one worker each end where one launcher with
  // two workers ends.
  TempDir dir;
  Args train = {TRAIN_BIN};
  train.insert(train.end(), kGpt.begin(), kGpt.end());
  Args over_mpi = train, local = train;
  over_mpi.insert(over_mpi.end(), {"--dump_params", dir.path() + "/mpi.bin"});
  local.insert(local.end(), {"--dump_params", dir.path() + "/local.bin"});
  const Finished m = run(mpirun(std::to_string(freePort()), over_mpi), {}, 180s);
  INFO(m.out << m.err);
  REQUIRE(m.exit_code == 0);
  CHECK_THAT(m.out, Catch::Contains("on 2 process(es)"));
  Args one = {CXXLAUNCH_BIN, "run", "--nproc_per_node=2"};
  one.insert(one.end(), local.begin(), local.end());
  const Finished l = run(one, {}, 180s);
  INFO(l.out << l.err);
  REQUIRE(l.exit_code == 0);
  const auto a = floats(dir.path() + "/mpi.bin"), b = floats(dir.path() + "/local.bin");
  REQUIRE(!a.empty());
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  CHECK(diff / scale < 1e-6);
}

namespace {

// sshd on 127.0.0.1 and 127.0.0.2 (two "hosts"), a free port, a throw-away host key and user
// key, root logins allowed: what `--hostfile` needs of a cluster. The privilege separation
// folder sshd insists on (/run/sshd) is made when missing.
class Sshd {
 public:
  Sshd() : port_(freePort()) {
    const std::string d = dir_.path();
    REQUIRE(run({"/bin/sh", "-c",
                 "set -e; mkdir -p /run/sshd; cd " + d +
                     "; ssh-keygen -q -t ed25519 -N '' -f host_key; "
                     "ssh-keygen -q -t ed25519 -N '' -f id_key; cp id_key.pub authorized_keys"})
                .exit_code == 0);
    writeFile(d + "/sshd_config", "Port " + std::to_string(port_) +
                                      "\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\n"
                                      "HostKey " +
                                      d + "/host_key\nPidFile " + d +
                                      "/sshd.pid\nAuthorizedKeysFile " + d +
                                      "/authorized_keys\nPermitRootLogin yes\nStrictModes no\n"
                                      "PasswordAuthentication no\n"
                                      "KbdInteractiveAuthentication no\nUsePAM no\n");
    sshd_ =
        std::make_unique<Subprocess>(Args{"/usr/sbin/sshd", "-f", d + "/sshd_config", "-D", "-e"});
    const bool up = eventually(
        [&] {
          Args ssh = {"/usr/bin/ssh"};
          for (const auto& o : optionWords()) ssh.push_back(o);
          ssh.insert(ssh.end(), {"-o", "BatchMode=yes", "127.0.0.2", "true"});
          return run(ssh, {}, 20s).exit_code == 0;
        },
        20s);
    INFO(sshd_->err());
    REQUIRE(up);
  }

  std::vector<std::string> optionWords() const {
    return {"-F", "/dev/null",
            "-p", std::to_string(port_),
            "-i", dir_.path() + "/id_key",
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR"};
  }
  std::string options() const {
    std::string text;
    for (const auto& o : optionWords()) text += (text.empty() ? "" : " ") + o;
    return text;
  }
  const std::string& dir() const { return dir_.path(); }

 private:
  TempDir dir_;
  int port_;
  std::unique_ptr<Subprocess> sshd_;
};

// HOST: [rank NODE:RANK]: NAME=value lines, as (host, value).
std::multiset<std::pair<std::string, std::string>> hostValues(const std::string& out,
                                                              const std::string& name) {
  std::multiset<std::pair<std::string, std::string>> found;
  std::istringstream in(out);
  const std::regex line("^(\\S+): \\[rank \\d+:\\d+\\]: " + name + "=(.*)$");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_match(l, m, line)) found.insert({m[1], m[2]});
  }
  return found;
}

// Processes whose command line holds `marker`, but for this one.
std::vector<std::string> processesWith(const std::string& marker) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (pid == std::to_string(::getpid())) continue;
    std::string cmdline = readFile(entry.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(marker) != std::string::npos) found.push_back(pid + " " + cmdline);
  }
  return found;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  return text;
}

Args hostfileRun(const Sshd& sshd, const std::string& hostfile, const Args& flags,
                 const Args& steps) {
  Args argv = {
      CXXLAUNCH_BIN,         "run",
      "--hostfile",          hostfile,
      "--ssh_opts",          sshd.options(),
      "--main_process_port", std::to_string(freePort()),
      "--rdzv_conf",         "keep_alive_interval=0.3,keep_alive_max_misses=7,join_timeout=60"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(TEST_WORKER);
  argv.insert(argv.end(), steps.begin(), steps.end());
  return argv;
}

}  // namespace

TEST_CASE("A hostfile start runs one agent per host over ssh: one world on 127.0.0.1 and 127.0.0.2",
          "[clusters][hostfile][integration]") {
  Sshd sshd;
  const std::string hostfile = sshd.dir() + "/hosts";
  writeFile(hostfile,
            "# two hosts, DeepSpeed's format\n127.0.0.1 slots=2\n\n127.0.0.2 slots=1  # the "
            "second\n");
  const Finished r = run(hostfileRun(sshd, hostfile, {}, {"env"}), {}, 90s);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  using P = std::pair<std::string, std::string>;
  CHECK(hostValues(r.out, "RANK") ==
        std::multiset<P>{{"127.0.0.1", "0"}, {"127.0.0.1", "1"}, {"127.0.0.2", "2"}});
  CHECK(hostValues(r.out, "WORLD_SIZE") ==
        std::multiset<P>{{"127.0.0.1", "3"}, {"127.0.0.1", "3"}, {"127.0.0.2", "3"}});
  CHECK(hostValues(r.out, "GROUP_RANK") ==
        std::multiset<P>{{"127.0.0.1", "0"}, {"127.0.0.1", "0"}, {"127.0.0.2", "1"}});

  // --include: one slot of the first host (slot 1: the agent is told --gpus 1), all of the
  // second.
  const Finished f =
      run(hostfileRun(sshd, hostfile, {"--include", "127.0.0.1:1@127.0.0.2"}, {"env"}), {}, 90s);
  INFO(f.out << f.err);
  REQUIRE(f.exit_code == 0);
  CHECK(hostValues(f.out, "RANK") == std::multiset<P>{{"127.0.0.1", "0"}, {"127.0.0.2", "1"}});
  CHECK(hostValues(f.out, "WORLD_SIZE") ==
        std::multiset<P>{{"127.0.0.1", "2"}, {"127.0.0.2", "2"}});
}

TEST_CASE("A hostfile start names a host it cannot reach or that fails, and stops the others",
          "[clusters][hostfile][integration]") {
  Sshd sshd;
  const std::string hostfile = sshd.dir() + "/hosts";
  // Nothing listens on 127.0.0.3.
  writeFile(hostfile, "127.0.0.1 slots=1\n127.0.0.2 slots=1\n127.0.0.3 slots=1\n");
  const std::string marker = "unreachable-" + std::to_string(::getpid());
  const auto started = std::chrono::steady_clock::now();
  const Finished r =
      run(hostfileRun(sshd, hostfile, {}, {"print", marker, "sleep", "60"}), {}, 90s);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 255);
  CHECK_THAT(r.err, Catch::Contains("host 127.0.0.3 (node 2) could not be reached"));
  CHECK(std::chrono::steady_clock::now() - started < 30s);  // not the join timeout
  const bool none_left = eventually([&] { return processesWith(marker).empty(); }, 10s);
  INFO(joined(processesWith(marker)));
  CHECK(none_left);

  // A worker that fails: every host ends with the job's root cause, its exit code is ours.
  writeFile(hostfile, "127.0.0.1 slots=1\n127.0.0.2 slots=1\n");
  const Finished f =
      run(hostfileRun(sshd, hostfile, {}, {"rank", "1", "exit", "3", "rank", "all", "sleep", "30"}),
          {}, 90s);
  INFO(f.out << f.err);
  CHECK(f.exit_code == 3);
  CHECK_THAT(f.err, Catch::Contains("failed first, with exit code 3"));
  CHECK_THAT(f.err, Catch::Contains("127.0.0.2: root cause (*): rank 1 exit 3"));
  CHECK_THAT(f.err, Catch::Contains("exit codes: 127.0.0.1 3, 127.0.0.2 3"));
}

TEST_CASE("A hostfile start passes signals on to every host's workers and leaves nothing running",
          "[clusters][hostfile][integration]") {
  Sshd sshd;
  const std::string hostfile = sshd.dir() + "/hosts";
  writeFile(hostfile, "127.0.0.1 slots=1\n127.0.0.2 slots=1\n");
  const std::string marker = "signals-" + std::to_string(::getpid());
  Subprocess job(hostfileRun(sshd, hostfile, {"--shutdown_grace=2"},
                             {"trap", "print", "ready-" + marker, "wait"}));
  const bool ready = eventually([&] { return count(job.out(), "ready-" + marker) == 2; }, 60s);
  INFO(job.out() << job.err());
  REQUIRE(ready);
  ::kill(job.pid(), SIGUSR1);
  CHECK(eventually([&] { return count(job.out(), "got SIGUSR1") == 2; }, 20s));
  ::kill(job.pid(), SIGTERM);
  const auto finished = job.wait(60s);
  REQUIRE(finished);
  INFO(finished->out << finished->err);
  CHECK(finished->exit_code == 128 + SIGTERM);
  CHECK(count(finished->out, "127.0.0.1: [rank 0:0]: got SIGTERM") == 1);
  CHECK(count(finished->out, "127.0.0.2: [rank 1:1]: got SIGTERM") == 1);
  const bool none_left = eventually([&] { return processesWith(marker).empty(); }, 10s);
  CHECK(none_left);

  // SIGKILLed, the launcher takes its ssh processes along; the hosts see their input end.
  const std::string killed = "sigkill-" + std::to_string(::getpid());
  Subprocess again(hostfileRun(sshd, hostfile, {"--shutdown_grace=2"}, {"print", killed, "wait"}));
  REQUIRE(eventually([&] { return count(again.out(), killed) == 2; }, 60s));
  ::kill(again.pid(), SIGKILL);
  REQUIRE(again.wait(10s));
  const bool none_after_kill = eventually([&] { return processesWith(killed).empty(); }, 15s);
  INFO(joined(processesWith(killed)));
  CHECK(none_after_kill);
}
