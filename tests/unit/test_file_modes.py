"""rmq_mp.file_modes: the modes of each storeGroupAccess, the umask a process and its children
get, what a looser store reports, and a library MessageStore's files (issue 35)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_mp import file_modes
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.errors import ConfigError
from rmq_mp.format.message import Message
from rmq_mp.store.message_store import MessageStore


@pytest.fixture(autouse=True)
def _keep_umask():
    old, access = os.umask(0o022), file_modes.current()
    os.umask(old)
    yield
    file_modes.apply(access)
    os.umask(old)


def test_each_access_gives_its_modes_and_umask() -> None:
    assert [
        (file_modes.dir_mode(a), file_modes.file_mode(a), file_modes.umask_for(a))
        for a in file_modes.ACCESS_VALUES
    ] == [
        (0o700, 0o600, 0o077),
        (0o750, 0o640, 0o027),
        (0o770, 0o660, 0o007),
    ]
    with pytest.raises(ConfigError, match="storeGroupAccess = 'world'"):
        MessageStoreConfig(store_group_access="world")


def test_apply_sets_the_umask_children_inherit() -> None:
    file_modes.apply("read")
    child = subprocess.run(
        [sys.executable, "-c", "from rmq_mp import file_modes; print(file_modes.inherited())"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert child.stdout.strip() == "read"
    os.umask(0o022)  # a shell's: none of the store's, so private
    assert file_modes.inherited() == "none"


def test_looser_than_counts_what_is_more_open(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    (root / "d").mkdir(mode=0o750)
    for name, mode in (("a", 0o600), ("b", 0o644), ("d/c", 0o640)):
        (root / name).touch()
        os.chmod(root / name, mode)
    os.chmod(root, 0o700)
    os.chmod(root / "d", 0o750)
    assert file_modes.looser_than(root, "none") == (3, ["b 0644", "d 0750", "d/c 0640"])
    assert file_modes.looser_than(root, "read") == (1, ["b 0644"])
    assert "e.g. b 0644" in (file_modes.looser_note(root, "write") or "")  # others may read it
    os.chmod(root / "b", 0o660)
    assert file_modes.looser_note(root, "write") is None


def test_a_library_message_store_is_private_under_a_loose_umask(tmp_path: Path) -> None:
    os.umask(0o022)
    config = MessageStoreConfig(
        store_path_root_dir=str(tmp_path / "lib"), mapped_file_size_commit_log=1 << 20
    )
    with MessageStore.open(config=config) as store:
        for i in range(10):
            store.put_message(Message(topic="T", body=f"m{i}".encode(), properties={"KEYS": f"k{i}"}))
    found = {}
    for directory, dirs, files in os.walk(tmp_path / "lib"):
        for name in [*dirs, *files, "."]:
            path = Path(directory) / name
            found[str(path)] = stat.S_IMODE(os.lstat(path).st_mode)
    assert len(found) > 5
    wrong = {p: f"{m:04o}" for p, m in found.items() if m != (0o700 if Path(p).is_dir() else 0o600)}
    assert wrong == {}


def test_make_dirs_and_create_private_ignore_a_clients_umask(tmp_path: Path) -> None:
    """A client process (a broadcasting consumer, a Spark executor) keeps the user's umask: the
    directories it makes under the store and the files it writes there get the store's modes,
    every level of them, and a file left with a looser mode is narrowed when rewritten."""
    for access, umask in (("none", 0o022), ("write", 0o022), ("read", 0o000)):
        file_modes.apply(access)
        os.umask(umask)
        root = tmp_path / access
        root.mkdir()
        deep = root / "a" / "b" / "c"
        file_modes.make_dirs(deep, root)
        file_modes.make_dirs(deep, root)  # there already: nothing to do
        left = deep / "f"
        left.touch()
        os.chmod(left, 0o666)
        os.close(file_modes.create_private(left))
        got = {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}
        dirs, files = file_modes.dir_mode(access), file_modes.file_mode(access)
        assert got == {"a": dirs, "a/b": dirs, "a/b/c": dirs, "a/b/c/f": files}, access
        assert stat.S_IMODE(root.stat().st_mode) == 0o777 & ~umask  # the root is not its to change
