"""kill -9 of a producer inside the compiled core's critical section (rmq_mp/put/_core.c).

The victim attaches, sends acknowledged messages, then arms the core's pause hook
(`_core._set_pause`): its next `send` stops itself (SIGSTOP) at that point of the put: holding
the lock; after the journal; after the copy, before the write position (the commit point); or,
under SYNC_FLUSH, waiting for its flush with the lock released, or with that wait timed out. The test waits until the victim
is stopped there (psutil's process status and the shared words, never a sleep), SIGKILLs it,
and checks: the next put takes the lock over at once (the owner's pid is in the lock word),
undoes the half-done put from the journal, reuses its queue offset; every acknowledged message
is served and survives a restart; the lock is free afterwards, in the store's own words.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.put import native
from rmq_mp.put.producer import Producer
from rmq_mp.store.message_store import MessageStore
from shm import flush_requests as fr
from shm import layout
from shm.layout import Role
from shm.store_shm import StoreShm
from tests.service import ROOT, RunningService, running_service, wait_until

pytestmark = pytest.mark.skipif(native.core is None, reason=f"no compiled core: {native.why_reference}")

LOCKED, JOURNALLED, COPIED, FLUSH_WAIT, FLUSH_TIMED_OUT = 1, 2, 3, 4, 5
ACKED = 20
MODES = {
    "async": {},
    "async-pool": {"transientStorePoolEnable": "true", "transientStorePoolSize": "2"},
    "sync": {"flushDiskType": "SYNC_FLUSH"},
}


def _stopped_victim(service: RunningService, point: int) -> subprocess.Popen[bytes]:
    """A producer process stopped by the core at ``point`` of its send (after ACKED good sends)."""
    code = (
        "import sys\n"
        "from rmq_mp.put.producer import Producer\n"
        "from rmq_mp.put import _core\n"
        f"p = Producer.attach({service.names.base!r})\n"
        f"for i in range({ACKED}):\n"
        "    assert p.send('K', b'acked %d' % i, queue_id=0).ok\n"
        "assert p._native is not None\n"
        f"_core._set_pause({point})\n"
        "p.send('K', b'victim' * 30, queue_id=0)\n"
        "sys.exit(3)\n"  # never reached: the test kills it where it stopped
    )
    victim = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        wait_until(
            lambda: victim.poll() is not None or psutil.Process(victim.pid).status() == psutil.STATUS_STOPPED,
            30,
            "the victim to stop inside its put",
        )
    except BaseException:
        victim.kill()
        victim.wait()
        raise
    assert victim.poll() is None, f"the victim exited with {victim.returncode} before its pause point"
    return victim


def _bodies(service: RunningService) -> list[bytes]:
    with Consumer.attach(service.root, "g") as consumer:
        return [m.body for m in consumer.pull("K", 0, 0, 100, timeout_s=5).messages]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("point", [LOCKED, JOURNALLED, COPIED], ids=["locked", "journalled", "copied"])
def test_a_producer_killed_inside_the_critical_section(tmp_path: Path, mode: str, point: int) -> None:
    acked = [b"acked %d" % i for i in range(ACKED)]
    with running_service(tmp_path, **MODES[mode]) as service, Producer.attach(service.root) as producer:
        victim = _stopped_victim(service, point)
        word = service.read(layout.PUT_LOCK_OWNER_PID)
        assert layout.lock_owner(word) == victim.pid, "the victim holds the lock"
        assert service.read(layout.JOURNAL_ACTIVE) == (point != LOCKED)
        wrote = service.read(layout.WROTE_POSITION)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        after = producer.send("K", b"after", queue_id=0)
        assert after.ok, after
        assert after.queue_offset == ACKED, "the dead put's queue offset is reused"
        assert after.commit_log_offset == wrote, "the dead put's bytes are undone"
        assert service.read(layout.LOCK_RECOVERIES) == 1
        assert layout.lock_owner(service.read(layout.PUT_LOCK_OWNER_PID)) == 0
        assert service.read(layout.JOURNAL_ACTIVE) == 0
        wait_until(lambda: len(_bodies(service)) == ACKED + 1, 60, "every message dispatched")
        assert _bodies(service) == [*acked, b"after"]
        assert producer.send("K", b"and on", queue_id=0).queue_offset == ACKED + 1
    with MessageStore.open(config=service.config, read_only=True) as store:
        assert [m.body for m in store.iter_messages()] == [*acked, b"after", b"and on"]


def test_a_sleeping_waiter_takes_the_lock_over_when_its_holder_is_killed(tmp_path: Path) -> None:
    """The waiter is already asleep in the futex (the lock word says so) when the holder dies.
    (osPageCacheBusyTimeOutMills is raised so the stopped holder never counts as busy.)"""
    settings = {"osPageCacheBusyTimeOutMills": "60000"}
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        assert producer.send("K", b"mapped", queue_id=1).ok  # the file is cached: the core sends
        victim = _stopped_victim(service, JOURNALLED)
        results = []
        waiter = threading.Thread(target=lambda: results.append(producer.send("K", b"waiter", queue_id=1)))
        waiter.start()
        try:
            wait_until(
                lambda: service.read(layout.PUT_LOCK_OWNER_PID) & layout.LOCK_WAITERS_BIT != 0,
                10,
                "the waiter to sleep on the lock word",
            )
        finally:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
        waiter.join(30)
        assert not waiter.is_alive()
        assert results[0].ok, results[0]
        assert results[0].queue_offset == 1
        assert service.read(layout.LOCK_RECOVERIES) == 1
        assert layout.lock_owner(service.read(layout.PUT_LOCK_OWNER_PID)) == 0


def test_a_producer_killed_while_waiting_for_its_flush(tmp_path: Path) -> None:
    """SYNC_FLUSH: the victim's put committed and released the lock, then it died waiting for
    the flush. Nothing to undo, no lock to take over; with a ring of two slots, one left to the
    dead waiter, later SYNC sends are still acknowledged."""
    acked = [b"acked %d" % i for i in range(ACKED)]
    settings = {"flushDiskType": "SYNC_FLUSH", "maxSyncFlushRequestNum": "2"}
    with running_service(tmp_path, **settings) as service, Producer.attach(service.root) as producer:
        victim = _stopped_victim(service, FLUSH_WAIT)
        assert layout.lock_owner(service.read(layout.PUT_LOCK_OWNER_PID)) == 0, "released before the wait"
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        for i in range(5):
            result = producer.send("K", b"after %d" % i, queue_id=0)
            assert result.ok, result
            assert result.queue_offset == ACKED + 1 + i
        assert service.read(layout.LOCK_RECOVERIES) == 0
        wait_until(lambda: len(_bodies(service)) == ACKED + 6, 60, "every message dispatched")
        bodies = _bodies(service)
        assert bodies[:ACKED] == acked
        assert bodies[ACKED] == b"victim" * 30, "committed before its flush wait: stored, never acknowledged"


RACED_SEND = (
    "import json, sys\n"
    "from rmq_mp.put.producer import Producer\n"
    "from rmq_mp.put import _core\n"
    "with Producer.attach(sys.argv[1]) as p:\n"
    "    assert p.send('K', b'warm', queue_id=0).ok and p._native is not None\n"
    "    print('ready', flush=True)\n"
    "    sys.stdin.readline()\n"  # the test has stopped the flusher
    f"    _core._set_pause({FLUSH_TIMED_OUT})\n"
    "    r = p.send('K', b'raced', queue_id=0)\n"
    "print(json.dumps([r.status.name, r.reason]))\n"
)


def test_a_flush_answered_as_the_wait_times_out_is_not_abandoned(tmp_path: Path) -> None:
    """SYNC_FLUSH: the flusher completes a request (DONE_OK) just as its waiter's own wait times
    out. The waiter abandons only a slot still WAITING (`FlushRequestRing.abandon`; in the core a
    compare-and-swap), so it reads the answer instead: PUT_OK, and the slot is collected (FREE),
    not ABANDONED. The race is made exact: the flusher is stopped (SIGSTOP) so the wait times out,
    the core stops itself after its timeout and before it gives the slot up, the real flusher is
    resumed and completes the slot, then the waiter goes on."""
    settings = {"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": "300"}
    with running_service(tmp_path, **settings) as service:
        flusher = service.worker_pid("flusher")
        shm = StoreShm.attach(service.names, Role.CONSUMER)
        victim = subprocess.Popen([sys.executable, "-c", RACED_SEND, service.names.base], cwd=ROOT,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert victim.stdout is not None
            assert victim.stdin is not None
            assert victim.stdout.readline() == "ready\n"
            os.kill(flusher, signal.SIGSTOP)
            try:
                victim.stdin.write("go\n")
                victim.stdin.flush()
                wait_until(
                    lambda: (
                        victim.poll() is not None
                        or psutil.Process(victim.pid).status() == psutil.STATUS_STOPPED
                    ),
                    30,
                    "the victim to stop past its flush timeout",
                )
                assert victim.poll() is None, f"the victim exited with {victim.returncode}"
                ring = shm.ring
                waiting = [s for s in range(ring.capacity) if ring.state(s) == fr.WAITING]
                assert len(waiting) == 1, "timed out, not yet given up"
                slot = waiting[0]
                assert ring.get(slot, fr.PID) == victim.pid
            finally:
                os.kill(flusher, signal.SIGCONT)
            wait_until(lambda: ring.state(slot) != fr.WAITING, 30, "the flusher to answer the slot")
            assert ring.state(slot) == fr.DONE_OK, fr.STATE_NAMES[ring.state(slot)]
            victim.send_signal(signal.SIGCONT)
            out, _ = victim.communicate(timeout=60)
            assert victim.returncode == 0
            assert json.loads(out) == ["PUT_OK", ""], "the answer arrived: the waiter reads it"
            assert ring.state(slot) == fr.FREE, fr.STATE_NAMES[ring.state(slot)]
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait()
            shm.close()
