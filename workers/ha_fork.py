"""A slave whose log forks from its master's (issue 32, RocketMQ #3388): find the last offset both
logs share, on the HA wire as it is.

RocketMQ's slave reports its end and appends whatever comes: a returning old master started as
a slave, or any slave whose log no longer matches, either stalls (the master closes it for a
report beyond its end, #3015; or its frames land inside a record) or silently appends the
master's bytes to a log that is not the master's. rmq-mp's slave checks before it appends. A
non-empty slave does not report its end first but an earlier record boundary X of its own log
(`probe_starts`: the start of its last whole record, then each file start down to its first
byte, and at byte 0 its second record first); a master, RocketMQ's or rmq-mp's, sends from
the first report, so the frames from X are the master's bytes there, and `ForkCheck` compares
them with its own, record by record (bytes, so CRC and position alike: every record holds its
own physical offset and store time):

- all equal up to its end: the logs agree, and what follows is appended as before (MATCHED);
- a difference inside a later record, or the master's log ending (a heartbeat) before the
  slave's end: the logs part at the start of that record, C (FORKED): the slave's bytes from C
  are set aside (`rmq_mp.store.fork`) and the store truncates to C at its next start;
- a difference in the record at X, or nothing at X (the master's log ends at or before X, or
  starts after it): nothing is known below X, so the next probe asks from further back
  (NEXT_PROBE); at the slave's first byte, a differing record means nothing is shared (FORKED
  at it), and nothing there means the slave cannot decide: it refuses, with one line naming X,
  and stays refusing (REFUSED).

Each probe is one connection (a master takes only the first report as where to start). When a
probe finds nothing at all and more than two file starts are left below it, the next connection
is a `Locate` (a report of 0), whose answer skips the probes above the master's end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rmq_mp.errors import HaProtocolError
from rmq_mp.format import ha_frame, record
from rmq_mp.store.mapped_file import offset_to_file_name
from rmq_mp.store.shared_log import SharedCommitLog


class Verdict(enum.Enum):
    PENDING = "pending"
    MATCHED = "matched"
    FORKED = "forked"
    NEXT_PROBE = "next probe"
    REFUSED = "refused"
    LOCATED = "located"


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: Verdict
    offset: int = -1
    """FORKED: the last offset both logs share; REFUSED, NEXT_PROBE: where this probe asked."""
    tail: ha_frame.Frame | None = None
    """MATCHED: the part of the frame past the slave's end, to append."""
    why: str = ""
    differs: bool = False
    """NEXT_PROBE: the master holds other bytes at `offset` (not merely nothing): this slave's log
    is not its master's from there, whatever it was confirmed as."""
    nothing: bool = False
    """NEXT_PROBE: the master had nothing at all at `offset` (its log ends at or below it, or
    begins above it)."""


_PENDING = Outcome(Verdict.PENDING)


def next_record(log: SharedCommitLog, pos: int, file_size: int) -> int:
    """The record boundary after the one at ``pos`` in this store's own log: past the record, or
    the next file's start after an end-of-file blank or a tail too short for one."""
    file_end = pos - pos % file_size + file_size
    if file_end - pos < record.END_FILE_MIN_BLANK_LENGTH:
        return file_end
    mf = log.file_at(pos)
    return _past(pos, *record.peek_size_magic(mf.buf, pos - mf.file_from_offset), file_size)


def _past(pos: int, total: int, magic: int, file_size: int) -> int:
    """`next_record` from the record head at ``pos``: past it, or its file's end."""
    file_end = pos - pos % file_size + file_size
    if magic == record.BLANK_MAGIC_CODE or total <= 0 or pos + total > file_end:
        return file_end
    return pos + total


class LastRecord:
    """The start of the last whole record below an end, found by walking the end's file from its
    start once, then from where the last walk stopped (a reconnect walks only what came since)."""

    def __init__(self, log: SharedCommitLog, file_size: int) -> None:
        self.log = log
        self.file_size = file_size
        self.walked = (-1, -1, -1)
        """(file start, last record start, where the walk stopped)."""

    def below(self, wrote: int, first_byte: int) -> int:
        file_start = max(first_byte, (wrote - 1) - (wrote - 1) % self.file_size)
        walked_file, last, pos = self.walked
        if walked_file != file_start or pos > wrote:
            last = pos = file_start
        while pos < wrote:
            last, pos = pos, next_record(self.log, pos, self.file_size)
        self.walked = (file_start, last, pos)
        return last


def probe_starts(
    log: SharedCommitLog, first_byte: int, wrote: int, file_size: int, last_record: LastRecord | None = None
) -> list[int]:
    """Where to ask the master from, latest first: the start of the last whole record below
    ``wrote``, then each file start down to ``first_byte`` (the log's first byte). A log that
    begins at byte 0 is asked from its second record before 0: a report of 0 is an empty
    slave's, which any master answers from its last file's start, so byte 0 is out of reach
    once the master has rolled past its first file (a returning old master whose log forks
    inside it would otherwise refuse)."""
    if wrote <= first_byte:
        return [first_byte]
    file_start = max(first_byte, (wrote - 1) - (wrote - 1) % file_size)
    last = (last_record or LastRecord(log, file_size)).below(wrote, first_byte)
    starts = [last]
    offset = file_start if file_start < last else file_start - file_size
    while offset >= first_byte:
        starts.append(offset)
        offset -= file_size
    if len(starts) > 1 and starts[-1] == 0 and 0 < (second := _second_record(log, file_size)) < starts[-2]:
        starts.insert(len(starts) - 1, second)
    return starts


