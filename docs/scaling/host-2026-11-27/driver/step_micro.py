"""The driver's numeric work per update (the RMSProp step, its checks and the row's norms),
old against new, in one thread, in turns:

    git worktree add /tmp/old 98535d0
    python step_micro.py /tmp/old/src src     # from the repository, with pgpong installed
"""

import importlib.util
import math
import sys
import time

import numpy as np


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


old = load(f"{sys.argv[1]}/pgpong/policy.py", "oldpolicy")
new = load(f"{sys.argv[2]}/pgpong/policy.py", "newpolicy")
rng = np.random.default_rng(0)


def params(m, scale):
    return m.Params.of(rng.standard_normal((200, 6400)) * scale, rng.standard_normal(200) * scale)


def finite(p):
    return np.isfinite(p.W1).all() and np.isfinite(p.W2).all()


def run_old(w, c, g, o):
    o.step(w, g)
    assert finite(w) and finite(c)
    return math.sqrt(old.squared_norm(w.W1)), math.sqrt(old.squared_norm(w.W2)), o.last_update_norm


def run_new(w, c, g, o):
    o.step(w, g)
    assert o.weights_finite and o.cache_finite
    return math.sqrt(o.weight_squares[0]), math.sqrt(o.weight_squares[1]), o.last_update_norm


res = {}
for name, m, fn in [("old", old, run_old), ("new", new, run_new)] * 2:
    w, c, g = params(m, 0.1), params(m, 0.001), params(m, 0.01)
    c.W1 = np.abs(c.W1)
    c.W2 = np.abs(c.W2)
    o = m.RMSProp(0.011, 0.7, c, 4.0)
    fn(w, c, g, o)  # compile / warm
    ts = []
    for _ in range(60):
        a = time.thread_time_ns()
        fn(w, c, g, o)
        ts.append(time.thread_time_ns() - a)
    res.setdefault(name, []).append(np.median(ts) / 1e6)
print({k: [round(x, 2) for x in v] for k, v in res.items()})
