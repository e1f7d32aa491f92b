"""The compiled put core (rmq_mp/put/_core.c); everything else is in pyproject.toml.

``optional=True``: a machine without a C compiler or the Python headers still installs, and
rmq-mp then runs the pure-Python reference put path, saying so once (rmq_mp/put/native.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rmq_mp.put._core",
            ["rmq_mp/put/_core.c"],
            extra_compile_args=[
                "-O2",
                "-std=gnu11",
                "-Wall",
                "-Wextra",
                "-Wno-unused-parameter",
                "-Wno-missing-field-initializers",
                "-Wno-cast-function-type",
            ],
            optional=True,
        )
    ]
)
