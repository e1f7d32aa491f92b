"""The compiled parts: the put core (rmq_mp/put/_core.c), the record scan (rmq_mp/format/_scan.c)
and the index writes (rmq_mp/store/_index.c); everything else is in pyproject.toml.

``optional=True``: a machine without a C compiler or the Python headers still installs, and
rmq-mp then runs the pure-Python references, saying so once (rmq_mp/format/native.py).
"""

import os
import sysconfig

from setuptools import Extension, setup

# zlib's CRC-32 when its header is there (the core has its own slice-by-8 table otherwise).
_ZLIB = any(
    os.path.exists(os.path.join(d, "zlib.h"))
    for d in ("/usr/include", "/usr/local/include", sysconfig.get_config_var("INCLUDEDIR") or "")
)

_FLAGS = dict(
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

setup(
    ext_modules=[
        Extension("rmq_mp.put._core", ["rmq_mp/put/_core.c"], **_FLAGS),
        Extension("rmq_mp.format._scan", ["rmq_mp/format/_scan.c"], **_FLAGS),
        Extension("rmq_mp.store._index", ["rmq_mp/store/_index.c"], **_FLAGS),
    ]
)
