"""Group commit under SYNC_FLUSH with producers that each wait for their own put's flush (a
closed loop, as every SYNC sender is): the flusher waits, while the oldest send waiting began
less than 1.25 passes ago (`syncFlushGatherMaxUs` at most), for the producers its last flush
woke to put again, so one fsync serves all of them. Here a put that came during a fsync is
already about a flush old when the next gather starts: a bound of one flush from the send's
start flushed it alone, and the groups split again (1.75 puts per fsync, bench/NOTES.md
syncstart). Without gathering (0, RocketMQ's GroupCommitService) a flush starts as soon
as one request waits and the others wait through it: on a disk (bench.sync_group) the producers
split into two groups that alternate, about two puts per fsync with four producers; here, where
FUSE also holds a file's writes while it is fsynced, 1.3 (3.1-3.4 with gathering, measured
alone; once above 2.0 under a parallel run, hence the bounds).
A slow disk for real (tests.faultfs, 20 ms a fsync) makes a producer's turn between two puts
far shorter than a flush, on a loaded machine too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.store import CTX
from rmq_mp.outcomes import PutMessageStatus
from shm import layout
from tests.crash.test_fsync_failure import faulty_dir, fuse_unavailable
from tests.service import running_service

__all__ = ["faulty_dir"]

pytestmark = pytest.mark.skipif(bool(fuse_unavailable()), reason=fuse_unavailable() or "-")

PRODUCERS = 4
SENDS = 25


def sync_producer(root: str, index: int, start: Any, out: Any) -> None:
    """One closed-loop SYNC sender: SENDS puts after the start barrier, each waited for."""
    from rmq_mp.put.producer import Producer

    with Producer.attach(Path(root)) as producer:
        start.wait(60)
        results = [producer.send("G", b"%d-%d" % (index, i), queue_id=index) for i in range(SENDS)]
        flushed = producer.store.shm.table.get(layout.FLUSHED_POSITION)
    out.put([(r.status.name, r.commit_log_offset, flushed) for r in results])


@pytest.mark.parametrize(("gather_us", "low", "high"), [("100000", 2.7, 4.0), ("0", 1.0, 2.5)])
def test_a_sync_flush_serves_every_producer_its_last_flush_woke(
    faulty_dir: tuple[Path, Path], gather_us: str, low: float, high: float
) -> None:
    mount, fail_switch = faulty_dir
    fail_switch.with_name(".slow-fsync").write_text("20")
    settings = {"flushDiskType": "SYNC_FLUSH", "syncFlushGatherMaxUs": gather_us}
    with running_service(mount, **settings) as service:
        start, out = CTX.Barrier(PRODUCERS + 1), CTX.Queue()
        procs = [
            CTX.Process(target=sync_producer, args=(str(service.root), i, start, out))
            for i in range(PRODUCERS)
        ]
        for p in procs:
            p.start()
        try:
            start.wait(60)  # every producer attached; nothing waits for a flush
            fsyncs_before = service.read(layout.FLUSH_COUNT)
            results = [out.get(timeout=120) for _ in procs]
            fsyncs = service.read(layout.FLUSH_COUNT) - fsyncs_before
        finally:
            for p in procs:
                p.join(30)
                if p.exitcode is None:
                    p.kill()
                    p.join(10)
        assert [p.exitcode for p in procs] == [0] * PRODUCERS
    statuses = {status for rows in results for status, _, _ in rows}
    assert statuses == {PutMessageStatus.PUT_OK.name}
    for rows in results:  # the last put of each was flushed when it was acknowledged
        assert rows[-1][2] > rows[-1][1]
    per_fsync = PRODUCERS * SENDS / fsyncs
    assert low <= per_fsync <= high, f"{per_fsync:.2f} puts per fsync ({fsyncs} fsyncs)"
