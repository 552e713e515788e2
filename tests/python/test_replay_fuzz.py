"""A fixed slice of the randomized replay differential test (tests/python/replay_fuzz.py), and
checks that the harness itself can fail.

Each chunk runs seeded programs in replay and plain worlds and fails naming its failing seeds
and the command that shrinks and prints them. `make fuzz-replay` runs many more programs.
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import lazyrt as lr  # noqa: E402
import replay_fuzz as rf  # noqa: E402

CHUNK = 25
CHUNKS = 8  # 200 programs
ACTIONS = 12


@pytest.mark.parametrize("first", [i * CHUNK for i in range(CHUNKS)],
                         ids=lambda f: f"seeds{f}-{f + CHUNK - 1}")
def test_random_programs_replay_as_the_plain_program(first):
    failures = []
    for seed in range(first, first + CHUNK):
        o = rf.run_program(rf.generate(seed, ACTIONS))
        if o.failed:
            failures.append(f"seed {seed}: {o.diff[0]}: {o.diff[1]}")
    assert not failures, (
        f"{len(failures)} of {CHUNK} programs replay differently from the plain program "
        f"(shrink and print one with: PYTHONPATH=build/python python3 tests/python/replay_fuzz.py "
        f"--programs 1 --actions {ACTIONS} --seed SEED):\n" + "\n".join(failures))


# ---- the harness is not vacuous ---------------------------------------------------------------


def _quiet_program(seed=3):
    """A program that replays correctly: create, trace, calls, reads."""
    p = rf.generate(seed, 0)
    p.config.update(model="mlp", act="tanh", dropout=0.0, running=False, loss="mse", opt="adamw",
                    lr=0.05, weight_decay=0.0, zero_grad="end", loop="none", returns="loss",
                    retrace=True, hold_views=False)
    acts = [rf.Action("create", sync=False),
            rf.Action("trace", via="compiled", batch=rf.BATCH, data=11),
            rf.Action("call", via="compiled", batch=rf.BATCH, arg="data", data=12),
            rf.Action("read"),
            rf.Action("mark_step"),
            rf.Action("call", via="compiled", batch=rf.BATCH, arg="data", data=13),
            rf.Action("call", via="compiled", batch=rf.BATCH, arg="data", data=14),
            rf.Action("read")]
    for i, a in enumerate(acts):
        a.index = i
    return p.with_actions(acts)


def _nudge_after_replayed_calls(world, action):
    # A deliberately wrong replay: after every replayed call, the first weight moves a little.
    if world.mode == "replay" and action.kind == "call" and world.compiled is not None:
        with lr.no_grad():
            next(iter(world.model.parameters())).add_(1e-3)


def test_a_correct_program_passes_and_replays():
    o = rf.run_program(_quiet_program())
    assert not o.failed, o.diff
    assert o.replays == 3 and not o.replay_raises


def test_a_perturbed_replay_is_reported_and_shrunk():
    p = _quiet_program()
    o = rf.run_program(p, perturb=_nudge_after_replayed_calls)
    assert o.failed and o.diff[0] == "param", o.diff
    assert "snapshot at action 3" in o.diff[1], "the first read already differs"
    shrunk, so = rf.shrink(p, o, perturb=_nudge_after_replayed_calls)
    assert so.failed
    assert [a.kind for a in shrunk.actions] == ["create", "trace", "call"], shrunk


def test_the_comparison_sees_values_none_shapes_and_counts():
    a = np.array([1.0, 2.0], dtype=np.float32)
    base = [(0, {"param w": a, "grad w": None})]
    assert rf.compare_snapshots(base, [(0, {"param w": a + 5e-7, "grad w": None})]) is None, "within tolerance"
    diff = rf.compare_snapshots(base, [(0, {"param w": a + 1e-3, "grad w": None})])
    assert diff[0] == "param" and "param w" in diff[1]
    diff = rf.compare_snapshots(base, [(0, {"param w": a, "grad w": a})])
    assert diff[0] == "grad" and "None" in diff[1]
    diff = rf.compare_snapshots(base, [(0, {"param w": a[:1], "grad w": None})])
    assert diff[0] == "param" and "[1]" in diff[1]
    assert rf.compare_snapshots(base, base + base)[0] == "count"
    assert rf.compare_snapshots(base, [(0, {"param w": a})])[0] == "keys"
    nan = np.array([np.nan], dtype=np.float32)
    assert rf.compare_snapshots([(0, {"r": nan})], [(0, {"r": nan})]) is None
    assert rf.compare_snapshots([(0, {"r": nan})], [(0, {"r": np.zeros(1, np.float32)})]) is not None


def test_programs_are_reproducible_and_printable():
    a, b = rf.generate(123, 15), rf.generate(123, 15)
    assert str(a) == str(b) and len([x for x in a.actions if x.kind != "set_py"]) == 16  # (set_py: drawn apart)
    assert str(rf.generate(124, 15)) != str(a)
    assert a.actions[0].kind == "create"
    only = rf.select(a, [0, 2, 5])
    assert [x.index for x in only.actions] == [0, 2, 5]
    assert "[ 5]" in str(only)
    # Restricting the replay paths keeps every other draw.
    c = rf.generate(123, 15, vias=("compiled",))
    assert [x.kind for x in c.actions] == [x.kind for x in a.actions]
    assert all(x.args.get("via") in (None, "compiled", "plain") for x in c.actions)
