"""The compiled put core (rmq_mp/put/_core.c); everything else is in pyproject.toml.

``optional=True``: a machine without a C compiler or the Python headers still installs, and
rmq-mp then runs the pure-Python reference put path, saying so once (rmq_mp/put/native.py).
"""

import os
import sysconfig

from setuptools import Extension, setup

# zlib's CRC-32 when its header is there (the core has its own slice-by-8 table otherwise).
_ZLIB = any(
    os.path.exists(os.path.join(d, "zlib.h"))
    for d in ("/usr/include", "/usr/local/include", sysconfig.get_config_var("INCLUDEDIR") or "")
)

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
            define_macros=[("RMQ_HAVE_ZLIB", "1")] if _ZLIB else [],
            libraries=["z"] if _ZLIB else [],
            optional=True,
        )
    ]
)
