"""A real, non-editable `pip install` of this checkout into a fresh virtual environment (issue 34
point 6): the console commands it installs, the top-level names it puts into site-packages, the
dependency ranges it declares, and `rmq-mp` running a store from that install alone, away from
the checkout.

pip builds the package as the README's install does (an isolated build that fetches setuptools
from the package index, and the three C extensions compiled); ``--no-deps``, with the running
environment's site-packages on the new one's path for numpy, posix_ipc and the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import psutil
import pytest

from bench.service import write_conf
from shm.names import ShmNames
from shm.store_shm import StoreShm
from tests.service import ROOT, leftover_processes

pytestmark = pytest.mark.slow

PRESCRIBED_TOP_LEVEL = {"rmq_mp", "workers", "shm"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding this checkout installed from a copy of its sources (a build leaves nothing
    in the tree that parallel tests import from)."""
    where = tmp_path_factory.mktemp("install")
    source = where / "src"
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", str(source)],
        capture_output=True, text=True, timeout=540, env=clean_env(),
    )  # fmt: skip
    assert pip.returncode == 0, pip.stdout + pip.stderr
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True, env=clean_env(),
        ).stdout.strip()
    )  # fmt: skip
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    return venv


def clean_env() -> dict[str, str]:
    """No PYTHONPATH (the tests' own points at the checkout) and no active venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RMQ_PROGRESS")}


def dist_info(venv: Path) -> Path:
    (info,) = venv.glob("lib/python*/site-packages/rmq_mp-*.dist-info")
    return info


def test_install_puts_only_prescribed_top_level_names(installed: Path) -> None:
    info = dist_info(installed)
    top_level = set((info / "top_level.txt").read_text().split())
    assert top_level == PRESCRIBED_TOP_LEVEL
    site = info.parent
    ours = {line.split(",")[0].split("/")[0] for line in (info / "RECORD").read_text().splitlines()}
    assert ours - {info.name, "..", "__pycache__"} == PRESCRIBED_TOP_LEVEL  # no bench/, tests/, run.py
    assert not (site / "bench").exists()
    assert not (site / "run.py").exists()
    compiled = sorted(p.name.split(".")[0] for p in (site / "rmq_mp").rglob("_*.so"))
    assert compiled == ["_core", "_index", "_scan"]


def test_install_declares_ranges_not_pins(installed: Path) -> None:
    requires = [
        line.split(":", 1)[1].split(";")[0].strip()  # the requirement, not its `extra == "spark"`
        for line in (dist_info(installed) / "METADATA").read_text().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert any(r.startswith("pyspark") for r in requires)
    assert [r for r in requires if "==" in r or "===" in r] == []


def test_installed_commands(installed: Path, tmp_path: Path) -> None:
    """`rmq-mp start --daemon`, `status`, `stop` from the install alone (cwd away from the checkout,
    no PYTHONPATH): the daemon supervisor runs `-m workers.cli` out of site-packages; `rmq-bench`
    says where the benchmarks are; the commands run the installed code, not the checkout's."""
    bin_dir = installed / "bin"
    assert {"rmq-mp", "rmq-admin", "rmq-bench", "rmq-spark"} <= {p.name for p in bin_dir.iterdir()}
    env = clean_env()
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import workers.cli; print(workers.cli.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(installed)
    bench = subprocess.run(
        [str(bin_dir / "rmq-bench")], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert bench.returncode == 2, bench
    assert "source checkout" in bench.stderr
    conf = write_conf(tmp_path / "broker.conf", tmp_path / "store")
    names = ShmNames.for_store(str(tmp_path / "store"))
    outputs = []
    try:
        for command in (["start", "--daemon"], ["status"], ["stop"]):
            result = subprocess.run(
                [str(bin_dir / "rmq-mp"), *command, "--conf", str(conf)],
                cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
            )  # fmt: skip
            assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
            outputs.append(result.stdout)
    finally:
        if len(outputs) < 3:  # a command failed: what the store left
            for proc in psutil.process_iter(["cmdline"]):
                cmd = " ".join(proc.info["cmdline"] or [])
                if names.base in cmd or str(tmp_path / "store") in cmd:
                    proc.kill()
            StoreShm.unlink_all(names)
    started, status, stopped = outputs
    assert f"running as shm {names.base}" in started
    assert "RUNNING" in status
    assert "stopped store" in stopped
    assert names.leftovers() == []
    assert leftover_processes(names) == []
    missing = subprocess.run(
        [str(bin_dir / "rmq-mp"), "status", "--conf", str(conf)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert missing.returncode == 2, missing
    assert missing.stderr.startswith("rmq-mp: error: no store running"), missing.stderr
