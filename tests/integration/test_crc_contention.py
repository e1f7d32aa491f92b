"""The whole-record CRC under contention (issue 35): a producer computes a record's CRC before
the put lock with the lock's fields guessed (the queue's next offset, the write position, the
store time), and under the lock corrects the digits where another producer's put came first.
Two producer processes on one store, each sending batches and single messages until both have
had a guess corrected (`Sender.crc_misses`): every record in the commit log carries zlib's CRC
of its bytes and its own PHYSICALOFFSET, and every body sent is there once."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

from rmq_mp.format import record
from rmq_mp.format.message_batch import MessageBatch
from rmq_mp.put.producer import Producer
from tests.service import ROOT, running_service

TOPIC = "CrcContention"
BATCH = 20
MAX_ROUNDS = 20_000  # a pair that never collides fails the test rather than running on
WAIT_S = 60.0


def body_for(producer: int, seq: int) -> bytes:
    """Sizes 6 to 55 bytes: record shapes change within a batch and between sends."""
    return f"{producer}:{seq}:".encode() + b"x" * (seq % 50)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} not there"
        time.sleep(0.001)


def produce(store: str, me: int, out: Path) -> None:
    """The child: start with the other producer, then rounds of a `send_batch` of BATCH and a
    `send` until both producers' locks have corrected a guess; its count and corrections to
    ``out``/result<me>.json."""
    other = 1 - me
    with Producer.attach(store) as producer:
        native = producer._native
        assert native is not None
        assert producer.encoder.append_crc
        (out / f"ready{me}").touch()
        _wait_for(out / f"ready{other}")
        seq = 0
        for rnd in range(MAX_ROUNDS):
            bodies = [body_for(me, seq + k) for k in range(BATCH)]
            assert producer.send_batch(MessageBatch(TOPIC, bodies, queue_id=rnd % 2)).failures == 0
            seq += BATCH
            assert producer.send(TOPIC, body_for(me, seq), queue_id=0).ok
            seq += 1
            if native.crc_misses and not (out / f"corrected{me}").exists():
                (out / f"corrected{me}").touch()
            if (out / f"corrected{me}").exists() and (out / f"corrected{other}").exists():
                break
        (out / f"result{me}.json").write_text(json.dumps({"sent": seq, "misses": native.crc_misses}))


def commit_log_records(root: Path) -> list[tuple[int, bytes]]:
    """(commit-log offset, record) for every record of every commit-log file, in order."""
    found = []
    for path in sorted((root / "commitlog").iterdir()):
        data, base, pos = path.read_bytes(), int(path.name), 0
        while pos + 8 <= len(data):
            size, magic = struct.unpack_from(">ii", data, pos)
            if size <= 0 or magic == record.BLANK_MAGIC_CODE:
                break
            found.append((base + pos, data[pos : pos + size]))
            pos += size
    return found


def test_guesses_corrected_under_the_lock_leave_every_record_with_its_crc(tmp_path: Path) -> None:
    out = tmp_path / "producers"
    out.mkdir()
    with running_service(tmp_path) as service:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.test_crc_contention",
                    service.names.base,
                    str(i),
                    str(out),
                ],
                cwd=ROOT,
            )
            for i in (0, 1)
        ]
        try:
            codes = [p.wait(timeout=300) for p in procs]
        finally:
            for p in procs:
                p.kill()
                p.wait()
        assert codes == [0, 0]
        results = [json.loads((out / f"result{i}.json").read_text()) for i in (0, 1)]
        records = commit_log_records(service.root)
    assert all(r["misses"] > 0 for r in results), results  # the correction ran in both
    seen: dict[bytes, int] = {}
    for offset, raw in records:
        message = record.decode_message(raw, 0, len(raw), file_position=offset)  # PHYSICALOFFSET its own
        tail = raw[-record.CRC32_RESERVED_LEN :]
        assert tail[:9] == record.CRC_PLACEHOLDER[:9], offset
        crc = zlib.crc32(raw[: -record.CRC32_RESERVED_LEN]) & 0x7FFFFFFF
        assert tail[9:19] == record.crc_digits(crc), offset
        if message.topic == TOPIC:
            seen[message.body] = seen.get(message.body, 0) + 1
    sent = {body_for(i, seq) for i in (0, 1) for seq in range(results[i]["sent"])}
    assert set(seen) == sent
    assert set(seen.values()) == {1}


if __name__ == "__main__":
    produce(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
