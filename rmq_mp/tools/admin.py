"""`rmq-admin`: mqadmin-style commands over a store directory or a running store.

    rmq-admin printMsg         [-t T] [-b MS] [-e MS]                every record, commit-log order
    rmq-admin queryMsgByKey    -t T -k K [--max N] [--begin MS] [--end MS]
    rmq-admin queryMsgById     -i MSGID
    rmq-admin queryMsgByOffset -t T -i QUEUE -o OFFSET [-b BROKER]
    rmq-admin topicStatus      [-t T]                                per queue min/max offset, last update
    rmq-admin topicList                                              topics, queues, read/write queue counts
    rmq-admin updateTopic      -t T [-r N] [-w N] [-p PERM]          queue counts in config/topics.json
    rmq-admin consumerProgress [-g G]                                per group and queue: offsets, lag, holder
    rmq-admin consumerConnection -g G                                (running store) live members, their queues
    rmq-admin resetOffsetByTime -g G -t T -s MS|ISO|now [--create-group]
    rmq-admin storeStatus                                            flush progress, pointers, pool, disk, flags
    rmq-admin scheduleStatus   [-l LEVEL] [-c N]                     delay levels: offset, backlog, lag; a level's queue
    rmq-admin sendMessage      -t T -p TEXT|--body-file F [-k K] [-c TAGS] [--count N]   (running store)
    rmq-admin consumeMessage   -t T [-g G] [-c N] [--tags X] [--timeout S]               (running store)
    rmq-admin deleteExpiredCommitLog                                 (running store) the cleaner runs now
    rmq-admin deleteSubGroup   -g G [--force]                        a group's offsets; refused while a member is attached
    rmq-admin deleteTopic      -t T [-c C] [--force]                 a topic's queues, config, offsets; stays deleted
    rmq-admin skipAccumulatedMessage -g G -t T                       a group's offsets to the queues' ends
    rmq-admin cloneGroupOffset -s SRC -d DEST -t T                   copy a group's offsets
    rmq-admin printMsgByQueue  -t T -i QUEUE [-b MS] [-e MS] [-s TAGS] [-d]
    rmq-admin queryMsgByUniqueKey -i UNIQ_KEY -t T
    rmq-admin getBrokerConfig / brokerStatus / statsAll              settings; runtime info; accumulation
    rmq-admin copyLog          --to DIR                              the whole commit log and config/ into an empty store
    rmq-admin promote          [--broker-name B] [--role R] [--force]  (running SLAVE) become a master
    rmq-admin demote                                                  (stopped, promoted store) start as broker.conf says
    (consumeMessage without -g peeks: -i QUEUE -o OFFSET, nothing committed; names in any case)

The short options are RocketMQ 4.9 mqadmin's letters for the same subcommand (see `EPILOG`).
Each takes ``--store DIR`` (a store directory, opened read-only: safe on a crashed or copied
store) or ``--name``/``-n SHMNAME`` (a running store: its directory and settings come from its shared
memory), ``--conf FILE`` and ``--set key=value`` for settings (the file sizes, unless given,
come from the file lengths: `sizes_from_files`), and ``--json`` for machine output (one object per line). The
JSON of a message has the field names and order of the RocketMQ 4.9.8 fixture's messages file,
and is UTF-8 whatever the locale. No command prints a record that fails its checks (body CRC, a
whole record, the one its queue entry promises): printMsg and queryMsgByKey skip it with a
warning naming its byte range, the look-ups by id or offset fail naming why. Expected failures (no store there, a setting that does not match
the files, an unknown --set key, a bad msgId) print one line, ``rmq-admin: error: <store>:
<problem>``, and exit 2, as argparse does for usage errors.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import os
import sys
from pathlib import Path

from rmq_mp import file_modes
from rmq_mp.errors import InvalidMessageIdError, StoreError
from rmq_mp.outcomes import GetMessageStatus
from rmq_mp.progress import Bar, progress
from rmq_mp.store.message_store import MAX_TIMESTAMP, MessageStore
from rmq_mp.tools.admin_common import (
    iso,
    open_store,
    positive_int,
    print_detail,
    print_messages,
    to_json_line,
)


def _check_msg_id(msg_id: str) -> str:
    """Reject what `decode_message_id` would not reject cleanly (``bytes.fromhex`` skips spaces)."""
    if len(msg_id) not in (32, 56) or any(c not in "0123456789abcdefABCDEF" for c in msg_id):
        raise InvalidMessageIdError(f"msgId must be 32 or 56 hex characters, got {msg_id!r}")
    return msg_id


def delete_expired_commit_log(args: argparse.Namespace) -> int:
    """Ask a running store's cleaner for a manual run and report what it did."""
    from rmq_mp.store.cleaning import request_manual_delete
    from rmq_mp.store.running_store import RunningStore
    from shm.layout import Role

    if not args.name:
        raise StoreError("deleteExpiredCommitLog needs a running store: use --name")
    store = RunningStore.attach(args.name, Role.CONSUMER)
    try:
        stats = request_manual_delete(store, wait_s=args.wait)
    finally:
        store.close()
    if args.json:
        print(to_json_line(stats.as_dict()))
    else:
        print(f"manual deletion requested; the cleaner's run: {stats.summary()}")
        print(f"commit-log minimum offset now {stats.min_offset}; disk {stats.disk_used_ratio:.0%} used")
    return 0


