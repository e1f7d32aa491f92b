"""`config/*.json`: RocketMQ's JSON dialect, written atomically and durably, read with a `.bak`.

Mirrors RocketMQ's ``ConfigManager`` (load / loadBak / persist) and the fastjson output its
subclasses write (docs/format.md §14.1). Owns the parse and the layout; the subclasses
(`offsets.py`, `topics.py`) own the content.

The dialect
-----------
fastjson writes standard JSON except that a map key that is not a string (a queue id, a delay
level) is written bare: ``{0:250,1:248}``. `loads` reads that back with ``int`` keys and rejects
everything else that is not JSON, with the line and column.

The layout `dumps` writes is fastjson 1.2.x's ``PrettyFormat`` (RocketMQ's
``RemotingSerializable.toJson(obj, true)``)::

    {
    \t"offsetTable":{
    \t\t"%RETRY%group_a@group_a":{0:0
    \t\t},
    \t\t"TopicTest@group_a":{0:250,1:248,2:251,3:250
    \t\t}
    \t}
    }

* a bean or a string-keyed map: ``{``, then each entry on its own line indented one tab deeper,
  ``"key":value`` with no space, entries separated by ``,``; the closing ``}`` on its own line at
  the parent's indentation;
* a map with integer keys: its entries inline, ``key:value`` with the key bare, then a newline
  and the parent's indentation before the ``}`` (the odd ``{0:250\\n\\t\\t}``);
* an empty map: ``{}``; a null map value or bean field: left out;
* strings: ``"``, ``\\`` and ``\\b \\t \\n \\f \\r`` backslash-escaped, other control characters,
  U+007F..U+00A0, U+2028 and U+2029 as upper-case ``\\uXXXX``; everything else (CJK, Greek…)
  raw UTF-8;
* no trailing newline.

Where that comes from:

* fastjson's own serializers, ``MapSerializer.java`` and ``JavaBeanSerializer.java`` in
  github.com/alibaba/fastjson (commit c7e22ead): ``println()`` (newline + one tab per level)
  before each String key and before the closing brace of a non-empty map, none before a non-String
  key; a bean's ``println()`` after ``{`` and after each ``,``; string escapes from
  ``IOUtils.specicalFlags_doubleQuotes`` / ``SerializeWriter.writeStringWithDoubleQuote``.
* a terminal paste of ``cat consumerOffset.json`` in a RocketMQ 4.x source walk-through (yunai,
  "RocketMQ 源码分析 —— Message 拉取与消费"), which shows exactly the two-entry file above with
  ``{0:0`` / ``{1:5`` then ``\\n\\t\\t},``, and an ``ls -l`` in which the empty
  ``consumerOffset.json.bak`` and ``delayOffset.json`` are 21 bytes: ``{\\n\\t"offsetTable":{}\\n}``.
* ``topics.json`` contents quoted in the javadoc of ``TopicConfigSerializeWrapper`` in RocketMQ
  4.9-era forks (``"dataVersion":{\\n\\t\\t"counter":7,\\n\\t\\t"timestamp":1636355958169\\n\\t},``
  and each TopicConfig with fields in alphabetical order: order, perm, readQueueNums,
  topicFilterType, topicName, topicSysFlag, writeQueueNums). 5.x adds ``stateVersion`` and
  ``attributes``, which 4.9 does not write.

Deliberate differences: Java iterates a ``ConcurrentHashMap`` in hash order; `dumps` sorts keys
(integer keys numerically, then string keys) so that the same content always gives the same
bytes. Bean fields come out alphabetical either way, as fastjson's ``SortField`` writes them.
Lists are written inline (the one list in a 4.9 config file, ``consumerFilter.json``'s int[]
``bitPos``, is inline); a Java ``List`` of several items would go one per line, but no 4.9 config
file has one. A lone surrogate is written ``\\uXXXX`` (Java would write ``?``). Floats are
Python's ``repr``, not Java's ``Double.toString``; no file here has one.

Crash safety
------------
RocketMQ's ``MixAll.string2File`` writes ``<f>.tmp``, copies ``<f>`` to ``<f>.bak``, deletes
``<f>`` and renames, all without fsync, and users find empty or unreadable files after a power
loss (issues #3401, #9328). `ConfigManager.persist` fsyncs the temp file before the rename,
replaces ``.bak`` with a durable copy of the current file only when that file is good (so a
corrupt file never pushes out the good ``.bak``; the first persist writes the ``.bak`` too), and
fsyncs the directory.

Damage
------
RocketMQ's files carry no checksum, and one flipped byte in a key is still valid JSON that
moves an offset to another group. `ConfigChecksums` keeps the SHA-256 of what rmq-mp last wrote
to each file in ``<store>/configChecksum.json`` (the config files stay byte-for-byte RocketMQ's;
a file RocketMQ wrote has no entry and is taken as it parses). `ConfigManager.load` falls back to
``.bak``, then salvages entry by entry (`ConfigManager.salvage`), says in `LoadResult` whether
anything may be lost, and never modifies a file: what to do about a loss is the caller's policy
(`rmq_mp.store.message_store` refuses to start unless ``acceptConsumerOffsetLoss``), and
`ConfigManager.set_aside` keeps a damaged file as ``<f>.damaged-<time>``, never overwritten.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmq_mp import file_modes
from rmq_mp.paths import fsync_dir

log = logging.getLogger(__name__)

MAX_NESTING = 256
"""Deeper input is rejected as malformed rather than risking a RecursionError."""


class FastJsonError(json.JSONDecodeError):
    """Text that is not RocketMQ/fastjson JSON. A ``ValueError``; ``msg``, ``pos``, ``lineno`` and
    ``colno`` say what and where; pickles (``JSONDecodeError.__reduce__``)."""


# ---------------------------------------------------------------------------------------- parse

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_INT_KEY = re.compile(r"-?(?:0|[1-9][0-9]*)")
_KEY_START = frozenset('"-0123456789')
_LITERALS = {"t": ("true", True), "f": ("false", False), "n": ("null", None)}


class _Parser:
    """Recursive descent over one document: JSON plus bare integer object keys."""

    def __init__(self, text: str) -> None:
        self.text = text

    def fail(self, msg: str, pos: int) -> FastJsonError:
        return FastJsonError(msg, self.text, pos)

    def ws(self, pos: int) -> int:
        match = _WS.match(self.text, pos)
        assert match is not None  # `*` always matches
        return match.end()

    def document(self) -> Any:
        value, pos = self.value(self.ws(0), 0)
        pos = self.ws(pos)
        if pos != len(self.text):
            raise self.fail("Extra data after the document", pos)
        return value

    def value(self, pos: int, depth: int) -> tuple[Any, int]:
        text = self.text
        c = text[pos : pos + 1]
        if c == "{":
            return self.object(pos, depth + 1)
        if c == "[":
            return self.array(pos, depth + 1)
        if c == '"':
            return self.string(pos)
        if c in _LITERALS:
            word, literal = _LITERALS[c]
            if text.startswith(word, pos):
                return literal, pos + len(word)
        match = _NUMBER.match(text, pos)
        if match is None:
            raise self.fail("Expecting value", pos)
        if match.group(1) is None and match.group(2) is None:
            return self.integer(match.group(), pos), match.end()
        number = float(match.group())
        if math.isinf(number):
            raise self.fail("Number out of range", pos)
        return number, match.end()

    def integer(self, digits: str, pos: int) -> int:
        try:
            return int(digits)
        except ValueError as exc:  # beyond sys.get_int_max_str_digits()
            raise self.fail(f"Integer too long ({len(digits)} digits)", pos) from exc

    def string(self, pos: int) -> tuple[str, int]:
        try:
            text, end = json.decoder.scanstring(self.text, pos + 1, True)  # type: ignore[attr-defined]
        except json.JSONDecodeError as exc:
            raise self.fail(exc.msg, exc.pos) from None
        return str(text), int(end)

    def object(self, pos: int, depth: int) -> tuple[dict[Any, Any], int]:
        if depth > MAX_NESTING:
            raise self.fail(f"Nesting deeper than {MAX_NESTING}", pos)
        result: dict[Any, Any] = {}
        pos = self.ws(pos + 1)
        if self.text[pos : pos + 1] == "}":
            return result, pos + 1
        while True:
            key_pos = pos
            c = self.text[pos : pos + 1]
            key: str | int
            if c == '"':
                key, pos = self.string(pos)
            elif c and c in _KEY_START:
                match = _INT_KEY.match(self.text, pos)
                if match is None:
                    raise self.fail("Expecting property name: a string or an integer", pos)
                key, pos = self.integer(match.group(), pos), match.end()
            else:
                raise self.fail("Expecting property name: a string or an integer", pos)
            pos = self.ws(pos)
            if self.text[pos : pos + 1] != ":":
                raise self.fail("Expecting ':' delimiter", pos)
            if key in result:  # Java maps have none: a changed byte made two keys equal
                raise self.fail(f"Duplicate key {key!r}", key_pos)
            result[key], pos = self.value(self.ws(pos + 1), depth)
            pos = self.ws(pos)
            c = self.text[pos : pos + 1]
            if c == "}":
                return result, pos + 1
            if c != ",":
                raise self.fail("Expecting ',' delimiter or '}'", pos)
            pos = self.ws(pos + 1)

    def array(self, pos: int, depth: int) -> tuple[list[Any], int]:
        if depth > MAX_NESTING:
            raise self.fail(f"Nesting deeper than {MAX_NESTING}", pos)
        result: list[Any] = []
        pos = self.ws(pos + 1)
        if self.text[pos : pos + 1] == "]":
            return result, pos + 1
        while True:
            item, pos = self.value(pos, depth)
            result.append(item)
            pos = self.ws(pos)
            c = self.text[pos : pos + 1]
            if c == "]":
                return result, pos + 1
            if c != ",":
                raise self.fail("Expecting ',' delimiter or ']'", pos)
            pos = self.ws(pos + 1)


def loads(text: str) -> Any:
    """Parse RocketMQ/fastjson JSON: standard JSON, plus bare integer object keys, which come back
    as ``int`` keys (quoted keys stay ``str``). Raises `FastJsonError` on anything else, a key
    repeated in one object included (fastjson never writes one; a changed byte can make one)."""
    if not isinstance(text, str):
        raise TypeError(f"loads() takes str, not {type(text).__name__}")
    return _Parser(text).document()


# ----------------------------------------------------------------------------------------- dump

_ESCAPE_CHARS = re.compile('["\\\\\x00-\x1f\x7f-\xa0\u2028\u2029\ud800-\udfff]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    return _SHORT_ESCAPES.get(c) or f"\\u{ord(c):04X}"


def _quote(text: str) -> str:
    return '"' + _ESCAPE_CHARS.sub(_escape, text) + '"'


def _key_order(key: Any) -> tuple[int, Any]:
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise TypeError(f"map keys must be str or int, not {type(key).__name__}: {key!r}")
    return (0, key) if isinstance(key, int) else (1, key)


def _write(value: Any, depth: int, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True or value is False:
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no JSON form")
        out.append(repr(value))
    elif isinstance(value, str):
        out.append(_quote(value))
    elif isinstance(value, Mapping):
        _write_map(value, depth, out)
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, depth, out)
        out.append("]")
    else:
        raise TypeError(f"cannot write {type(value).__name__} as JSON: {value!r}")


def _write_map(value: Mapping[Any, Any], depth: int, out: list[str]) -> None:
    if not value:
        out.append("{}")
        return
    out.append("{")
    inner = "\n" + "\t" * (depth + 1)
    first = True
    for key in sorted(value, key=_key_order):
        item = value[key]
        if item is None:
            continue  # fastjson leaves null map values and bean fields out
        if not first:
            out.append(",")
        first = False
        if isinstance(key, str):
            out.append(inner)
            out.append(_quote(key))
        else:
            out.append(str(int(key)))
        out.append(":")
        _write(item, depth + 1, out)
    out.append("\n" + "\t" * depth + "}")


def dumps(value: Any) -> str:
    """fastjson's pretty format for RocketMQ's config wrappers (layout in the module docstring):
    dicts with str keys as beans, int keys bare and inline, keys sorted, non-ASCII raw."""
    out: list[str] = []
    _write(value, 0, out)
    return "".join(out)


# ---------------------------------------------------------------------------- checksum record

CHECKSUMS_NAME = "configChecksum.json"
"""`ConfigChecksums`' file, in the store root."""

