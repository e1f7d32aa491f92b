"""The README's quick start, run as written (its install line aside: this test runs inside that
environment, stood in for by ./.venv; tests/integration/test_install.py does the real install)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import psutil

from shm.names import ShmNames
from shm.store_shm import StoreShm
from tests.service import ROOT, leftover_processes


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "the quick start has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def console_scripts() -> dict[str, str]:
    """pyproject's [project.scripts]: command -> "module:function"."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]


def stand_in_venv(venv: Path) -> None:
    """``venv/bin``: this interpreter, and each console script pyproject declares written as pip
    writes it (the environment running the tests may have been installed before a script was
    declared; test_install.py checks that pip installs them)."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    for command, target in console_scripts().items():
        module, function = target.split(":")
        script = venv / "bin" / command
        script.write_text(
            f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n",
            encoding="utf-8",
        )
        script.chmod(0o755)


def test_readme_commands_are_installed_ones() -> None:
    """Every `.venv/bin/<command>` the README runs is the interpreter or a declared console script
    (`rmq-mp` for the supervisor: start, stop, status, demo), and run.py still runs the same program."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    used = set(re.findall(r"\.venv/bin/([\w-]+)", text))
    assert used <= {"python", "pip", *console_scripts()}, used - {"python", "pip", *console_scripts()}
    assert console_scripts()["rmq-mp"] == "workers.cli:installed_main"
    assert ".venv/bin/rmq-mp demo" in text.split("## Two commands", 1)[1].split("```", 2)[1]
    for command in ("start", "stop", "status", "demo"):
        result = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result
        assert result.stdout.startswith(f"usage: run.py {command}"), result.stdout


def test_readme_quick_start_runs_as_written(tmp_path: Path) -> None:
    commands = quick_start_commands()
    assert commands[0].startswith("python3 -m venv .venv && .venv/bin/pip install")
    stand_in_venv(tmp_path / ".venv")
    names = ShmNames.for_store(str(tmp_path / "store"))
    env = {k: v for k, v in os.environ.items() if k not in ("RMQ_PROGRESS", "VIRTUAL_ENV")}
    outputs = []
    try:
        for command in commands[1:]:
            result = subprocess.run(
                ["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
            )
            assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
            outputs.append(result.stdout)
    finally:
        killed = False
        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if names.base in cmd or (f"{tmp_path}" in cmd and "workers.cli" in cmd):
                proc.kill()
                killed = True
        if killed or len(outputs) < len(commands) - 1:  # a command failed: what the store left
            StoreShm.unlink_all(names)
    started, sent, consumed, progress, status, stopped = outputs
    assert f"store {tmp_path / 'store'} running as shm {names.base}," in started
    assert sent.count("PUT_OK") == 3
    assert "3 message(s)" in consumed
    assert "Diff Total: 0" in progress
    assert "RUNNING" in status
    assert "stopped store" in stopped
    assert (tmp_path / "store" / "logs" / "supervisor.log").exists()
    assert names.leftovers() == []
    assert leftover_processes(names) == []


def test_readme_and_docs_point_at_nothing_outside_the_repository() -> None:
    """Issue 19: the README named `../shared/...` files a clone does not have. Every relative
    link or backticked path of the README and docs/ resolves inside the repository."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        links = re.findall(r"\]\(([^)#\s]+)", text)
        assert not [link for link in links if "://" in link], doc  # nothing off the clone either
        for link in links:
            target = (doc.parent / link).resolve()
            assert target.is_relative_to(ROOT), (doc.name, link)
            assert target.exists(), (doc.name, link)
        assert not re.findall(r"`\.\./[^`]*`", text), doc.name


def test_every_source_path_the_docs_name_exists() -> None:
    """Issue 22 moved every module into sub-packages: a README, docs/ or source mention of a file
    (`rmq_mp/store/recovery.py`) or of a module run with ``python -m`` names one that exists."""
    missing = []
    sources = [ROOT / d / p for d in ("rmq_mp", "workers", "shm", "bench") for p in ("*.py", "*.c", "*.pyi")]
    code = sorted({f for pattern in sources for f in pattern.parent.rglob(pattern.name)})
    for doc in [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "conf" / "broker.conf",
        *code,
    ]:
        text = doc.read_text(encoding="utf-8")
        for path in re.findall(r"\b((?:rmq_mp|workers|shm|bench|tests)/[\w/]+\.(?:py|pyi|c))\b", text):
            if not (ROOT / path).exists():
                missing.append(f"{doc.name}: {path}")
        for module in re.findall(r"python3? -m ((?:rmq_mp|workers|shm|bench)(?:\.\w+)+)", text):
            base = ROOT / module.replace(".", "/")
            if not (base.with_suffix(".py").exists() or (base / "__main__.py").exists()):
                missing.append(f"{doc.name}: python -m {module}")
    assert missing == []
