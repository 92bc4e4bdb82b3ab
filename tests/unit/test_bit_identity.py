"""Issue 56 item 1: a planning decision is the same to the bit whatever numpy's CPU dispatch and OpenBLAS's
kernels and threads are, as on the nodes of one PP deployment. A seeded fuzz of 500 whole decisions (the
single-prompt plan, then the queue-aware plan with chunks in flight, up to 16 prompts waiting and a load
estimate; prompts of 32K-1M at PP4-16) runs in subprocesses under each setting (bit_identity_worker.py), and
every chunk and predicted time must match the default run's exactly."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = Path(__file__).with_name("bit_identity_worker.py")
CASES, SEED = 500, 56


def _dispatched_on(prefix: str = "") -> str:
    """numpy's dispatched CPU features this host has (those NPY_DISABLE_CPU_FEATURES may turn off)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return " ".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f) and f.startswith(prefix))


def test_a_decision_is_the_same_to_the_bit_under_other_numpy_dispatch_and_openblas_kernels_and_threads():
    variants = {
        "default": {},
        # numpy down to its baseline (SSE3) where the host has more, OpenBLAS's SSE3 kernels on 2 threads
        "numpy baseline, OpenBLAS Prescott x2": {"NPY_DISABLE_CPU_FEATURES": _dispatched_on(),
                                                 "OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "2"},
        # an AVX2 node: numpy without AVX-512, OpenBLAS's Haswell kernels on 1 thread
        "numpy AVX2, OpenBLAS Haswell x1": {"NPY_DISABLE_CPU_FEATURES": _dispatched_on("AVX512"),
                                            "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1"},
    }
    procs = {}
    for name, extra in variants.items():
        env = {k: v for k, v in os.environ.items() if k not in ("NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE")}
        env.update({k: v for k, v in extra.items() if v})
        procs[name] = subprocess.Popen([sys.executable, str(WORKER), str(CASES), str(SEED)], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = {}
    for name, p in procs.items():
        out, err = p.communicate(timeout=1800)
        assert p.returncode == 0, f"{name}: {err[-2000:]}"
        outs[name] = out.splitlines()
    base = outs.pop("default")
    assert len(base) == CASES
    for name, lines in outs.items():
        diff = [i for i, (a, b) in enumerate(zip(base, lines)) if a != b]
        assert len(lines) == CASES and not diff, f"{name}: {len(diff)} of {CASES} decisions differ, the first: " \
                                                 f"{base[diff[0]][:300]} vs {lines[diff[0]][:300]}"


def test_the_planners_log_exp_and_grids_do_not_follow_numpys_cpu_dispatch():
    """core/detmath.py: what numpy's SIMD log, exp and geomspace would differ in (their last bits follow the
    dispatched ISA), computed through the C library's scalar libm instead, with np.log's edge values."""
    from sglang_cpp.core import detmath

    g = detmath.geomspace(3.0, 70000.0, 7)
    assert g[0] == 3.0 and g[-1] == 70000.0 and np.all(np.diff(g) > 0)
    assert np.allclose(g, np.geomspace(3.0, 70000.0, 7), rtol=1e-13, atol=0)
    assert detmath.geomspace(5.0, 9.0, 1).tolist() == [5.0]
    v = np.array([[0.0, 1.0], [np.e, np.inf]])
    assert detmath.log(v).tolist() == [[-np.inf, 0.0], [1.0, np.inf]] and detmath.log(v).shape == (2, 2)
    assert detmath.exp(np.array([0.0, 1e6])).tolist() == [1.0, np.inf] and float(detmath.exp(1.0)) == np.e
    code = ("import numpy as np; from sglang_cpp.core import detmath; r = np.random.default_rng(0).uniform(1e-3, 1e6,"
            " 4000); print(detmath.log(r).tobytes().hex()[:4000], detmath.exp(r / 1e5).tobytes().hex()[-4000:],"
            " detmath.geomspace(1.0, 65536.0, 997).tobytes().hex()[-4000:])")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                           env={**os.environ, "NPY_DISABLE_CPU_FEATURES": feats}).stdout
            for feats in ("", _dispatched_on())]
    assert runs[0] == runs[1] and runs[0]
