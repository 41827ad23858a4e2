"""Build the native kernels under native/ as the extension module slashrt._native.

The extension is optional: where no C compiler is available the build warns and
slashrt falls back to its numpy implementations (slashrt/_kernels.py says which is in use).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "slashrt._native",
            sources=["native/module.c", "native/hashagg.c", "native/ysb_baseline.c", "native/columns.c", "native/ring.c", "native/shm.c"],
            depends=["native/hashagg.h", "native/ysb_baseline.h", "native/columns.h", "native/ring.h", "native/shm.h"],
            include_dirs=["native"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
