"""python3 -m lazyrt.distributed.run --nproc N script.py [args...]

Starts N processes of ``script.py`` on this host with the variables torchrun sets (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK), which
lazyrt.distributed.init_process_group() reads. For several hosts, run it on each with the same
``--nnodes``, ``--master_addr`` (the host of node 0) and ``--master_port``, and each host's
``--node_rank``. ``-m module`` runs a module instead of a script. When a process fails, the
others are stopped (after ``--grace`` seconds) and the launcher exits with the failing status;
otherwise with 0 once all have ended.

Threads: the processes of a host share its CPUs. Each gets an equal share of those this
launcher may run on (at least one) as LAZYRT_NUM_THREADS, OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS, where the environment does not set them already: N processes with as
many threads each as the host has CPUs would take turns on them, and a collective waits for
the rank that was kept waiting longest.
"""

import argparse
import os
import signal
import subprocess
import sys
import time


def parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m lazyrt.distributed.run", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", "--nproc_per_node", "--nproc-per-node", dest="nproc", type=int, default=1,
                   help="processes on this host (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="hosts (default 1)")
    p.add_argument("--node_rank", "--node-rank", dest="node_rank", type=int, default=0, help="this host's index")
    p.add_argument("--master_addr", "--master-addr", dest="master_addr", default="127.0.0.1",
                   help="host of rank 0, which serves the rendezvous (default 127.0.0.1)")
    p.add_argument("--master_port", "--master-port", dest="master_port", type=int, default=29500,
                   help="its port (default 29500)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds the others get to end after a process fails, before they are killed")
    p.add_argument("-m", dest="module", action="store_true", help="run the target as a module (python3 -m)")
    p.add_argument("target", help="the script (or, with -m, the module)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    if a.nproc < 1 or a.nnodes < 1 or not 0 <= a.node_rank < a.nnodes:
        p.error(f"need --nproc >= 1, --nnodes >= 1 and 0 <= --node_rank < --nnodes "
                f"(got {a.nproc}, {a.nnodes}, {a.node_rank})")
    if not 1 <= a.master_port <= 65535:
        p.error(f"--master_port {a.master_port} is not a port")
    return a


THREAD_VARIABLES = ("LAZYRT_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def threads_per_process(nproc, cpus=None):
    """Each of nproc local processes' share of the CPUs this process may run on (at least 1)."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // nproc)


def worker_env(a, local_rank, cpus=None):
    env = dict(os.environ)
    share = str(threads_per_process(a.nproc, cpus))
    for name in THREAD_VARIABLES:
        if not env.get(name):
            env[name] = share
    env.update({
        "RANK": str(a.node_rank * a.nproc + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(a.nnodes * a.nproc),
        "LOCAL_WORLD_SIZE": str(a.nproc),
        "GROUP_RANK": str(a.node_rank),
        "MASTER_ADDR": a.master_addr,
        "MASTER_PORT": str(a.master_port),
    })
    return env


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    cmd = [sys.executable] + (["-m", a.target] if a.module else [a.target]) + a.args
    procs = [subprocess.Popen(cmd, env=worker_env(a, i)) for i in range(a.nproc)]
    failed = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        failed = (-1, 130)
    deadline = time.monotonic() + a.grace
    for p in procs:
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if p.poll() is None:
            p.kill()
            p.wait()
    rank, code = failed
    if rank >= 0:
        print(f"lazyrt.distributed.run: local rank {rank} (rank {a.node_rank * a.nproc + rank}) exited with "
              f"status {code}", file=sys.stderr)
    return code if code > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
