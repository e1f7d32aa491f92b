"""`config/*.json`: RocketMQ's JSON dialect, written atomically and durably, read with a `.bak`.

RocketMQ serialises these files with fastjson's pretty format (rocketmq-format.md §14.1):

    {
        "offsetTable":{
                "TopicTest@group_a":{0:250,1:248,2:251,3:250
                }
        }
    }

Beans and string-keyed maps put each entry on its own tab-indented line; maps with integer keys
write them unquoted and inline (not standard JSON), with a newline before the closing brace; an
empty map is ``{}``; non-ASCII text is written raw. This layout was matched against a RocketMQ
source comment quoting a broker's consumerOffset.json (``"…@CID_RMQ_SYS_TRANS":{0:26`` then a
newline and tabs before ``}``).

RocketMQ persists with tmp/.bak/rename and no fsync, and users find empty or truncated files
after a power loss (issues #3401, #9328). `ConfigManager.persist` writes a temp file, fsyncs it,
keeps the previous good version as ``.bak`` (durably), renames, and fsyncs the directory;
`load` falls back to ``.bak`` when the main file is missing, empty or does not parse, and never
deletes or rewrites a corrupt file while loading.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from rmq_mp.paths import fsync_dir

log = logging.getLogger(__name__)

_INT_KEY = "\x00int:"
_STR_KEY = "\x00str:"
"""Markers the pre-pass gives bare integer keys and quoted keys that begin with NUL, so the two
can never be confused."""


class FastJsonError(ValueError):
    """The text is not RocketMQ/fastjson JSON."""


def _quote_int_keys(text: str) -> str:
    """Quote bare integer keys (``{0:``, ``,12:``) outside strings with a marker prefix."""
    out: list[str] = []
    i, n = 0, len(text)
    expecting_key = False
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            token = text[i : j + 1]
            if expecting_key and token.startswith('"\\u0000'):
                token = '"' + json.dumps(_STR_KEY)[1:-1] + token[1:]  # keep a NUL-led key unambiguous
            out.append(token)
            i = j + 1
            expecting_key = False
            continue
        if c in "{,":
            expecting_key = True
        elif expecting_key and (c == "-" or c.isdigit()):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":":
                out.append(json.dumps(_INT_KEY + text[i:j]))
                i = j
                expecting_key = False
                continue
            expecting_key = False
        elif not c.isspace():
            expecting_key = False
        out.append(c)
        i += 1
    return "".join(out)


def _key(key: str) -> Any:
    if key.startswith(_INT_KEY):
        return int(key[len(_INT_KEY) :])
    return key[len(_STR_KEY) :] if key.startswith(_STR_KEY) else key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[Any, Any]:
    return {_key(k): v for k, v in pairs}


def loads(text: str) -> Any:
    """Parse fastjson output: standard JSON plus unquoted integer map keys (as ``int`` keys)."""
    try:
        return json.loads(_quote_int_keys(text), object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise FastJsonError(
            f"not valid RocketMQ JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc


def _scalar(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def dumps(value: Any, depth: int = 0) -> str:
    """fastjson's pretty format (see the module docstring)."""
    if not isinstance(value, dict):
        return _scalar(value)
    if not value:
        return "{}"
    inner = "\t" * (depth + 1)
    closing = "\n" + "\t" * depth + "}"
    if all(isinstance(k, int) for k in value):
        return "{" + ",".join(f"{k}:{dumps(v, depth + 1)}" for k, v in value.items()) + closing
    entries = ",".join(f"\n{inner}{_scalar(str(k))}:{dumps(v, depth + 1)}" for k, v in value.items())
    return "{" + entries + closing


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ConfigManager:
    """One JSON config file (RocketMQ's ConfigManager). Subclasses give `encode`/`decode`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.load_failures = 0
        """Times both the file and its ``.bak`` were unusable (content started empty)."""

    @property
    def bak_path(self) -> Path:
        return self.path.with_name(self.path.name + ".bak")

    def encode(self) -> Any:
        raise NotImplementedError

    def decode(self, data: Any) -> None:
        raise NotImplementedError

    def _try(self, path: Path) -> str:
        """'' if ``path`` loaded into this manager, else why not."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return "missing"
        except (OSError, UnicodeDecodeError) as exc:
            return f"unreadable: {exc}"
        if not text.strip():
            return "empty"
        try:
            self.decode(loads(text))
        except (FastJsonError, KeyError, TypeError, ValueError, AttributeError) as exc:
            return f"does not parse: {exc}"
        return ""

    def load(self) -> bool:
        """Load the file, or its ``.bak``; False (and empty content, counted) if neither works."""
        problem = self._try(self.path)
        if not problem:
            return True
        if problem != "missing":
            log.warning("%s %s; trying %s", self.path, problem, self.bak_path.name)
        bak_problem = self._try(self.bak_path)
        if not bak_problem:
            log.warning("loaded %s from %s", self.path.name, self.bak_path)
            return True
        if problem == "missing" and bak_problem == "missing":
            return True  # a new store: nothing to load
        self.decode(self.encode_empty())
        self.load_failures += 1
        log.error("%s: %s, and %s: %s; starting empty", self.path, problem, self.bak_path.name, bak_problem)
        return False

    def encode_empty(self) -> Any:
        """The content of an empty manager (for a failed load)."""
        raise NotImplementedError

    def persist(self) -> None:
        """Write atomically and durably, keeping the previous good version as ``.bak``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = dumps(self.encode()).encode("utf-8")
        previous = self._good_current()
        if previous is not None:
            _write_durably(self.bak_path, previous)
        _write_durably(self.path, data)
        fsync_dir(self.path.parent)

    def _good_current(self) -> bytes | None:
        """The current file's bytes if they parse (a corrupt file must not replace a good .bak)."""
        try:
            raw = self.path.read_bytes()
            loads(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, FastJsonError):
            return None
        return raw if raw.strip() else None
