#!/usr/bin/env python3
"""The include graph of src/ only reaches down, and the bindings use the public API only.

Every file of src/ belongs to one layer, named by the longest prefix of its path in LAYERS;
a file may include (with `#include "..."`) files of its own layer and of the layers listed
before it, never of a later one. Layers of one rank (a tuple) are siblings: none includes
another. The public headers (include/lazyrt/) and the Python bindings (python/src/) include
nothing of src/.

Run by ctest as `Layers`: first on small trees made here (one that obeys the rules, and one
for each kind of violation, each of which must be reported), then on the project.
"""

import os
import re
import sys
import tempfile

# Bottom to top. A rank is a prefix or a tuple of sibling prefixes; a prefix is a folder of
# src/ ("backend/cpu/") or one file ("backend/registry.cpp").
LAYERS = [
    "util/",
    "ir/",
    "scalar/",          # the elementwise ops' scalar functions: kernels, generated code, folding
    "runtime/",
    "cache/",
    "backend/",         # the Backend interface and arena planning
    "backend/cpu/jit/",
    "backend/cpu/kernels/",
    "backend/cpu/",     # lowering, region ops, the cpu backends
    "backend/registry.cpp",
    "compile/",
    "exec/",
    "trace/",
    ("ops/", "autograd/"),  # ops record on the tape; gradient rules are written in ops
    "loops/",
    ("replay/", "nn/", "optim/", "distributed/"),
]
# ops/ and autograd/ are one layer: the only rank whose prefixes may include each other.
ONE_LAYER = {("ops/", "autograd/")}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rank_of(path, layers):
    """(rank index, prefix) of a src-relative path: the longest matching prefix."""
    best = None
    for i, entry in enumerate(layers):
        for prefix in entry if isinstance(entry, tuple) else (entry,):
            if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
                if best is None or len(prefix) > len(best[1]):
                    best = (i, prefix)
    return best


def may_include(src, dst, layers):
    a, b = rank_of(src, layers), rank_of(dst, layers)
    if a is None or b is None:
        return False
    if a[0] > b[0] or a[1] == b[1]:
        return True
    entry = layers[a[0]]
    return a[0] == b[0] and isinstance(entry, tuple) and entry in ONE_LAYER


def sources(root):
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if f.endswith((".h", ".cpp", ".def", ".inc")):
                yield os.path.join(d, f)


def violations(src_root, include_root=None, bindings_root=None, layers=LAYERS):
    """Every include that reaches up or sideways, and every file no layer holds."""
    found = []
    files = [(p, os.path.relpath(p, src_root).replace(os.sep, "/")) for p in sources(src_root)]
    for path, rel in files:
        if rank_of(rel, layers) is None:
            found.append(f"{rel}: in no layer (add its folder to LAYERS)")
            continue
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            if not os.path.exists(os.path.join(src_root, inc)):
                continue  # a public header, a system header or one beside the file
            if not may_include(rel, inc, layers):
                target = rank_of(inc, layers)
                found.append(f"{rel} includes {inc}: " + (f"{target[1]} is not below {rank_of(rel, layers)[1]}"
                                                          if target else "a file in no layer"))
    for root, what in ((include_root, "public"), (bindings_root, "bindings")):
        for path in sources(root) if root else ():
            with open(path, encoding="utf-8") as fh:
                for inc in INCLUDE.findall(fh.read()):
                    if os.path.exists(os.path.join(src_root, inc)):
                        found.append(f"{os.path.relpath(path, root)} ({what}) includes {inc} of src/")
    return found


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)


def self_test():
    """The checker on made-up trees: it passes a tree that obeys, and names each violation."""
    good = {
        "src/ir/graph.h": '#include "util/check.h"\n',
        "src/util/check.h": "",
        "src/ops/a.cpp": '#include "autograd/t.h"\n#include "trace/x.h"\n#include <vector>\n',
        "src/autograd/t.h": '#include "ops/b.h"\n',
        "src/ops/b.h": "",
        "src/trace/x.h": '#include "lazyrt/tensor.h"\n',
        "src/backend/registry.cpp": '#include "backend/cpu/lower.h"\n',
        "src/backend/cpu/lower.h": '#include "backend/backend.h"\n',
        "src/backend/backend.h": "",
        "include/lazyrt/tensor.h": "#include <string>\n",
        "python/src/bindings.h": '#include <lazyrt/lazyrt.h>\n#include "lazyrt/tensor.h"\n',
    }
    bad = {
        # (file added to the good tree, the words its report must hold)
        "src/ir/up.h": ('#include "trace/x.h"\n', "ir/up.h includes trace/x.h"),
        "src/nn/side.h": ('#include "optim/o.h"\n', "nn/side.h includes optim/o.h"),
        "src/optim/o.h": ("", None),
        "src/backend/backend2.h": ('#include "backend/cpu/lower.h"\n', "backend/backend2.h includes backend/cpu/lower.h"),
        "src/backend/cpu/l2.h": ('#include "backend/registry.cpp"\n', "backend/cpu/l2.h includes backend/registry.cpp"),
        "src/newdir/a.h": ("", "newdir/a.h: in no layer"),
        "include/lazyrt/leak.h": ('#include "ir/graph.h"\n', "leak.h (public) includes ir/graph.h"),
        "python/src/reach.cpp": ('#include "bindings.h"\n#include "trace/x.h"\n',
                                 "reach.cpp (bindings) includes trace/x.h"),
    }
    with tempfile.TemporaryDirectory() as d:
        write_tree(d, good)
        got = violations(os.path.join(d, "src"), os.path.join(d, "include"), os.path.join(d, "python", "src"))
        assert got == [], f"self-test: a tree that obeys was refused: {got}"
    for rel, (text, words) in bad.items():
        if words is None:
            continue
        with tempfile.TemporaryDirectory() as d:
            tree = dict(good, **{rel: text})
            if rel == "src/nn/side.h":
                tree["src/optim/o.h"] = ""
            write_tree(d, tree)
            got = violations(os.path.join(d, "src"), os.path.join(d, "include"), os.path.join(d, "python", "src"))
            assert any(words in g for g in got), f"self-test: {rel} not reported as '{words}': {got}"
            assert len(got) == 1, f"self-test: {rel} reported more than once: {got}"


def main():
    self_test()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = violations(os.path.join(root, "src"), os.path.join(root, "include"),
                       os.path.join(root, "python", "src"))
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} include(s) against the layers of tests/check_layers.py")
        return 1
    print("layers: every include of src/ reaches down; the public headers and bindings include none of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
