"""Builds the C extensions: phub._fastkernels (see phub/reduction/kernels.py for why C, not numba) and
phub._fastpath (the C loops of a server core and of a worker, see phub/_fastpath.c)."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "phub._fastkernels",
            sources=["phub/_fastkernels.c"],
            depends=["phub/_fastkernels.h"],
            # No -march=native: the build must run anywhere it is installed. fp-contract=off keeps
            # the C kernels bit-identical to the numpy reference (no fused multiply-add).
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-strict-aliasing"],
        ),
        Extension("phub._fastpath", sources=["phub/_fastpath.c"],
                  depends=["phub/_fastpath_rounds.h", "phub/_fastpath_direct.h", "phub/_fastpath_send.h",
                           "phub/_fastpath_racks.h", "phub/_fastpath_contract.h", "phub/_fastkernels.h"],
                  extra_compile_args=["-O3", "-ffp-contract=off", "-fno-strict-aliasing"]),
    ]
)
