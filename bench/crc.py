"""Body CRC: zlib.crc32 against crcmod's C extension, in the same run.

    python -m bench.crc

Both must agree (RocketMQ stores ``crc32(body) & 0x7FFFFFFF``) before anything is timed, and
crcmod must be running its C extension (``_crcfunext``), not its pure-Python fallback. The table
gives ns per call (best of 5 repeats) and the crcmod/zlib ratio per body size; rmq_mp.format.record uses
the faster one. Writes bench/results/crc.json. Takes about 3 s.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import timeit
import zlib
from functools import partial
from pathlib import Path

import crcmod.predefined

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (100, 1024, 4096, 65536)


def crcmod_uses_c_extension() -> bool:
    # `crcmod/__init__.py` star-imports crcmod.crcmod, which hides the submodule's flag.
    return bool(getattr(sys.modules["crcmod.crcmod"], "_usingExtension", False))


def main() -> int:
    crcmod_crc32 = crcmod.predefined.mkCrcFun("crc-32")
    assert crcmod_uses_c_extension(), "crcmod is running its pure-Python fallback"
    rnd = random.Random(7)
    for size in (0, 1, 3, 100, 1000, 4096, 65536, 100_000):
        for _ in range(20):
            data = rnd.randbytes(size)
            assert zlib.crc32(data) == crcmod_crc32(data), f"zlib and crcmod disagree on {size} bytes"
    rows = []
    print(f"{'body':>8} {'zlib ns':>10} {'crcmod ns':>10} {'crcmod/zlib':>12}")
    for size in SIZES:
        body = rnd.randbytes(size)
        number = max(2000, 2_000_000 // size)
        zlib_ns = min(timeit.repeat(partial(zlib.crc32, body), number=number, repeat=5)) / number * 1e9
        crcmod_ns = min(timeit.repeat(partial(crcmod_crc32, body), number=number, repeat=5)) / number * 1e9
        rows.append({"bytes": size, "zlib_ns": zlib_ns, "crcmod_ns": crcmod_ns, "ratio": crcmod_ns / zlib_ns})
        print(f"{size:>8} {zlib_ns:>10.0f} {crcmod_ns:>10.0f} {crcmod_ns / zlib_ns:>11.1f}x")
    print(
        f"python {platform.python_version()}, zlib {zlib.ZLIB_RUNTIME_VERSION}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "crc.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
