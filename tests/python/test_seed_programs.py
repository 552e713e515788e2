"""The seed programs in examples/seed/ run as users run them (a separate interpreter) and print
the values they are known for."""

import os
import re
import subprocess
import sys

import lazyrt
from conftest import REPO


def run(name):
    env = dict(os.environ)
    # The same lazyrt the tests import (the build tree, or wherever PYTHONPATH points).
    package_root = os.path.dirname(os.path.dirname(lazyrt.__file__))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    done = subprocess.run([sys.executable, os.path.join(REPO, "examples", "seed", name)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def value(out, label):
    m = re.search(rf"^{re.escape(label)}: (.*)$", out, re.MULTILINE)
    assert m, f"no '{label}' line in:\n{out}"
    return m.group(1)


def test_while_loop_counter_gives_13():
    out = run("while_loop_counter.py")
    assert value(out, "result") == "13"
    assert int(value(out, "graph nodes")) < 20


def test_torch_while_loop_gives_13_with_one_compile_and_the_host_loop_51():
    out = run("torch_while_loop.py")
    assert value(out, "result") == "13"
    assert value(out, "counting from 1000") == "1003"
    assert value(out, "while_loop compiles") == "1"
    assert value(out, "lazyrt.torch.while_loop result") == "13"
    assert value(out, "host loop result") == "51"
    assert value(out, "host loop of 60") == "61"
    assert value(out, "host loop compiles") == "2"


def test_host_loop_control_gives_51_with_a_growing_graph():
    out = run("host_loop_control.py")
    assert value(out, "result") == "51"
    assert int(value(out, "graph nodes")) >= 50


def test_cached_graph_step_replays_equal_the_plain_loop():
    out = run("cached_graph_step.py")
    replayed = [float(value(out, f"replay {i}").split()[1]) for i in (1, 2, 3)]
    plain = [float(value(out, f"plain {i}").split()[1]) for i in (1, 2, 3)]
    assert len(set(replayed)) == 3, "the losses change from replay to replay"
    assert replayed == plain
    assert value(out, "replays: 3, compiles") == "0"
    assert value(out, "replayed losses equal the plain loop's") == "True"
    assert value(out, "weights equal") == "True"
    assert re.fullmatch(r"[0-9a-f]{32}", value(out, "graph hash"))


def test_device_while_loop_gives_13_and_reuses_its_executable():
    out = run("device_while_loop.py")
    assert value(out, "result") == "13"
    assert value(out, "counting from 1000") == "1003"
    assert value(out, "counting from 100000") == "100003"
    assert value(out, "compiles for the other trip counts") == "0"
    assert value(out, "host loop result") == "51"


def test_device_cached_step_replays_update_weights_and_adamw_state_as_pytorch():
    out = run("device_cached_step.py")
    replayed = [float(value(out, f"replay {i}").split()[1]) for i in (1, 2, 3)]
    plain = [float(value(out, f"plain {i}").split()[1]) for i in (1, 2, 3)]  # PyTorch on the CPU
    assert len(set(replayed)) == 3, "the losses change from replay to replay"
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(replayed, plain)), (replayed, plain)
    assert value(out, "compiles during the replays") == "0"
    assert value(out, "weights equal PyTorch's") == "True"
    assert value(out, "AdamW step count") == "3 (PyTorch: 3); moments equal PyTorch's: True"
    assert re.fullmatch(r"[0-9a-f]{32}", value(out, "graph hash"))
