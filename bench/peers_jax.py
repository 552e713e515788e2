"""The JAX side of bench/peers.py and bench/loop_grad.py, run as a child process by the
interpreter of JAX's own environment (.venv-jax: jax 0.10 needs numpy>=2, the project's
environment keeps numpy 1.26.4), so it imports neither torch nor lazyrt:

    .venv-jax/bin/python bench/peers_jax.py N REPS
    .venv-jax/bin/python bench/peers_jax.py grad FORM N DATA.npz

The counter loop of bench/peers.py at N = the argument: c = 0 (i64), x = 0 (f32); while c < N:
c + 1, x + 1, with N an argument of the jit-compiled function (one executable for every N), as
`lax.while_loop` and as `lax.fori_loop(0, N, ...)`. Prints one JSON line:
{"forms": {name: peers.measure_loop's dict}, "max_rss": bytes, "version": ...}.

grad: loop_grad.py's workload (the Euler integrator of an MLP vector field, N steps, the
gradients of W1 and W2 of mean(h_N ** 2)) as `jax.grad` through `lax.scan` of the step
(GRAD_SCAN), or of `jax.checkpoint(step)` (GRAD_CHECKPOINT: each step's carry kept, its insides
recomputed in the backward), jit-compiled; the arrays from DATA.npz. Prints loop_grad.child's
JSON: the first run (trace, compile, run) and a second run timed, the peak resident size above
the start, a digest of the gradients.
"""

import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from loop_timing import measure_loop  # noqa: E402 - after the path is set

WHILE = "JAX lax.while_loop (jit)"
FORI = "JAX lax.fori_loop (jit)"
GRAD_SCAN = "JAX jax.grad through lax.scan (jit)"
GRAD_CHECKPOINT = "JAX jax.grad through lax.scan of jax.checkpoint(step) (jit)"
DT = 0.1  # loop_grad.DT


def grad_main(form, n, path):
    import numpy as np

    from harness import first_and_warm, peak_rss, reset_peak_rss
    import jax
    import jax.numpy as jnp
    from jax import lax
    data = np.load(path)
    h0, w1, w2, u = (jnp.asarray(data[k]) for k in ("h0", "w1", "w2", "u"))
    before = reset_peak_rss()  # after the imports and the data, as loop_grad.child's

    def step(h, _, w1, w2):
        return h + DT * (jnp.tanh(h @ w1) @ w2 - h + u), None

    def loss(w1, w2):
        body = (lambda h, x: step(h, x, w1, w2))
        if form == GRAD_CHECKPOINT:
            body = jax.checkpoint(body)
        h, _ = lax.scan(body, h0, None, length=n)
        return jnp.mean(h * h)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))

    def run():
        return [np.asarray(g) for g in jax.block_until_ready(grad(w1, w2))]
    first, warm, (g1, g2) = first_and_warm(run)
    print(json.dumps({"first": first, "run": warm, "peak_rss": peak_rss() - before, "device_peak": None,
                      "recomputed": None, "g1": g1[:4, :4].tolist(), "g2": g2[:4, :4].tolist(),
                      "g_norm": [float(np.linalg.norm(g1)), float(np.linalg.norm(g2))],
                      "version": f"jax {jax.__version__}"}))


def main(argv):
    if argv[0] == "grad":
        return grad_main(argv[1], int(argv[2]), argv[3])
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
