"""What every `rmq-admin` command shares: the store its arguments name (opened read-only or
attached), messages printed as a table or JSON lines, and argument types.

Kept apart from admin.py (the read commands and the parser) so that admin_ops.py (the operator
commands) can use them without an import cycle."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rmq_mp.config.store_config import MessageStoreConfig, parse_properties
from rmq_mp.errors import ConfigError, StoreError
from rmq_mp.format import record
from rmq_mp.format.index_layout import slots_and_entries
from rmq_mp.format.message import MessageExt, format_host
from rmq_mp.format.queue_entry import CQ_STORE_UNIT_SIZE
from rmq_mp.store.message_store import MessageStore
from rmq_mp.store.running_store import RunningStore
from shm import layout
from shm.layout import Role
from shm.names import ShmNames
from shm.pointer_table import PointerTable, now_ms, pid_alive


def message_to_json_dict(msg: MessageExt) -> dict[str, Any]:
    """A message as the fixture's `clean-store.messages.jsonl` spells it, field for field."""
    return {
        "topic": msg.topic,
        "queueId": msg.queue_id,
        "queueOffset": msg.queue_offset,
        "commitLogOffset": msg.commit_log_offset,
        "filePosition": msg.file_position,
        "storeSize": msg.store_size,
        "bodyCRC": msg.body_crc,
        "bodyCRCComputed": record.body_crc(msg.body),
        "flag": msg.flag,
        "sysFlag": msg.sys_flag,
        "bornTimestamp": msg.born_timestamp,
        "bornHost": format_host(msg.born_host),
        "storeTimestamp": msg.store_timestamp,
        "storeHost": format_host(msg.store_host),
        "reconsumeTimes": msg.reconsume_times,
        "preparedTransactionOffset": msg.prepared_transaction_offset,
        "msgId": msg.msg_id,
        "keys": msg.keys,
        "tags": msg.tags,
        "properties": dict(sorted(msg.properties.items())),
        "bodyLen": len(msg.body),
        "body": msg.body.hex(),
    }


def to_json_line(data: dict[str, Any]) -> str:
    """Compact, raw UTF-8 JSON: byte-identical to the fixture's lines."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") if ms > 0 else "-"


def _body_preview(body: bytes, width: int = 40) -> str:
    """Printable UTF-8 text as a quoted string; anything else as hex (``0x…``), cut at ``width``."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\t\n\r" for c in text):
        return repr(text if len(text) <= width else text[: width - 1] + "…")
    hexed = body.hex()
    return "0x" + (hexed if len(hexed) <= width else hexed[: width - 1] + "…")


def print_messages(messages: Iterable[MessageExt], *, as_json: bool, bodies: bool = False) -> int:
    """A table of messages (``bodies``: each followed by its body, text when it is printable
    UTF-8, else hex), or JSON lines."""
    count = 0
    if not as_json:
        print(
            f"{'offset':>12} {'topic':<24} {'queue':>5} {'qoffset':>8} {'tags':<10} {'keys':<20} "
            f"{'bytes':>6} {'stored':<24} msgId"
        )
    for msg in messages:
        count += 1
        if as_json:
            print(to_json_line(message_to_json_dict(msg)))
        else:
            print(
                f"{msg.commit_log_offset:>12} {msg.topic[:24]:<24} {msg.queue_id:>5} {msg.queue_offset:>8} "
                f"{(msg.tags or '-')[:10]:<10} {(msg.keys or '-')[:20]:<20} {len(msg.body):>6} "
                f"{iso(msg.store_timestamp):<24} {msg.msg_id}"
            )
            if bodies:
                print(f"{'body:':>12} {_body_preview(msg.body, 200)}")
    if not as_json:
        print(f"{count} message(s)")
    return 0


def print_detail(msg: MessageExt, *, as_json: bool) -> None:
    """One message in full, like mqadmin queryMsgById."""
    data = message_to_json_dict(msg)
    if as_json:
        print(to_json_line(data))
        return
    for key in (
        "msgId",
        "topic",
        "tags",
        "keys",
        "queueId",
        "queueOffset",
        "commitLogOffset",
        "storeSize",
        "reconsumeTimes",
        "bornHost",
        "storeHost",
        "sysFlag",
        "flag",
        "bodyCRC",
    ):
        print(f"{key + ':':<27}{data[key]}")
    print(f"{'bornTimestamp:':<27}{iso(msg.born_timestamp)}")
    print(f"{'storeTimestamp:':<27}{iso(msg.store_timestamp)}")
    print(f"{'properties:':<27}{json.dumps(data['properties'], ensure_ascii=False)}")
    print(f"{'body:':<27}{_body_preview(msg.body, 200)} ({len(msg.body)} bytes)")


