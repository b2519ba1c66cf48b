#!/usr/bin/env python3
"""Rendezvous through etcd against the same through cxxlaunchd: N launchers on this machine
(`cxxlaunch run --nnodes N --nproc_per_node 1 /bin/true`, each a node with its own identity) meet
once through a real etcd (--rdzv_backend etcd; Debian's etcd-server, one member, data in a
temporary folder) and once through a real cxxlaunchd (the c10d backend), both started here.

For each N it prints the median wall time from starting the first launcher to the exit of the
last one (the join, the workers' /bin/true and the close: the rendezvous work of a whole job),
for etcd and for cxxlaunchd, and their ratio. No target (issue 13): etcd buys a replicated
coordinator, and this says what it costs. Exits non-zero when a job fails.

usage: bench/rendezvous_etcd.py [--cxxlaunch build/bin/cxxlaunch] [--daemon build/bin/cxxlaunchd]
                                [--nodes 2,4,8] [--repeat 3]
"""
import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CONF = "keep_alive_interval=1,keep_alive_max_misses=5,last_call_timeout=5,join_timeout=120"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    sys.exit(f"rendezvous_etcd: {what} did not come up")


def start_etcd(folder):
    etcd = shutil.which("etcd")
    if etcd is None:
        sys.exit("rendezvous_etcd: no etcd on PATH: apt-get install etcd-server (scripts/setup.sh)")
    client, peer = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = subprocess.Popen(
        [etcd, "--name", "bench", "--data-dir", os.path.join(folder, "etcd"),
         "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
         "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
         "--initial-cluster", f"bench={peer_url}", "--log-level", "warn", "--logger", "zap"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"127.0.0.1:{client}"
    etcdctl = shutil.which("etcdctl")

    def healthy():
        return subprocess.run([etcdctl, "--endpoints", endpoint, "endpoint", "health"],
                              capture_output=True, env={**os.environ, "ETCDCTL_API": "3"}
                              ).returncode == 0

    wait_until(healthy, 30, "etcd")
    return proc, endpoint


def start_daemon(path):
    proc = subprocess.Popen([path, "--port", "0"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on (\S+)", line)
    if not m:
        sys.exit(f"rendezvous_etcd: cxxlaunchd did not start: {line}")
    return proc, m.group(1)


def job(cxxlaunch, nodes, backend_flags, run_id, folder):
    """Seconds from the first launcher's start to the last one's exit."""
    argv = [cxxlaunch, "run", "--nnodes", str(nodes), "--nproc_per_node", "1", "--rdzv_id", run_id,
            "--log_dir", folder] + backend_flags + ["/bin/true"]
    start = time.monotonic()
    procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(nodes)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        if p.returncode != 0:
            sys.exit(f"rendezvous_etcd: a launcher of run {run_id} exited {p.returncode}: {err}")
    return time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cxxlaunch", default="build/bin/cxxlaunch")
    ap.add_argument("--daemon", default="build/bin/cxxlaunchd")
    ap.add_argument("--nodes", default="2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        etcd, etcd_endpoint = start_etcd(folder)
        daemon, daemon_endpoint = start_daemon(args.daemon)
        try:
            print(f"{'nodes':>5}  {'etcd (s)':>9}  {'cxxlaunchd (s)':>14}  {'etcd/cxxlaunchd':>15}")
            for n in (int(x) for x in args.nodes.split(",")):
                e, d = [], []
                for r in range(args.repeat):
                    e.append(job(args.cxxlaunch, n,
                                 ["--rdzv_backend", "etcd", "--rdzv_endpoint", etcd_endpoint,
                                  "--rdzv_conf", CONF], f"etcd-{n}-{r}", folder))
                    d.append(job(args.cxxlaunch, n,
                                 ["--rdzv_endpoint", daemon_endpoint,
                                  "--rdzv_conf", CONF + ",is_host=0"], f"daemon-{n}-{r}", folder))
                me, md = statistics.median(e), statistics.median(d)
                print(f"{n:>5}  {me:>9.3f}  {md:>14.3f}  {me / md:>15.2f}", flush=True)
        finally:
            for p in (etcd, daemon):
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