def _second_record(log: SharedCommitLog, file_size: int) -> int:
    """`next_record` at byte 0 (the file's size when one record fills it), -1 when the log holds
    no file at byte 0 (the cleaner took it, or an empty slave began at a later file)."""
    try:  # read from the file: a view mapped from a later offset cannot map back to 0
        with (log.mfq.store_dir / offset_to_file_name(0)).open("rb") as first_file:
            head = first_file.read(8)
    except FileNotFoundError:
        return -1
    return _past(0, *record.peek_size_magic(head, 0), file_size) if len(head) == 8 else -1


class ForkCheck:
    """One probe: the master's frames from ``start`` against this slave's own bytes up to ``end``
    (its received end). ``last`` says ``start`` is its first byte: nothing below to ask for."""

    def __init__(self, log: SharedCommitLog, start: int, end: int, file_size: int, *, last: bool) -> None:
        self.log = log
        self.start = start
        self.pos = start
        self.end = end
        self.file_size = file_size
        self.last = last

    def feed(self, frame: ha_frame.Frame) -> Outcome:
        """What this frame shows (PENDING: nothing yet)."""
        if frame.phy_offset != self.pos:
            if self.pos == self.start == 0:  # a report of 0 asks for the file holding the master's end
                return self._below(
                    f"a report of 0 gets the master's last file ({frame.phy_offset}), so its byte 0 cannot be asked for"
                )
            raise HaProtocolError(f"frame at {frame.phy_offset} while comparing from {self.pos}")
        if not frame.data:  # a heartbeat: the master has nothing past pos now
            if self.pos == self.start:
                return self._below(f"the master has nothing at {self.start}", nothing=True)
            return self._forked(self.pos, f"the master's log ends at {self.pos}", differs=False)
        n = min(len(frame.data), self.end - self.pos)
        mf = self.log.file_at(self.pos)
        at = self.pos - mf.file_from_offset
        own = bytes(mf.buf[at : at + n])
        theirs = frame.data[:n]
        if own != theirs:
            first = next(i for i in range(n) if own[i] != theirs[i])
            return self._forked(self.pos + first, f"the bytes at {self.pos + first} differ", differs=True)
        self.pos += n
        if self.pos < self.end:
            return _PENDING
        rest = frame.data[n:]
        return Outcome(Verdict.MATCHED, self.end, ha_frame.Frame(self.end, rest) if rest else None)

    def _forked(self, at: int, why: str, *, differs: bool) -> Outcome:
        """The logs part at the start of this slave's record holding ``at`` (the master's
        end counts as a difference when the slave has more)."""
        boundary = pos = self.start
        while pos <= at and pos < self.end:
            boundary, pos = pos, next_record(self.log, pos, self.file_size)
        if boundary == self.start and not self.last:
            return self._below(f"{why}, in the record at {self.start}", differs=differs)
        return Outcome(Verdict.FORKED, boundary, why=why)

    def _below(self, why: str, *, differs: bool = False, nothing: bool = False) -> Outcome:
        if self.last:
            return Outcome(Verdict.REFUSED, self.start, why=why)
        return Outcome(Verdict.NEXT_PROBE, self.start, why=why, differs=differs, nothing=nothing)


class Locate:
    """Not a probe: a report of 0, which any master answers as an empty slave's, from the start
    of the file holding its end. Its first frame's offset says where the master's log ends to
    within a file, in one connection; walking down from a slave many files ahead took a
    connection and a master's heartbeat interval (5 s by default) a file. `Outcome.offset` of
    LOCATED: the master holds bytes below it (a probe asked from below it finds something,
    unless the master's cleaner took it)."""

    start = pos = 0

    def feed(self, frame: ha_frame.Frame) -> Outcome:
        below = frame.phy_offset + (1 if frame.data else 0)  # a heartbeat: nothing at its offset
        return Outcome(Verdict.LOCATED, below, why=f"the master's log ends in its file at {frame.phy_offset}")


def first_below(starts: list[int], below: int, file_size: int) -> int:
    """The index in ``starts`` (`probe_starts`, latest first) of the first start under ``below``,
    the last (the log's first byte) when none is; byte 0 not before the second record that
    `probe_starts` puts ahead of it (a report of 0 is answered from the master's last file,
    which may have rolled past file 0 since)."""
    index = next((i for i, start in enumerate(starts) if start < below), len(starts) - 1)
    if starts[index] == 0 and index > 0 and 0 < starts[index - 1] < file_size:
        index -= 1
    return index