def open_store(args: argparse.Namespace) -> MessageStore:
    """The store named by --store or --name, read-only, with --conf and --set applied."""
    properties: dict[str, str] = {}
    if args.name:
        from rmq_mp.store.running_store import resolve_names
        from shm.store_shm import read_descriptor

        descriptor = read_descriptor(resolve_names(args.name))
        properties.update(descriptor["properties"])
        root = descriptor["root"]
    else:
        root = str(args.store)
    if args.conf:
        properties.update(parse_properties(_read_conf(args.conf), source=args.conf))
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise StoreError(f"--set takes key=value, got {item!r}")
        properties[key.strip()] = value.strip()
    properties["storePathRootDir"] = root
    source = " and ".join([*([args.conf] if args.conf else []), *(["--set"] if args.set else [])])
    config = MessageStoreConfig.from_properties(properties, source=source or "defaults")
    if not Path(root).is_dir():
        raise StoreError("no such store directory")
    told = sizes_from_files(config, given=properties.keys())
    if told.keys() - properties.keys():
        properties.update({k: value for k, value in told.items() if k not in properties})
        config = MessageStoreConfig.from_properties(
            properties, source=f"{source or 'defaults'} and file lengths"
        )
    if not any(p.is_dir() for p in config.commit_log_dirs) and not any(
        (Path(root) / name).exists() for name in ("consumequeue", "index", "checkpoint")
    ):
        raise StoreError("not a store directory (no commitlog/, consumequeue/, index/ or checkpoint)")
    store = MessageStore.open(config=config, read_only=True)
    if args.name:  # a running store: its readers' window is the one in its pointer table
        try:
            store.read_end = running_read_end(args.name)
        except BaseException:
            store.close()
            raise
    return store


def running_read_end(name: str) -> int:
    """A running store's read window end (`FORK_READ_END`: a fork not cut yet, a slave's log not
    yet confirmed as its master's; -1 none), read once: what its consumers are served up to."""
    from rmq_mp.store.running_store import resolve_names

    table = PointerTable.attach(resolve_names(name).pointer_table, Role.CONSUMER)
    try:
        return table.get(layout.FORK_READ_END)
    finally:
        table.close()


def _file_lengths(directory: Path, digits: int = 20) -> set[int]:
    """The lengths of the mapped files (``digits``-digit names) directly in ``directory``, the
    last one left out when there are others (a torn last file may be short)."""
    try:
        files = sorted(f for f in directory.iterdir() if len(f.name) == digits and f.name.isdigit())
        lengths = [f.stat().st_size for f in files if f.is_file()]
    except OSError:
        return set()
    return set(lengths[:-1] if len(lengths) > 1 else lengths)


def sizes_from_files(config: MessageStoreConfig, given: Iterable[str] = ()) -> dict[str, str]:
    """The file sizes the files themselves tell, so ``--store`` alone opens a store made with
    non-default sizes: every commit-log file has ``mappedFileSizeCommitLog`` bytes, every
    consume-queue file ``mappedFileSizeConsumeQueue``, every index file ``40 + 4 *
    maxHashSlotNum + 20 * maxIndexNum`` (`index_layout`; one of the two ``given``, the length tells the other;
    neither, RocketMQ's 1:4 ratio of slots to entries). A size is told only when all files of
    the kind agree; otherwise the configured one stays and the store names the mismatch."""
    told: dict[str, str] = {}
    index = _file_lengths(config.root_dir / "index", digits=17)
    if len(index) == 1 and (length := index.pop()) != config.index_file_size_bytes:
        fit = slots_and_entries(
            length,
            slots=config.max_hash_slot_num if "maxHashSlotNum" in given else 0,
            entries=config.max_index_num if "maxIndexNum" in given else 0,
        )
        if fit is not None:
            told["maxHashSlotNum"], told["maxIndexNum"] = str(fit[0]), str(fit[1])
    commit_log = set().union(*(_file_lengths(d) for d in config.commit_log_dirs))
    if len(commit_log) == 1:
        told["mappedFileSizeCommitLog"] = str(commit_log.pop())
    queues: set[int] = set()
    with contextlib.suppress(OSError):
        for topic in config.consume_queue_dir.iterdir():
            for queue in topic.iterdir() if topic.is_dir() else ():
                queues |= _file_lengths(queue)
    if len(queues) == 1 and (size := queues.pop()) % CQ_STORE_UNIT_SIZE == 0 and size > 0:
        told["mappedFileSizeConsumeQueue"] = str(size)
    return told


