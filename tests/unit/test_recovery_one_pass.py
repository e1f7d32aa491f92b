"""One-pass recovery leaves the same files and reports as cutting first and dispatching after.

Each test damages a real store the way a crash, a power loss or a bad disk would, copies it,
and recovers one copy with the one pass (`recover(..., one_pass=True)`, what `MessageStore.open`
runs) and the other with the two walks it replaces (`one_pass=False`). Every CommitLog,
ConsumeQueue and index byte, the checkpoint's logics time, the reporter's findings and the
recovery report must agree; ``expect_one_pass`` says whether the pass could dispatch while
checking or had to walk again after the cuts."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.outcomes import PutMessageResult
from rmq_mp.store.message_store import MessageStore
from rmq_mp.store.recovery import recover
from tests.conftest import FIXTURE_SETTINGS
from tests.store_content import make_messages

Damage = Callable[[Path, list[PutMessageResult]], None]


def write(config: MessageStoreConfig, count: int, *, crash: bool) -> list[PutMessageResult]:
    """Write ``count`` messages (dispatched as they are put); a crash keeps `abort`."""
    store = MessageStore.open(config=config)
    results = [store.put_message(msg) for msg in make_messages(count, 21)]
    store.flush()
    if crash:
        store._release()
    else:
        store.close()
    return results


def recovered(config: MessageStoreConfig, *, one_pass: bool) -> dict[str, object]:
    """Recover the store at ``config``'s root as `MessageStore.open` does; returns what it left."""
    store = MessageStore(config, read_only=False)
    try:
        store._take_lock()
        last_exit_ok = not store.paths.abort.exists()
        store.commit_log.load()
        store.cq_table.load()
        assert store.index_service is not None
        store.index_service.load()
        report = recover(store, last_exit_ok=last_exit_ok, one_pass=one_pass)
        store.flush()
        logics = store.checkpoint.logics_msg_timestamp
    finally:
        store._release()
    root = Path(config.store_path_root_dir)
    findings = [
        (d.kind, os.path.relpath(d.path, root), d.start, d.end, d.reason.replace(str(root), "<root>"))
        for d in store.reporter.findings
    ]
    fields = {
        k: getattr(report, k) for k in report.__dataclass_fields__ if k not in ("duration_ms", "one_pass")
    }
    return {
        "files": tree(root),
        "logics_msg_timestamp": logics,
        "findings": findings,
        "report": fields,
        "one_pass": report.one_pass,
    }


