"""The delay rewrite and messageTimeup (rmq_mp/store/schedule.py), and the in-process store's put."""

from __future__ import annotations

import pytest

from rmq_mp.config.offsets import DelayOffsetManager
from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.format import message as m
from rmq_mp.format.record import RecordRejected
from rmq_mp.outcomes import PutMessageStatus
from rmq_mp.store import schedule
from rmq_mp.store.message_store import MessageStore


def test_the_rewrite_is_4_9_8s() -> None:
    text = m.properties_to_string({"DELAY": "2", "TAGS": "A", "UNIQ_KEY": "U"})
    assert schedule.delayed_put("T", 5, 0, "2", text, 18) == (
        "SCHEDULE_TOPIC_XXXX",
        1,
        "DELAY\x012\x02TAGS\x01A\x02UNIQ_KEY\x01U\x02REAL_TOPIC\x01T\x02REAL_QID\x015",
    )
    # Clamped: DELAY says the level used; a string that was not re-set keeps its spelling.
    assert schedule.delayed_put("T", 0, 0, "99", "DELAY\x0199", 3) == (
        "SCHEDULE_TOPIC_XXXX",
        2,
        "DELAY\x013\x02REAL_TOPIC\x01T\x02REAL_QID\x010",
    )
    assert schedule.delayed_put("T", 0, 0, "+2", "DELAY\x01+2", 3)[2].startswith("DELAY\x01+2\x02")  # type: ignore[index]
    # Not delayed: no DELAY in the map, a level <= 0, a PREPARED or ROLLBACK transaction.
    assert schedule.delayed_put("T", 0, 0, None, "DELAY\x012", 18) is None
    assert schedule.delayed_put("T", 0, 0, "0", "DELAY\x010", 18) is None
    assert schedule.delayed_put("T", 0, 0, "-1", "DELAY\x01-1", 18) is None
    assert schedule.delayed_put("T", 0, m.TRANSACTION_PREPARED_TYPE, "2", "DELAY\x012", 18) is None
    assert schedule.delayed_put("T", 0, m.TRANSACTION_ROLLBACK_TYPE, "2", "DELAY\x012", 18) is None
    assert schedule.delayed_put("T", 0, m.TRANSACTION_COMMIT_TYPE, "2", "DELAY\x012", 18) is not None
    # A re-delayed message (a retry of a delivered one) has its REAL_* replaced in place.
    again = schedule.delayed_put(
        "R", 1, 0, "1", "DELAY\x011\x02REAL_TOPIC\x01T\x02REAL_QID\x015\x02K\x01v", 18
    )
    assert again is not None
    assert again[2] == "DELAY\x011\x02REAL_TOPIC\x01R\x02REAL_QID\x011\x02K\x01v"


@pytest.mark.parametrize("value", ["soon", "", "1.5", "2147483648", "١"])
def test_a_delay_that_is_not_a_java_int_is_refused(value: str) -> None:
    with pytest.raises(RecordRejected) as caught:
        schedule.delayed_put("T", 0, 0, value, f"DELAY\x01{value}", 18)
    assert caught.value.status is PutMessageStatus.MESSAGE_ILLEGAL
    assert "DELAY" in caught.value.reason


def test_batch_delay_problem() -> None:
    assert schedule.batch_delay_problem(None) == ""
    assert schedule.batch_delay_problem({"DELAY": "0"}) == ""
    assert "batch" in schedule.batch_delay_problem({"DELAY": "1"})
    assert "DELAY" in schedule.batch_delay_problem({"DELAY": "x"})


def test_deliver_timestamps() -> None:
    assert schedule.correct_deliver_timestamp(1000, 1500, 1000) == 1500
    assert schedule.correct_deliver_timestamp(1000, 2001, 1000) == 1000  # further than a level's delay


def test_message_timeup_keeps_the_stored_string_and_clears_the_map() -> None:
    props = {"DELAY": "2", "TAGS": "A", "UNIQ_KEY": "U", "REAL_TOPIC": "T", "REAL_QID": "3"}
    ext = m.MessageExt(
        store_size=0, magic_code=0, body_crc=0, queue_id=1, flag=9, queue_offset=4, commit_log_offset=0,
        sys_flag=0, born_timestamp=123, born_host=("10.0.0.1", 77), store_timestamp=456,
        store_host=("127.0.0.1", 10911), reconsume_times=2, prepared_transaction_offset=0, body=b"b",
        topic=schedule.SCHEDULE_TOPIC, properties=props, msg_id="",
    )  # fmt: skip
    real = schedule.message_timeup(ext)
    assert (real.topic, real.queue_id, real.flag, real.body) == ("T", 3, 9, b"b")
    assert (real.born_timestamp, real.born_host, real.reconsume_times) == (123, ("10.0.0.1", 77), 2)
    assert real.properties_string == m.properties_to_string(props)
    assert "DELAY" not in real.properties
    assert real.properties["WAIT"] == "false"
    del ext.properties["REAL_QID"]
    with pytest.raises(KeyError):
        schedule.message_timeup(ext)


def test_the_in_process_store_rewrites_too(small_config: MessageStoreConfig) -> None:
    """MessageStore.put_message goes through the same rewrite; the ConsumeQueue tags code is the
    delivery time; a delivered message (messageTimeup) put back is not delayed again."""
    config = small_config.replace(message_delay_level="1s 2s")
    with MessageStore.open(config=config) as store:
        put = store.put_message(
            m.Message(topic="T", body=b"x", queue_id=2, properties={"DELAY": "5", "TAGS": "A"})
        )
        assert put.status is PutMessageStatus.PUT_OK
        got = store.get_message(schedule.SCHEDULE_TOPIC, 1, 0).messages
        assert [x.properties for x in got] == [
            {"DELAY": "2", "TAGS": "A", "REAL_TOPIC": "T", "REAL_QID": "2"}
        ]
        [(_phy, _size, tags_code)] = store.find_consume_queue(schedule.SCHEDULE_TOPIC, 1).entries(0, 1)
        assert tags_code == got[0].store_timestamp + 2000
        assert store.put_message(schedule.message_timeup(got[0])).status is PutMessageStatus.PUT_OK
        [delivered] = store.get_message("T", 2, 0).messages
        assert delivered.properties == got[0].properties
        assert store.get_message(schedule.SCHEDULE_TOPIC, 1, 1).messages == []
        bad = store.put_message(m.Message(topic="T", body=b"x", properties={"DELAY": "x"}))
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL


def test_delay_offsets_salvage(tmp_path: object) -> None:
    from pathlib import Path

    manager = DelayOffsetManager(Path(str(tmp_path)) / "delayOffset.json")
    assert (
        manager.salvage(['{\n\t"offsetTable":{1:12,2:0,18:3\n\t}\n}', '{"offsetTable":{1:10,"2":5,3:']) != ""
    )
    assert manager.table == {1: 10, 2: 0, 18: 3}
    assert manager.salvage(["garbage"]) == ""