def _read_conf(path: str) -> str:
    """The --conf file as text (UTF-8, a BOM skipped), as `MessageStoreConfig.from_file` reads it."""
    try:
        return Path(path).read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# ---------------------------------------------------------------------------- output


def emit(rows: list[dict[str, Any]], *, as_json: bool, columns: dict[str, str], footer: str = "") -> None:
    """Rows as JSON lines, or as a rich table with ``columns`` {key: heading} (numbers to the
    right; never wrapped or cut, whatever the terminal's width: a row stays one line to grep)."""
    if as_json:
        for row in rows:
            print(to_json_line(row))
        return
    import sys

    from rich import box
    from rich.console import Console
    from rich.table import Table

    cells = [[_cell(row[k]) for k in columns] for row in rows]
    utf8 = (getattr(sys.stdout, "encoding", "") or "").lower().replace("-", "") == "utf8"
    table = Table(
        box=box.SIMPLE_HEAD if utf8 else box.ASCII2, pad_edge=False, show_edge=False, highlight=False
    )  # (a locale that cannot spell the rule gets ASCII)
    for i, heading in enumerate(columns.values()):
        numeric = bool(cells) and all(_numeric(c[i]) or c[i] == "-" for c in cells)
        table.add_column(heading, justify="right" if numeric else "left", no_wrap=True)
    for c in cells:
        table.add_row(*c)
    # Rendered into a string, printed here: rich never touches stdout (its own flush turns a
    # closed pipe into SystemExit(1); rmq-admin's main ends quietly on one instead).
    out = io.StringIO()
    Console(file=out, width=1_000_000, color_system=None, highlight=False, emoji=False).print(
        table, crop=False
    )
    for line in out.getvalue().splitlines():
        print(line.rstrip())
    if footer:
        print(footer)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _numeric(text: str) -> bool:
    return text.lstrip("-").isdigit()


# ---------------------------------------------------------------------------- where


def is_running(args: argparse.Namespace) -> bool:
    """Whether the arguments name a running store (``--name``) rather than a directory (``--store``)."""
    return bool(args.name)


@contextmanager
def attach_running(args: argparse.Namespace) -> Iterator[RunningStore]:
    """The running store ``--name`` names, attached as a consumer for the command's length."""
    store = RunningStore.attach(args.name, Role.CONSUMER)
    try:
        yield store
    finally:
        store.close()


def mark_offsets_moved(store: RunningStore) -> None:
    """A deliberate move of group offsets (flags lock held): stamped, so a slave following this
    master copies its offsets exactly once, where it otherwise never lowers one (workers/ha_meta.py)."""
    store.table.set(layout.HA_META_RESET_MS, max(now_ms(), store.table.get(layout.HA_META_RESET_MS) + 1))


@contextmanager
def flags_lock(store: RunningStore) -> Iterator[None]:
    """The lock consumers insert group offsets under and the supervisor persists config under."""
    with store.shm.flags_lock("change the store's offsets or topics; try again"):
        yield


def refuse_if_running(store: MessageStore) -> None:
    """Offline changes to a running store's config files would be overwritten by its supervisor."""
    names = ShmNames.for_store(store.config.store_path_root_dir, store.config.shm_name)
    try:
        table = PointerTable.attach(names.pointer_table, Role.CONSUMER)
    except StoreError:
        return
    try:
        pid, start_ms = table.get(layout.SUPERVISOR_PID), table.get(layout.SUPERVISOR_START_MS)
    finally:
        table.close()
    if pid_alive(pid, start_ms):
        raise StoreError(
            f"store is running (supervisor pid {pid}): use --name {names.base} to change it live"
        )


def need_running(args: argparse.Namespace, command: str) -> None:
    """Refuse a command only a running store can do, naming the option that gives one."""
    if not is_running(args):
        raise StoreError(f"{command} needs a running store: --name <shm name or store directory>")
