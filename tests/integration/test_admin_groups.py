"""rmq-admin's mqadmin commands for groups and peeks against a real store: deleteSubGroup
(refused while a member is attached unless --force; offsets gone from shared memory,
consumerProgress and consumerOffset.json; a new member starts afresh), consumeMessage's peek (no group, nothing committed), skipAccumulatedMessage,
cloneGroupOffset, printMsgByQueue, queryMsgByUniqueKey, getBrokerConfig, brokerStatus, statsAll,
and command names in any case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmq_mp.client.consumer import Consumer
from rmq_mp.config.offsets import ConsumerOffsetManager
from rmq_mp.put.producer import Producer
from rmq_mp.tools.admin import main
from shm import queue_offsets as qo
from tests.service import RunningService, running_service, wait_until

TOPIC = "Adm"
FAST_PERSIST = {"flushConsumerOffsetInterval": "100"}


def admin(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def fill(service: RunningService, count: int = 20) -> list[str]:
    """``count`` messages over 2 queues, dispatched; their UNIQ_KEYs."""
    with Producer.attach(service.names.base) as producer:
        keys = [
            producer.send(TOPIC, str(i).encode(), queue_id=i % 2).raise_for_status().uniq_key
            for i in range(count)
        ]
    with Consumer.attach(service.names.base, "probe") as probe:
        wait_until(lambda: probe.max_offset(TOPIC, 0) + probe.max_offset(TOPIC, 1) >= count, 60, "dispatch")
    return keys


def consume_all(name: str, group: str) -> list[int]:
    with Consumer.attach(name, group) as consumer:
        consumer.subscribe(TOPIC)
        got: list[int] = []
        while batch := consumer.poll(0.3, max_msgs=100):
            got.extend(int(msg.body) for msg in batch)
        consumer.commit()
        return sorted(got)


def persisted(service: RunningService) -> dict[str, dict[int, int]]:
    offsets = ConsumerOffsetManager(service.root / "config" / "consumerOffset.json")
    offsets.load()
    return offsets.table


def test_delete_sub_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_service(tmp_path, **FAST_PERSIST) as service:
        name = service.names.base
        fill(service)
        assert consume_all(name, "G") == list(range(20))
        assert consume_all(name, "Other") == list(range(20))
        wait_until(lambda: f"{TOPIC}@G" in persisted(service), 30, "G persisted")

        with Consumer.attach(name, "G") as member:
            member.subscribe(TOPIC)
            member.poll(0)  # joins the group
            code, out, err = admin(capsys, "deleteSubGroup", "-n", name, "-g", "G")
            assert code == 2
            assert "live member" in err
            assert out == ""
        code, out, _ = admin(capsys, "deletesubgroup", "-n", name, "-g", "G", "--json")  # any case
        assert code == 0
        with Consumer.attach(name, "probe") as probe:  # every entry: the claims of unwritten queues too
            entries = len(probe.store.shm.groups.queues_of(f"{TOPIC}@G"))
        assert json_lines(out) == [{"group": "G", "topic": TOPIC, "queues": entries}]
        with Consumer.attach(name, "probe") as probe:
            groups = probe.store.shm.groups
            assert {groups.get(s, qo.COMMITTED) for _q, s in groups.queues_of(f"{TOPIC}@G")} == {qo.DELETED}
        code, _, err = admin(capsys, "consumerProgress", "-n", name, "-g", "G")
        assert code == 2
        assert "no offsets" in err
        code, out, _ = admin(capsys, "consumerProgress", "-n", name, "--json")
        assert {row["group"] for row in json_lines(out)} == {"Other"}
        wait_until(lambda: f"{TOPIC}@G" not in persisted(service), 30, "G gone from consumerOffset.json")
        assert f"{TOPIC}@Other" in persisted(service)
        code, _, err = admin(capsys, "deleteSubGroup", "-n", name, "-g", "G")
        assert code == 2  # nothing left to delete
        assert consume_all(name, "G") == list(range(20))  # a new G starts from the first offset

        with Consumer.attach(name, "G") as member:  # --force with a member attached
            member.subscribe(TOPIC)
            member.poll(0)
            code, _, _ = admin(capsys, "deleteSubGroup", "-n", name, "-g", "G", "--force")
            assert code == 0
    # stopped: the files
    code, out, _ = admin(capsys, "deleteSubGroup", "--store", str(service.root), "-g", "Other", "--json")
    assert code == 0
    assert json_lines(out) == [{"group": "Other", "topic": TOPIC, "queues": 2}]
    assert persisted(service) == {}


def test_peek_skip_clone_print_query_and_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_service(tmp_path) as service:
        name = service.names.base
        keys = fill(service)
        code, out, _ = admin(
            capsys, "CONSUMEMESSAGE", "-n", name, "-t", TOPIC, "-i", "1", "-o", "3", "-c", "2", "--json"
        )
        assert code == 0
        peeked = json_lines(out)
        assert [(m["queueId"], m["queueOffset"]) for m in peeked] == [(1, 3), (1, 4)]
        code, out, _ = admin(capsys, "consumerProgress", "-n", name, "--json")
        assert json_lines(out) == []  # the peek committed nothing, joined nothing
        code, out, _ = admin(
            capsys, "consumeMessage", "--store", str(service.root), "-t", TOPIC, "-c", "3", "--json"
        )
        assert code == 0
        assert [(m["queueId"], m["queueOffset"]) for m in json_lines(out)] == [(0, 0), (0, 1), (0, 2)]

        code, out, _ = admin(capsys, "skipAccumulatedMessage", "-n", name, "-g", "S", "-t", TOPIC, "--json")
        assert code == 0
        assert [(r["queueId"], r["oldOffset"], r["newOffset"]) for r in json_lines(out)] == [
            (0, -1, 10),
            (1, -1, 10),
        ]
        assert consume_all(name, "S") == []
        code, out, _ = admin(
            capsys, "cloneGroupOffset", "-n", name, "-s", "S", "-d", "C", "-t", TOPIC, "--json"
        )
        assert code == 0
        with Consumer.attach(name, "C") as c:
            assert [c.committed_offset(TOPIC, q) for q in (0, 1)] == [10, 10]
        code, _, err = admin(capsys, "cloneGroupOffset", "-n", name, "-s", "Nobody", "-d", "C", "-t", TOPIC)
        assert code == 2
        assert "no offsets" in err

        code, out, _ = admin(capsys, "printMsgByQueue", "-n", name, "-t", TOPIC, "-i", "0", "--json")
        assert [int(bytes.fromhex(m["body"])) for m in json_lines(out)] == list(range(0, 20, 2))
        code, out, _ = admin(capsys, "queryMsgByUniqueKey", "-n", name, "-t", TOPIC, "-i", keys[7], "--json")
        assert code == 0
        assert [m["properties"]["UNIQ_KEY"] for m in json_lines(out)] == [keys[7]]
        code, out, _ = admin(capsys, "getBrokerConfig", "-n", name, "--json")
        assert json_lines(out)[0]["mappedFileSizeCommitLog"] == str(
            service.config.mapped_file_size_commit_log
        )
        code, out, _ = admin(capsys, "brokerStatus", "-n", name, "--json")
        status = json_lines(out)[0]
        assert status["commitLogMaxOffset"] > 0
        assert status["state"] == "RUNNING"
        code, out, _ = admin(capsys, "statsAll", "-n", name, "--json")
        rows = {(r["topic"], r["group"]): r for r in json_lines(out)}
        assert rows[(TOPIC, "S")]["accumulation"] == 0
        assert rows[(TOPIC, "S")]["messages"] == 20
