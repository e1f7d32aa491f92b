"""LocalFileOffsetStore: a broadcasting member's own progress, in a file keyed by its client id.

RocketMQ keeps broadcasting progress on the client (``~/.rocketmq_offsets/<clientId>/<group>/
offsets.json``), since every member reads every queue and the broker's per-group offset cannot
hold one position per member. rmq-mp keeps the same file under the store directory instead,
``<storePathRootDir>/broadcastOffsets/<clientId>/<group>/offsets.json``: the progress belongs
with the messages it points into (a store copied or restored carries it, a store deleted drops
it, two stores never share it), and any process of the machine finds it by the store alone.
A member restarted with the same ``client_id`` resumes from it.

File: ``{"offsetTable": {"<topic>": {"<queueId>": next_offset}}}``, written whole to a ``.tmp``
and renamed over the old one at each commit (a crash leaves the old or the new file, never a
torn one; as RocketMQ's ``MixAll.string2File``, no fsync: a power loss may cost the last
commits, which are then read again).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rmq_mp import file_modes
from rmq_mp.errors import InvalidArgumentError, InvalidArgumentTypeError

CLIENT_ID = re.compile(r"[A-Za-z0-9_.:@#|%-]{1,128}")
"""Client ids rmq-mp accepts: RocketMQ's ``ip@instanceName`` shapes, safe as a file name."""


def check_client_id(client_id: object) -> str:
    """A client id: 1-128 of letters, digits and ``_.:@#|%-``, not ``.`` or ``..`` (it names a
    directory), or `InvalidArgumentError`."""
    if not isinstance(client_id, str):
        raise InvalidArgumentTypeError(f"client_id must be a str, not {type(client_id).__name__}")
    if not CLIENT_ID.fullmatch(client_id) or client_id in (".", ".."):
        raise InvalidArgumentError(
            f"client_id {client_id!r}: use 1-128 letters, digits or '_.:@#|%-' (not '.' or '..')"
        )
    return client_id


class LocalFileOffsetStore:
    def __init__(self, store_root: Path, client_id: str, group: str) -> None:
        self.store_root = store_root
        self.path = store_root / "broadcastOffsets" / client_id / group / "offsets.json"
        self.table: dict[str, dict[int, int]] = {}

    def load(self) -> None:
        """Read the file (none yet: no progress). A file that does not parse raises
        `InvalidArgumentError` naming it, rather than starting the member over silently."""
        try:
            text = self.path.read_text("utf-8")
        except FileNotFoundError:
            return
        try:
            raw = json.loads(text)["offsetTable"]
            self.table = {str(t): {int(q): int(o) for q, o in qs.items()} for t, qs in raw.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidArgumentError(
                f"{self.path}: not a broadcasting offset file ({exc}); move it aside to start over"
            ) from exc

    def offsets_of(self, topic: str) -> dict[int, int]:
        return dict(self.table.get(topic, {}))

    def update(self, topic: str, queue_id: int, offset: int) -> None:
        self.table.setdefault(topic, {})[queue_id] = offset

    def persist(self) -> None:
        """Write the whole table atomically (tmp, rename)."""
        file_modes.make_dirs(self.path.parent, self.store_root)  # a client's umask is not the store's
        data = {
            "offsetTable": {t: {str(q): o for q, o in sorted(qs.items())} for t, qs in self.table.items()}
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(file_modes.create_private(tmp), "w", encoding="utf-8") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, self.path)
