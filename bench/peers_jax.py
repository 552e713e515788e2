"""The JAX side of bench/peers.py, run as a child process by the interpreter of JAX's own
environment (.venv-jax: jax 0.10 needs numpy>=2, the project's environment keeps numpy 1.26.4),
so it imports neither torch nor lazyrt:

    .venv-jax/bin/python bench/peers_jax.py N REPS

The counter loop of bench/peers.py at N = the argument: c = 0 (i64), x = 0 (f32); while c < N:
c + 1, x + 1, with N an argument of the jit-compiled function (one executable for every N), as
`lax.while_loop` and as `lax.fori_loop(0, N, ...)`. Prints one JSON line:
{"forms": {name: peers.measure_loop's dict}, "max_rss": bytes, "version": ...}.
"""

import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from loop_timing import measure_loop  # noqa: E402 - after the path is set

WHILE = "JAX lax.while_loop (jit)"
FORI = "JAX lax.fori_loop (jit)"


def main(argv):
    n, reps = int(argv[0]), int(argv[1])
    import jax
    jax.config.update("jax_enable_x64", True)  # an i64 counter, as the other peers'
    import jax.numpy as jnp
    from jax import lax

    @jax.jit
    def while_form(limit):
        init = (jnp.int64(0), jnp.float32(0), limit)
        return lax.while_loop(lambda s: s[0] < s[2], lambda s: (s[0] + 1, s[1] + 1, s[2]), init)[:2]

    @jax.jit
    def fori_form(limit):
        return lax.fori_loop(jnp.int64(0), limit, lambda i, s: (s[0] + 1, s[1] + 1),
                             (jnp.int64(0), jnp.float32(0)))

    forms = {}
    for name, fn in ((WHILE, while_form), (FORI, fori_form)):
        jax.clear_caches()  # the first call traces and compiles

        def call(fn=fn):
            c, x = jax.block_until_ready(fn(jnp.int64(n)))
            return int(c), float(x)
        forms[name] = measure_loop(call, n, reps)
    print(json.dumps({"forms": forms, "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "version": f"jax {jax.__version__}, jaxlib {jax.lib.__version__}"}))


if __name__ == "__main__":
    main(sys.argv[1:])