def check_names(args: argparse.Namespace) -> None:
    """Every subcommand's --topic and --group by the rules `Producer`/`Consumer` apply
    (`validators.check_topic`, `check_group`): refused before anything is opened, so an empty
    ``--topic ""`` never means "all topics" and a name no send could use is never created.
    sendMessage's topic is the store's to judge: MESSAGE_ILLEGAL with the reason, as for a
    `Producer`."""
    from rmq_mp import validators as v

    if getattr(args, "topic", None) is not None and args.command != "sendMessage":
        v.check_topic(args.topic, "--topic")
    if getattr(args, "group", None) is not None:
        v.check_group(args.group)


def run(args: argparse.Namespace) -> int:
    check_names(args)
    if args.command == "deleteExpiredCommitLog":
        return delete_expired_commit_log(args)
    if args.command == "copyLog":
        from rmq_mp.tools.admin_copy import copy_log_command

        return copy_log_command(args)
    if args.command == "promote":
        from rmq_mp.tools.promote import promote

        return promote(args)
    if args.command == "demote":
        from rmq_mp.tools.promote import demote

        return demote(args)

    from rmq_mp.tools import admin_groups
    from rmq_mp.tools.admin_ops import COMMANDS

    if args.command == "consumeMessage" and args.group is None:
        return admin_groups.peek_messages(args)  # mqadmin's peek: no group, nothing committed
    if args.command in COMMANDS:
        return COMMANDS[args.command](args)
    if args.command in admin_groups.COMMANDS:
        return admin_groups.COMMANDS[args.command](args)
    if args.command == "deleteTopic":
        from rmq_mp.tools.admin_topics import delete_topic

        return delete_topic(args)
    with open_store(args) as store:
        if args.command == "printMsg":
            begin, end = args.begin, args.end if args.end is not None else MAX_TIMESTAMP
            first = store.min_phy_offset()
            if 0 <= store.read_end < store.max_phy_offset():
                # Not printed, as no reader is served them: they are not this slave's master's
                # (or not yet known to be), and the cut or the next comparison decides.
                print(
                    f"rmq-admin: records at commit-log offsets [{store.read_end}, {store.max_phy_offset()}) "
                    f"are not printed: this slave's log is not confirmed as its master's from "
                    f"{store.read_end} (docs/replication.md, 'The read window')",
                    file=sys.stderr,
                )
            with progress("printMsg", total=store.max_phy_offset() - first, unit="bytes") as bar:
                return print_messages(
                    (
                        m
                        for m in store.iter_messages()
                        if _seen(bar, m.commit_log_offset - first)
                        and begin <= m.store_timestamp <= end
                        and (args.topic is None or m.topic == args.topic)
                    ),
                    as_json=args.json,
                )
        if args.command == "queryMsgByKey":
            end = args.end if args.end is not None else MAX_TIMESTAMP
            return print_messages(
                store.query_message(args.topic, args.key, args.max, args.begin, end), as_json=args.json
            )
        if args.command == "queryMsgById":
            print_detail(store.view_message_by_id(_check_msg_id(args.id)), as_json=args.json)
            return 0
        if args.command == "queryMsgByOffset":
            result = store.get_message(args.topic, args.queue, args.offset, 1)
            skipped = [m.queue_offset for m in result.messages] != [args.offset]
            if skipped and result.status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
                # The pull went past the entry at this offset: its record must not be served.
                # Say why (a typed error), and never show the next message as this one.
                store.look_message_by_queue_offset(args.topic, args.queue, args.offset)
            if not result.messages:
                raise StoreError(
                    f"{args.topic}/{args.queue} offset {args.offset}: {result.status.name} "
                    f"(queue offsets [{result.min_offset}, {result.max_offset}))"
                )
            if not args.json:
                print(f"{'status:':<27}{result.status.name}")
            print_detail(result.messages[0], as_json=args.json)
            return 0
        return topic_status(store, args.topic, as_json=args.json)


