"""One meaning of ok: every put result answers ``ok`` (PUT_OK) and ``stored`` (RocketMQ's
``isOk()``) by `PutMessageStatus`'s one rule."""

from __future__ import annotations

import pytest

from rmq_mp.outcomes import PutMessageResult, PutMessageStatus
from rmq_mp.put.results import SendResult

STORED_NOT_OK = {
    PutMessageStatus.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE,
}


@pytest.mark.parametrize("status", list(PutMessageStatus))
def test_ok_is_put_ok_and_stored_is_rocketmq_is_ok_for_every_result(status: PutMessageStatus) -> None:
    ok = status is PutMessageStatus.PUT_OK
    stored = ok or status in STORED_NOT_OK  # RocketMQ 4.9.8 PutMessageResult.isOk()
    assert (status.ok, status.stored) == (ok, stored)
    assert (PutMessageResult(status).ok, PutMessageResult(status).stored) == (ok, stored)
    assert (SendResult(status).ok, SendResult(status).stored) == (ok, stored)