def tree(root: Path) -> dict[str, object]:
    digests: dict[str, object] = {}
    for sub in ("commitlog", "consumequeue"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file():
                digests[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    digests["index"] = [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((root / "index").iterdir())
    ]
    return digests


def both(config: MessageStoreConfig, tmp_path: Path) -> tuple[dict[str, object], dict[str, object]]:
    source = Path(config.store_path_root_dir)
    results = []
    for name, one_pass in (("one-pass", True), ("two-pass", False)):
        root = tmp_path / name
        shutil.copytree(source, root)
        results.append(recovered(config.replace(store_path_root_dir=str(root)), one_pass=one_pass))
    return results[0], results[1]


# ------------------------------------------------------------------------------ damage


def lag(root: Path, results: list[PutMessageResult]) -> None:
    """Dispatch behind the log at the crash: the last records have no queue or index entries."""
    cut = results[-60].phy_offset
    for qfile in (root / "consumequeue").rglob("*"):
        if qfile.is_file():
            data = bytearray(qfile.read_bytes())
            for pos in range(0, len(data), 20):
                phy = struct.unpack_from(">q", data, pos)[0]
                if struct.unpack_from(">i", data, pos + 8)[0] > 0 and phy >= cut:
                    data[pos:] = bytes(len(data) - pos)
                    break
            qfile.write_bytes(bytes(data))
    for index_file in sorted((root / "index").iterdir())[-2:]:
        index_file.unlink()


def last_log_file(root: Path) -> Path:
    return sorted((root / "commitlog").iterdir())[-1]


def zero_range(path: Path, start: int, length: int) -> None:
    with path.open("r+b") as f:
        f.seek(start)
        f.write(bytes(length))


def torn_properties(root: Path, results: list[PutMessageResult]) -> None:
    """The last record's tail (its properties' end) never reached the disk."""
    last = results[-1]
    path = last_log_file(root)
    zero_range(path, last.phy_offset + last.wrote_bytes - 6 - int(path.name), 6)


def power_loss(root: Path, results: list[PutMessageResult]) -> None:
    """The queues and the index reached the disk, the log's last records did not."""
    first_lost = results[-25].phy_offset
    for path in sorted((root / "commitlog").iterdir()):
        start = max(first_lost - int(path.name), 0)
        if start < path.stat().st_size:
            zero_range(path, start, path.stat().st_size - start)


def garbage(root: Path, results: list[PutMessageResult]) -> None:
    last = results[-1]
    path = last_log_file(root)
    with path.open("r+b") as f:
        f.seek(last.phy_offset + last.wrote_bytes - int(path.name))
        f.write(random.Random(4).randbytes(200))


def bad_crc(root: Path, results: list[PutMessageResult]) -> None:
    """A flipped bit in a body a few records before the end (only the CRC notices)."""
    path = last_log_file(root)
    for result in results[-8::-1]:
        pos = result.phy_offset - int(path.name)
        if pos < 0:
            continue
        with path.open("r+b") as f:
            f.seek(pos + 84)
            body_len = struct.unpack(">i", f.read(4))[0]
            f.seek(pos + 36)
            if struct.unpack(">i", f.read(4))[0] & 0x30 or body_len < 2:
                continue
            f.seek(pos + 88 + 1)
            byte = f.read(1)[0]
            f.seek(pos + 89)
            f.write(bytes([byte ^ 0x40]))
        return
    raise AssertionError("no record to flip")


def queue_entry_out_of_order(root: Path, results: list[PutMessageResult]) -> None:
    """A bad disk block: one entry in the middle of a queue's last file points far ahead."""
    qfile = sorted((root / "consumequeue" / "Payments" / "1").iterdir())[-1]
    data = bytearray(qfile.read_bytes())
    used = len(data.rstrip(b"\0")) // 20
    struct.pack_into(">q", data, used // 2 * 20, 1 << 40)
    qfile.write_bytes(bytes(data))


def index_cut(root: Path, results: list[PutMessageResult]) -> None:
    index_file = sorted((root / "index").iterdir())[-1]
    os.truncate(index_file, 40 + 64 * 4 + 20 * 7 + 3)


def queues_gone(root: Path, results: list[PutMessageResult]) -> None:
    """Every queue and index file lost: a normal exit whose replay starts before the three
    files normal recovery checks."""
    for qfile in (root / "consumequeue").rglob("*"):
        if qfile.is_file():
            qfile.unlink()
    for index_file in (root / "index").iterdir():
        index_file.unlink()


def queue_file_discarded(root: Path, results: list[PutMessageResult]) -> None:
    qfile = sorted((root / "consumequeue" / "OrderTopic" / "0").iterdir())[0]
    os.truncate(qfile, 333)


def both_ways(damages: list[Damage], *, crash: bool, count: int = 700) -> Callable[..., None]:
    def run(small_config: MessageStoreConfig, tmp_path: Path, expect_one_pass: bool) -> None:
        results = write(small_config, count, crash=crash)
        root = Path(small_config.store_path_root_dir)
        for damage in damages:
            damage(root, results)
        one, two = both(small_config, tmp_path)
        assert one["one_pass"] is expect_one_pass
        assert two["one_pass"] is False
        assert {k: v for k, v in one.items() if k != "one_pass"} == {
            k: v for k, v in two.items() if k != "one_pass"
        }

    return run


CASES: dict[str, tuple[list[Damage], bool, bool]] = {
    # name: damages, crash (abort kept), one pass expected
    "crash-with-dispatch-lag": ([lag], True, True),
    "crash-torn-properties-dispatched": ([torn_properties], True, False),
    "crash-torn-properties-lagging": ([lag, torn_properties], True, True),
    "crash-garbage-after-end": ([lag, garbage], True, True),
    "clean-garbage-after-end": ([garbage], False, True),
    "crash-bad-crc-lagging": ([lag, bad_crc], True, True),
    "crash-bad-crc-dispatched": ([bad_crc], True, False),
    "power-loss": ([power_loss], True, False),
    # the queue check cuts the bad entry before the pass, which then rebuilds the queue
    "queue-entry-out-of-order": ([queue_entry_out_of_order], True, True),
    "queue-entry-out-of-order-lagging": ([lag, queue_entry_out_of_order], True, True),
    "index-cut": ([index_cut], False, False),
    "clean-queues-gone": ([queues_gone], False, True),
    "queue-file-discarded": ([queue_file_discarded, lag], True, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_pass_equals_cut_then_dispatch(
    small_config: MessageStoreConfig, tmp_path: Path, case: str
) -> None:
    damages, crash, expect_one_pass = CASES[case]
    both_ways(damages, crash=crash)(small_config, tmp_path / "copies", expect_one_pass)


def test_crashed_rocketmq_store(rocketmq_fixtures: Path, tmp_path: Path) -> None:
    source = tmp_path / "crashed"
    shutil.copytree(rocketmq_fixtures / "crashed-store", source)
    for path in [source, *source.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    config = MessageStoreConfig().replace(store_path_root_dir=str(source), **FIXTURE_SETTINGS)
    one, two = both(config, tmp_path / "copies")
    assert one["one_pass"] is True
    assert one["report"] == two["report"]
    assert one["report"]["records_dispatched"] == 7000  # type: ignore[index]
    assert {k: v for k, v in one.items() if k != "one_pass"} == {
        k: v for k, v in two.items() if k != "one_pass"
    }