def _seen(bar: Bar, done: int) -> bool:
    """Advance the bar in a generator's filter (always True)."""
    bar.update(done)
    return True


def topic_status(store: MessageStore, topic: str | None, *, as_json: bool) -> int:
    topics = [topic] if topic else store.topics()
    rows = [q for t in topics for q in store.queue_status(t)]
    if topic and not rows:
        raise StoreError(f"topic {topic!r} has no queue in this store")
    if as_json:
        for q in rows:
            print(
                to_json_line(
                    {
                        "topic": q.topic,
                        "queueId": q.queue_id,
                        "minOffset": q.min_offset,
                        "maxOffset": q.max_offset,
                        "lastUpdateTimestamp": q.last_update_timestamp,
                    }
                )
            )
        return 0
    from rmq_mp.tools.admin_common import emit

    emit(
        [
            {"topic": q.topic, "queueId": q.queue_id, "minOffset": q.min_offset, "maxOffset": q.max_offset,
             "lastUpdate": iso(q.last_update_timestamp)}
            for q in rows
        ],
        as_json=False,
        columns={"topic": "Topic", "queueId": "QueueId", "minOffset": "MinOffset", "maxOffset": "MaxOffset",
                 "lastUpdate": "LastUpdate"},
    )  # fmt: skip
    return 0


