"""`config/*.json`: RocketMQ's JSON dialect, written atomically and durably, read with a `.bak`.

Mirrors RocketMQ's ``ConfigManager`` (load / loadBak / persist) and the fastjson output its
subclasses write (rocketmq-format.md §14.1). Owns the parse and the layout; the subclasses
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
corrupt file never pushes out the good ``.bak``), and fsyncs the directory. `ConfigManager.load`
falls back to ``.bak`` and never rewrites or deletes the file it could not read: it stays for
forensics until the next persist replaces it.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    as ``int`` keys (quoted keys stay ``str``). Raises `FastJsonError` on anything else."""
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


# ------------------------------------------------------------------------------- ConfigManager


@dataclass(frozen=True, slots=True)
class ConfigFileStatistics:
    """What a `ConfigManager` has done to its file since it was created."""

    loads_from_bak: int
    """Loads that had to use ``<f>.bak`` because ``<f>`` was missing, empty or unreadable."""
    load_failures: int
    """Loads where both files were unusable, so the content started empty."""
    persists: int
    """Persists that wrote new bytes."""
    persists_unchanged: int
    """Persists skipped because ``<f>`` already held exactly those bytes."""


class ConfigManager:
    """One JSON config file, RocketMQ's ``ConfigManager`` made crash-safe.

    Subclasses implement `encode` (content → text), `decode` (text → content; all or nothing:
    build the new state, then rebind attributes, never mutate the old containers in place, and
    raise ``ValueError``/``TypeError``/``KeyError`` for content that does not fit) and `reset`
    (empty content). One process writes a given file (the supervisor); instances are not
    thread-safe.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.loaded_from: Path | None = None
        """The file the last `load` used: `path`, `bak_path`, or None (none found / none usable)."""
        self.load_failures = 0
        """Loads where both `path` and `bak_path` were unusable (content started empty)."""
        self._loads_from_bak = 0
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

    # ---------------------------------------------------------------- load

    def _read(self, path: Path, apply: Callable[[str], None]) -> str:
        """'' when ``path`` was read and ``apply`` accepted its text; otherwise why not."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            return f"unreadable ({exc})"
        return _check(raw, apply)

    def load(self) -> bool:
        """Load ``<f>``, or ``<f>.bak`` when ``<f>`` is missing, empty or unparseable (WARNING).

        Both missing is a new store: True, content untouched. Both unusable: ERROR, content
        reset, `load_failures` counted, False; never raises for file content. Neither file is
        modified: a corrupt ``<f>`` stays for forensics and the next `persist` leaves the ``.bak``
        alone.
        """
        if self.tmp_path.exists():
            log.info("%s: ignoring %s left by an interrupted persist", self.path, self.tmp_path.name)
        problem = self._read(self.path, self.decode)
        if not problem:
            self.loaded_from = self.path
            return True
        bak_problem = self._read(self.bak_path, self.decode)
        if not bak_problem:
            log.warning("%s is %s; loaded %s instead", self.path, problem, self.bak_path.name)
            self.loaded_from = self.bak_path
            self._loads_from_bak += 1
            return True
        self.loaded_from = None
        if problem == "missing" and bak_problem == "missing":
            return True
        self.reset()
        self.load_failures += 1
        log.error(
            "%s is %s and %s is %s; starting with empty content",
            self.path,
            problem,
            self.bak_path.name,
            bak_problem,
        )
        return False

    # ---------------------------------------------------------------- persist

    def _usable(self, text: str) -> None:
        """Raise as `decode` would for ``text``, leaving this manager untouched."""
        copy.copy(self).decode(text)

    def persist(self) -> None:
        """Write the content to ``<f>`` atomically and durably; keep the previous good ``<f>``.

        1. ``<f>.tmp`` in the same directory: write, fsync.
        2. If the current ``<f>`` parses, it becomes ``<f>.bak`` durably (``<f>.bak.tmp``, fsync,
           rename); a corrupt ``<f>`` is not copied, so the good ``.bak`` survives it.
        3. Rename ``<f>.tmp`` over ``<f>``; fsync the directory.

        A crash at any point leaves a complete ``<f>`` (old or new) and a good ``.bak``. When
        ``<f>`` already holds exactly these bytes nothing is rewritten (the ``.bak`` keeps the
        version before), but ``<f>`` is fsynced in case another writer left it unsynced.
        """
        data = self.encode().encode("utf-8")
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        try:
            current: bytes | None = self.path.read_bytes()
        except FileNotFoundError:
            current = None
        if current == data:
            _fsync_path(self.path)
            self._persists_unchanged += 1
            return
        _write_synced(self.tmp_path, data)
        if current is not None and not _check(current, self._usable):
            bak_tmp = self.bak_path.with_name(self.bak_path.name + ".tmp")
            _write_synced(bak_tmp, current)
            os.replace(bak_tmp, self.bak_path)
        elif current is not None:
            log.warning("%s does not parse; keeping %s as it is", self.path, self.bak_path.name)
        os.replace(self.tmp_path, self.path)
        fsync_dir(directory)
        self._persists += 1

    def statistics(self) -> ConfigFileStatistics:
        return ConfigFileStatistics(
            loads_from_bak=self._loads_from_bak,
            load_failures=self.load_failures,
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
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