DAMAGED_INFIX = ".damaged-"
"""A damaged config file is kept as ``<name>.damaged-<UTC time>`` (`set_aside`)."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def set_aside(path: Path) -> Path:
    """Rename a damaged file to ``<name>.damaged-<UTC time>[-n]`` for forensics, never over an
    existing file (a hard link fails rather than replace), durably. Returns the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        target = path.with_name(f"{path.name}{DAMAGED_INFIX}{stamp}{f'-{n}' if n else ''}")
        try:
            os.link(path, target)
        except FileExistsError:
            continue
        os.unlink(path)
        fsync_dir(path.parent)
        return target
    raise FileExistsError(f"{path}: 1000 damaged copies from this second already kept")


class ConfigChecksums:
    """``<store>/configChecksum.json``: for each config file rmq-mp persisted, the SHA-256 of the
    contents that may legitimately be in it or in its ``.bak`` (the newest first, then the one
    before it) and when it was written.

    RocketMQ's config files carry no checksum, and one changed byte inside a key is still valid
    JSON that moves an offset to another group. The config files stay byte-for-byte RocketMQ's;
    this record sits beside them, in the store root rather than in ``config/``, so that a lost
    ``config/`` is noticed as well. A file without an entry (written by RocketMQ, or by nobody yet)
    is taken as it parses. The supervisor and rmq-admin persist different files concurrently, so
    each update is a read-modify-write under an flock of the store root; written atomically and
    durably.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def of_config_file(cls, path: Path) -> ConfigChecksums | None:
        """The record a store's ``<root>/config/<name>`` is checked against, so that every
        writer (supervisor, rmq-admin, tests) keeps the same one; None for a file elsewhere."""
        path = Path(path)
        return cls(path.parent.parent / CHECKSUMS_NAME) if path.parent.name == "config" else None

    def read(self) -> tuple[dict[str, Any], str]:
        """(entries by file name, problem): problem is '' when the record is good or absent."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}, ""
        except OSError as exc:
            return {}, f"unreadable ({exc})"
        try:
            data = loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return {}, f"unparseable ({exc})"
        if not isinstance(data, dict) or not all(
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), list)
            and entry["sha256"]
            and all(isinstance(d, str) for d in entry["sha256"])
            for entry in data.values()
        ):
            return {}, 'not {"<file>": {"sha256": [...]}}'
        return data, ""

    def update(self, name: str, digests: list[str]) -> None:
        """Record ``digests`` (newest first) as the contents ``name`` and its ``.bak`` may hold."""
        directory = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(directory, fcntl.LOCK_EX)
            entries, problem = self.read()
            if problem and self.path.exists():
                log.warning("%s is %s; kept as %s", self.path, problem, set_aside(self.path).name)
            entries[name] = {"persistedAt": time.time_ns() // 1_000_000, "sha256": digests}
            tmp = self.path.with_name(self.path.name + ".tmp")
            _write_synced(tmp, dumps(entries).encode("utf-8"))
            os.replace(tmp, self.path)
            os.fsync(directory)
        finally:
            os.close(directory)  # releases the flock


# ------------------------------------------------------------------------------- ConfigManager


@dataclass(frozen=True, slots=True)
class ConfigFileStatistics:
    """What a `ConfigManager` has done to its file since it was created."""

    loads_from_bak: int
    """Loads that had to use ``<f>.bak`` because ``<f>`` was missing, damaged or unreadable."""
    load_failures: int
    """Loads where nothing could be used or salvaged, so the content started empty."""
    salvaged_loads: int
    """Loads whose content was pieced together from damaged files (`ConfigManager.salvage`)."""
    persists: int
    """Persists that wrote new bytes."""
    persists_unchanged: int
    """Persists skipped because ``<f>`` already held exactly those bytes."""


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one `ConfigManager.load` found and did."""

    path: Path
    used: Path | None
    """The file loaded as it is (`path` or its ``.bak``); None when salvaged, reset or fresh."""
    problems: tuple[tuple[Path, str], ...] = ()
    """Each file that could not be used as it is, and why (``missing`` included)."""
    salvaged: str = ""
    """What `ConfigManager.salvage` recovered from damaged files, in words; '' when it did not run."""
    expected: bool = False
    """The checksum record says rmq-mp persisted this file, so its absence is a loss."""
    lost: bool = False
    """The content may be older or smaller than what was last persisted: the file is missing or
    damaged and no copy of its newest content was found."""

    @property
    def damaged(self) -> tuple[Path, ...]:
        """Files that are there but unusable (`ConfigManager.set_aside` moves them)."""
        return tuple(path for path, why in self.problems if why and why != "missing")

    def describe(self) -> str:
        """One line: which file is wrong and how, and what the content now holds."""
        why = "; ".join(f"{p.name} is {reason}" for p, reason in self.problems) or f"{self.path.name} is fine"
        if self.used is not None:
            return f"{why}; loaded {self.used.name}"
        if self.salvaged:
            return f"{why}; salvaged {self.salvaged}"
        return f"{why}; nothing to salvage"


class ConfigManager:
    """One JSON config file, RocketMQ's ``ConfigManager`` made crash-safe and damage-aware.

    Subclasses implement `encode` (content → text), `decode` (text → content; all or nothing:
    build the new state, then rebind attributes, never mutate the old containers in place, and
    raise ``ValueError``/``TypeError``/``KeyError`` for content that does not fit), `reset`
    (empty content) and, where entries can be recovered one by one, `salvage`. One process
    writes a given file at a time (the supervisor, or rmq-admin under the store's flags lock or
    with the store stopped); instances are not thread-safe.

    A file in a store's ``config/`` is checked against the store's `ConfigChecksums` record; a
    lone file elsewhere has none, and damage that still parses cannot be told from content.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.checksums = ConfigChecksums.of_config_file(self.path)
        self.loaded_from: Path | None = None
        """The file the last `load` used as it is: `path`, `bak_path`, or None."""
        self.load_failures = 0
        """Loads where nothing was usable or salvageable (content started empty)."""
        self.last_load = LoadResult(self.path, None)
        self._loads_from_bak = 0
        self._salvaged_loads = 0
        self._persists = 0
        self._persists_unchanged = 0

    @property
    def bak_path(self) -> Path:
        return self.path.with_name(self.path.name + ".bak")

    @property
    def tmp_path(self) -> Path:
        return self.path.with_name(self.path.name + ".tmp")

    # ---------------------------------------------------------------- subclass hooks

    def encode(self) -> str:
        """The file's full text (usually ``dumps(...)``)."""
        raise NotImplementedError

    def decode(self, text: str) -> None:
        """Replace the content with the file text's (all or nothing; see the class docstring)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Empty content: what a store starts with when neither file can be read."""
        raise NotImplementedError

    def salvage(self, texts: list[str]) -> str:
        """Replace the content with every entry that can still be read from ``texts`` (damaged
        file contents, newest first; a good ``.bak`` may be among them) and say what that is in
        words ('' when nothing). Subclasses without entry-wise recovery leave this out."""
        raise NotImplementedError

    # ---------------------------------------------------------------- load

    def _digests(self) -> tuple[list[str] | None, str]:
        """The checksum record's digests for this file (None: no entry) and a problem with it."""
        if self.checksums is None:
            return None, ""
        entries, problem = self.checksums.read()
        entry = entries.get(self.path.name)
        return (list(entry["sha256"]) if entry else None), problem

    def _verify(self, raw: bytes, digests: list[str] | None) -> str:
        """'' when ``raw`` parses and matches the checksum record (if any); otherwise why not."""
        problem = _check(raw, self._usable)
        if not problem and digests is not None and sha256_hex(raw) not in digests:
            problem = (
                f"not what rmq-mp last wrote (it parses, but its SHA-256 is not in "
                f"{CHECKSUMS_NAME}: a changed byte, or an edit by another program)"
            )
        return problem

    def _examine(self, path: Path, digests: list[str] | None) -> tuple[bytes | None, str]:
        """(bytes, '') when ``path`` is usable; otherwise what it holds (None when it cannot be
        read) and why not."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None, "missing"
        except OSError as exc:
            return None, f"unreadable ({exc.strerror or exc})"
        return raw, self._verify(raw, digests)

    def load(self) -> bool:
        """Load ``<f>``; when it is missing or damaged, its ``.bak``; when both are damaged (or
        the ``.bak`` is older than the damaged ``<f>``), `salvage` them. True when the content is
        what was last persisted (or there is none yet: a new store); False when something may be
        lost (`last_load` says what; logged as an ERROR).

        Never raises for file content and never modifies a file: a damaged one stays in place
        until `set_aside` (the caller decides whether the loss is accepted).
        """
        if self.tmp_path.exists():
            log.info("%s: ignoring %s left by an interrupted persist", self.path, self.tmp_path.name)
        digests, record_problem = self._digests()
        if record_problem:
            log.warning(
                "%s is %s: %s cannot be checked against it", CHECKSUMS_NAME, record_problem, self.path.name
            )
        result = self._load(digests)
        self.last_load = result
        self.loaded_from = result.used
        if result.used == self.bak_path:
            self._loads_from_bak += 1
        if result.salvaged:
            self._salvaged_loads += 1
        if result.lost and result.used is None and not result.salvaged:
            self.load_failures += 1
        if result.lost:
            log.error("%s: %s", self.path, result.describe())
        elif result.damaged or result.used == self.bak_path:
            log.warning("%s: %s (the newest content: nothing lost)", self.path, result.describe())
        return not result.lost

    def _load(self, digests: list[str] | None) -> LoadResult:
        raw, problem = self._examine(self.path, digests)
        if not problem:
            assert raw is not None
            self.decode(raw.decode("utf-8"))
            return LoadResult(self.path, self.path)
        bak_raw, bak_problem = self._examine(self.bak_path, digests)
        problems = tuple((p, why) for p, why in ((self.path, problem), (self.bak_path, bak_problem)) if why)
        expected = digests is not None
        if problem == bak_problem == "missing":
            if expected:
                self.reset()
            return LoadResult(self.path, None, problems, expected=expected, lost=expected)
        bak_good = bak_raw is not None and not bak_problem
        # The .bak holds the newest content after a first persist (or one cut short): no loss.
        newest = bak_good and digests is not None and sha256_hex(bak_raw or b"") == digests[0]
        salvaged = ""
        if not (newest or (bak_good and raw is None)):
            texts = [data.decode("utf-8", "replace") for data in (raw, bak_raw) if data]
            try:
                salvaged = self.salvage(texts) if texts else ""
            except NotImplementedError:
                salvaged = ""
        if salvaged:
            return LoadResult(self.path, None, problems, salvaged=salvaged, expected=expected, lost=True)
        if bak_good:
            assert bak_raw is not None
            self.decode(bak_raw.decode("utf-8"))
            return LoadResult(self.path, self.bak_path, problems, expected=expected, lost=not newest)
        self.reset()
        return LoadResult(self.path, None, problems, expected=expected, lost=True)

    def set_aside(self) -> list[Path]:
        """Move the files the last `load` found damaged to ``<name>.damaged-<time>`` (kept, never
        overwritten), so that the next persist starts clean. Returns their new paths."""
        moved = []
        for path in self.last_load.damaged:
            if path.exists():
                moved.append(set_aside(path))
                log.warning("%s kept as %s", path, moved[-1].name)
        return moved

    # ---------------------------------------------------------------- persist

    def _usable(self, text: str) -> None:
        """Raise as `decode` would for ``text``, leaving this manager untouched."""
        copy.copy(self).decode(text)

    def persist(self) -> None:
        """Write the content to ``<f>`` atomically and durably; keep the previous good ``<f>``.

        1. ``<f>.tmp`` in the same directory: write, fsync.
        2. The ``.bak`` (``<f>.bak.tmp``, fsync, rename): the current ``<f>`` when it is good,
           the new content when there is no ``<f>`` yet (so a first persist leaves a ``.bak``
           too); a damaged ``<f>`` is set aside instead and the good ``.bak`` survives it.
        3. Rename ``<f>.tmp`` over ``<f>``; fsync the directory.

        With a checksum record, its entry lists the new content and whatever the ``.bak`` holds
        before and after; it is updated before step 2 when the file already had an entry (so
        every file always matches it), otherwise after step 3 (a file without an entry is taken
        as it parses).

        A crash at any point leaves a complete ``<f>`` (old or new) or a ``.bak`` with the newest
        content, each matching the record. When ``<f>`` already holds exactly these bytes nothing
        is rewritten, but ``<f>`` is fsynced in case another writer left it unsynced.
        Raises ``OSError`` (a full disk, a directory in the way): the caller decides; nothing
        that was good is lost.
        """
        data = self.encode().encode("utf-8")
        directory = self.path.parent
        directory.mkdir(mode=file_modes.dir_mode(), parents=True, exist_ok=True)
        digests, _ = self._digests()
        try:
            current: bytes | None = self.path.read_bytes()
        except FileNotFoundError:
            current = None
        problem = "missing" if current is None else self._verify(current, digests)
        new_digest = sha256_hex(data)
        if current == data and not problem:
            _fsync_path(self.path)
            if self.checksums is not None and digests is None:
                self.checksums.update(self.path.name, [new_digest])
            self._persists_unchanged += 1
            return
        _write_synced(self.tmp_path, data)
        bak_raw, bak_problem = self._examine(self.bak_path, digests)
        bak_digest = [sha256_hex(bak_raw)] if bak_raw is not None and not bak_problem else []
        # The new .bak: the good current file, the new content for a first persist, or (the
        # current file damaged) the .bak as it is.
        bak = data if current is None else current if not problem else None
        record = list(dict.fromkeys([new_digest, *([sha256_hex(bak)] if bak else []), *bak_digest]))
        if self.checksums is not None and digests is not None:
            self.checksums.update(self.path.name, record)
        if bak is not None:
            bak_tmp = self.bak_path.with_name(self.bak_path.name + ".tmp")
            _write_synced(bak_tmp, bak)
            os.replace(bak_tmp, self.bak_path)
        elif current is not None:
            log.warning("%s is %s; kept as %s", self.path, problem, set_aside(self.path).name)
        os.replace(self.tmp_path, self.path)
        fsync_dir(directory)
        if self.checksums is not None and digests is None:
            self.checksums.update(self.path.name, record[:2])
        self._persists += 1

    def statistics(self) -> ConfigFileStatistics:
        return ConfigFileStatistics(
            loads_from_bak=self._loads_from_bak,
            load_failures=self.load_failures,
            salvaged_loads=self._salvaged_loads,
            persists=self._persists,
            persists_unchanged=self._persists_unchanged,
        )


def _check(raw: bytes, apply: Callable[[str], None]) -> str:
    """'' when ``apply`` accepted ``raw`` as UTF-8 text; otherwise why not."""
    if not raw.strip():
        return "empty" if not raw else "blank"
    try:
        apply(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return f"not UTF-8 ({exc})"
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return f"unparseable ({exc})"
    return ""


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_modes.file_mode())
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