EPILOG = """\
mqadmin's option letters (RocketMQ 4.9), accepted beside the long options:
  -n  the store: shm name or directory of a running store (mqadmin: name server)
  -t  topic                      -g  consumer group           -k  message key
  -i  msgId (queryMsgById), queue id (queryMsgByOffset)       -o  queue offset
  -s  timestamp (resetOffsetByTime)                           -r/-w  read/write queue counts
  -p  perm (updateTopic), body (sendMessage)                  -b/-e  begin/end store time (printMsg)
  -c  tags (sendMessage), message count (consumeMessage)      -b  broker name (queryMsgByOffset: ignored)
`rmq-admin <subcommand> --help` lists each subcommand's options."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rmq-admin",
        description="mqadmin-style commands for rmq-mp stores",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", type=Path, help="store directory (read-only)")
    where.add_argument(
        "--name", "-n", help="shm name (or directory) of a running store (mqadmin's -n: where to look)"
    )
    common.add_argument("--conf", help="broker.conf with the store's settings")
    common.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker.conf property, e.g. mappedFileSizeCommitLog=1048576",
    )
    common.add_argument("--json", action="store_true", help="one JSON object per line")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("printMsg", parents=[common], help="print every message in commit-log order")
    p.add_argument("--begin", "-b", type=int, default=0, help="store time from (ms since the epoch)")
    p.add_argument("--end", "-e", type=int, help="store time to (ms since the epoch)")
    p.add_argument("--topic", "-t")
    p = sub.add_parser("queryMsgByKey", parents=[common], help="messages by KEYS or UNIQ_KEY, newest first")
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--key", "-k", required=True)
    p.add_argument("--max", type=positive_int, help="most messages (default: defaultQueryMaxNum)")
    p.add_argument("--begin", type=int, default=0)
    p.add_argument("--end", type=int)
    p = sub.add_parser("queryMsgById", parents=[common], help="a message by its offset msgId")
    p.add_argument("--id", "--msgId", "-i", dest="id", required=True)
    p = sub.add_parser(
        "queryMsgByOffset", parents=[common], help="a message by topic, queue and queue offset"
    )
    p.add_argument("--topic", "-t", required=True)
    p.add_argument("--queue", "--queueId", "-i", dest="queue", type=int, required=True)
    p.add_argument("--offset", "-o", type=int, required=True)
    p.add_argument("--brokerName", "-b", help="accepted for mqadmin's sake; a store is one broker")
    p = sub.add_parser("topicStatus", parents=[common], help="per queue min/max offset and last update")
    p.add_argument("--topic", "-t")
    p = sub.add_parser(
        "deleteExpiredCommitLog",
        parents=[common],
        help="running store: let the cleaner delete expired commit-log files now, whatever the hour",
    )
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the cleaner's run")
    from rmq_mp.tools import admin_groups
    from rmq_mp.tools.admin_ops import add_parsers

    add_parsers(sub, common)
    admin_groups.add_peek_arguments(sub.choices["consumeMessage"])
    admin_groups.add_parsers(sub, common)
    from rmq_mp.tools import admin_copy, admin_topics

    admin_topics.add_parsers(sub, common)

    admin_copy.add_parsers(sub, common)
    from rmq_mp.tools import promote

    promote.add_parser(sub, common)
    return parser


def canonical_command(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """mqadmin's command names are case-insensitive (``rmq-admin topiclist`` is topicList): the
    first argument, when it names a subcommand in another case, in the parser's spelling."""
    if not argv:
        return argv
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        if isinstance(action, argparse._SubParsersAction):
            names = {name.lower(): name for name in action.choices}
            return [names.get(argv[0].lower(), argv[0]), *argv[1:]]
    return argv


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(canonical_command(parser, list(sys.argv[1:] if argv is None else argv)))
    file_modes.apply("none")  # until a store's config says otherwise (MessageStore.open)
    _utf8_stdout(machine=args.json)
    try:
        code = run(args)
        sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's final flush
        return code
    except StoreError as exc:
        problem = str(exc)
    except BrokenPipeError:
        # The reader (`| head`) went away: stop quietly, and keep the interpreter's final flush
        # of stdout from failing again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # unreadable store files and the like: no traceback either
        problem = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    print(f"rmq-admin: error: {args.store or args.name}: {problem}", file=sys.stderr)
    return 2


def _utf8_stdout(*, machine: bool) -> None:
    """JSON lines are UTF-8 whatever the locale says (the fixture's encoding); a human table in a
    locale that cannot spell a topic gets backslash escapes instead of a UnicodeEncodeError."""
    out = sys.stdout
    if not isinstance(out, io.TextIOWrapper) or codecs.lookup(out.encoding).name == "utf-8":
        return
    if machine:
        out.reconfigure(encoding="utf-8")
    else:
        out.reconfigure(errors="backslashreplace")


if __name__ == "__main__":
    sys.exit(main())
