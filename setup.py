"""Builds the one C extension, phub._fastkernels (see phub/kernels.py for why C, not numba)."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "phub._fastkernels",
            sources=["phub/_kernels.c"],
            # No -march=native: the build must run anywhere it is installed. fp-contract=off keeps
            # the C kernels bit-identical to the numpy reference (no fused multiply-add).
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-strict-aliasing"],
        )
    ]
)
