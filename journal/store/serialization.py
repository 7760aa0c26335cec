"""JSON for the journal: canonical encoding, fingerprints, and clear errors at the call site.

Two policies meet here (DESIGN.md, "The failure boundary"):

**Input is refused at the door.** ``dumps``/``encode``/``to_json`` refuse, with a
``SerializationError`` naming the path, any value a database or an encoder cannot hold:
non-JSON types, NaN and Infinity, a NUL character (PostgreSQL's text and jsonb refuse it),
a lone surrogate such as ``"\\ud800"`` (not encodable as UTF-8), in a string or a key, and
nesting deeper than ``DURABLE_MAX_NESTING`` levels of arrays and objects (default 64; the
``{"args": [...], "kwargs": {...}}`` envelope of a run's input counts as its first two).
``check_size`` refuses, with ``PayloadTooLargeError``, JSON longer than
``DURABLE_MAX_PAYLOAD_BYTES`` measured in UTF-8 bytes (not in escaped characters). Every
check is one bounded pass over the encoded text, on C-speed string operations; the value
is walked (iteratively) only to name the path once a problem is known to be there.

**What a step produces is made storable.** Text the engine records about what happened (an
exception's type, message and traceback, sandbox output, a recorded value such as a file
listing) goes through ``storable_text``/``storable``/``storable_json``: kept exactly when it
can be stored, else escaped: a lone surrogate becomes the six characters ``\\ud800`` (a
backslash escape, as Python's ``backslashreplace`` writes it) and NUL the six characters
``\\u0000``; a valid surrogate pair given as two code points is joined. Nothing else changes.
A step *result* that cannot be stored is not rewritten: the step fails with a
``SerializationError`` (the workflow's code returned it), so the run fails once, cleanly.
"""

import hashlib
import json
import math
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from journal.store.errors import PayloadTooLargeError, SerializationError

DEFAULT_MAX_NESTING = 64

# The fast checks look at the encoded text as bytes (json.dumps writes ASCII: encoding it is a
# copy) with C-speed searches. In that text: _SUSPECT finds a NUL or any surrogate escape (valid
# pairs too: every emoji); _LONE_ESCAPE a NUL or a surrogate escape that is not half of a pair.
# Both are first looks; _ESCAPES tokenises escaped backslashes, so it alone is exact, and it runs
# only once a first look found something.
_SUSPECT = re.compile(rb"\\u(?:0000|d[89a-f])")
_LONE_ESCAPE = re.compile(rb"\\u(?:0000|d[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})"
                          rb"|(?<!\\ud[89ab][0-9a-f]{2}\\u)d[c-f][0-9a-f]{2})")
_ESCAPED_BACKSLASH = re.compile(rb"\\\\")
_ESCAPED_QUOTE = re.compile(rb'\\"')
_ESCAPES = re.compile(r"(\\\\|\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2})|\\u(?:0000|d[89a-f][0-9a-f]{2})")
_LONE_SURROGATE = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")
_NOT_STRUCTURE = bytes(c for c in range(256) if chr(c) not in '[]{}"')
_BRACKETS_AS_ONE = bytes.maketrans(b"{}", b"[]")  # depth does not depend on the kind of bracket


_cached_nesting: int | None = None


def max_nesting() -> int:
    """DURABLE_MAX_NESTING, read once (an absent setting costs an exception per read; this is on
    the path of every step result). A changed setting (tests) is picked up by the receiver below."""
    global _cached_nesting
    if _cached_nesting is None:
        _cached_nesting = int(getattr(settings, "DURABLE_MAX_NESTING", DEFAULT_MAX_NESTING))
    return _cached_nesting


@receiver(setting_changed)
def _setting_changed(setting: str, **kwargs: Any) -> None:
    global _cached_nesting, _cached_payload_bytes
    if setting == "DURABLE_MAX_NESTING":
        _cached_nesting = None
    elif setting == "DURABLE_MAX_PAYLOAD_BYTES":
        _cached_payload_bytes = None


_cached_payload_bytes: int | None = None


def max_payload_bytes() -> int:
    """DURABLE_MAX_PAYLOAD_BYTES, read once (twice per step otherwise); a changed setting is picked up below."""
    global _cached_payload_bytes
    if _cached_payload_bytes is None:
        _cached_payload_bytes = int(getattr(settings, "DURABLE_MAX_PAYLOAD_BYTES", 1_000_000))
    return _cached_payload_bytes


# -- looking at encoded text (fast) ------------------------------------------------------
def _has_unstorable_escape(text: str, data: bytes | None = None) -> bool:
    """True if JSON text (ensure_ascii) encodes a NUL or a lone surrogate."""
    data = text.encode("ascii", "replace") if data is None else data
    if _SUSPECT.search(data) is None:
        return False
    # A pair-looking escape can hide a lone low surrogate behind an escaped backslash: the JSON
    # text \\ud800\udc00 is the six characters \ud800, then a lone \udc00.
    if _LONE_ESCAPE.search(data) is None and _ESCAPED_BACKSLASH.search(data) is None:
        return False
    return any(m.group(1) is None for m in _ESCAPES.finditer(text))


def _too_deep(text: str, limit: int, data: bytes | None = None) -> bool:
    """True if JSON text nests arrays/objects more than ``limit`` deep. Only brackets and quotes
    are kept; brackets inside strings do not count: adjacent quotes are dropped in pairs (which
    never changes which side of a string a bracket is on), then what is still quoted. A text
    with an escaped quote first loses its escapes, so that every quote left delimits a string."""
    data = text.encode("ascii", "replace") if data is None else data
    s = data.translate(_BRACKETS_AS_ONE, _NOT_STRUCTURE)
    if s.count(b"[") <= limit:
        return False
    if _ESCAPED_QUOTE.search(data) is not None:
        s = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_BRACKETS_AS_ONE, _NOT_STRUCTURE)
    s = s.replace(b'""', b"")
    if b'"' in s:
        s = b"".join(s.split(b'"')[0::2])
    depth = 0
    while s:
        depth += 1
        if depth > limit:
            return True
        shorter = s.replace(b"[]", b"")
        if shorter == s:  # not balanced: cannot happen for text json.dumps wrote
            return True
        s = shorter
    return False


# -- naming the path of a problem (slow, only once one is known) -------------------------
def _path_key(key: str) -> str:
    key = storable_text(key)
    return key if len(key) <= 60 else key[:57] + "..."


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which the database cannot store"
    if not text.isascii():
        m = _LONE_SURROGATE.search(text)
        if m is not None:
            return (f"contains a lone surrogate (\\u{ord(m.group()):04x}), which is not valid Unicode "
                    "and cannot be encoded as UTF-8")
    return None


def _find_bad(value: Any, limit: int | None = None) -> str | None:
    """The first thing in ``value`` the journal cannot store, with its path; iterative, bounded by depth."""
    limit = max_nesting() if limit is None else limit
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, path, depth = stack.pop()
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, str):
            problem = _text_problem(item)
            if problem:
                return f"{path} {problem}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{path} is {item!r} (NaN and Infinity are not JSON)"
        elif isinstance(item, list | tuple | dict):
            if depth >= limit:
                shown = path if len(path) <= 120 else path[:60] + "..." + path[-40:]
                return f"{shown} is nested deeper than {limit} levels (DURABLE_MAX_NESTING)"
            children: list[tuple[Any, str, int]] = []
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str):
                        problem = _text_problem(key)
                        if problem:
                            return f"{path} has a key that {problem}"
                    elif not (key is None or isinstance(key, bool | int | float)):
                        return f"{path} has a key of type {type(key).__name__} ({_path_key(repr(key))})"
                    children.append((child, f"{path}.{_path_key(str(key))}", depth + 1))
            else:
                children = [(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item)]
            stack.extend(reversed(children))
        else:
            return f"{path} is a {type(item).__name__}"
    return None


def _refuse(value: Any, what: str, fallback: str) -> SerializationError:
    return SerializationError(f"{what} must be JSON-serialisable: {_find_bad(value) or fallback}")


# -- the door ------------------------------------------------------------------------------
# json.dumps builds a new encoder on every call with options; these are built once (an encoder
# keeps no state between calls, so threads share them).
_CANONICAL_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
_COMPACT_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _direct(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` less its two Python frames (``encode``, then ``iterencode``): the C encoder that
    ``iterencode`` makes for a one-shot call, made and called here. A step encodes three times (its
    arguments, its result, its record), and those frames cost about as much as the encoding itself.
    Where the C encoder is missing or takes other arguments (checked once, here), the encoder's own
    method serves."""
    make = getattr(json.encoder, "c_make_encoder", None)
    options = (encoder.default, json.encoder.encode_basestring_ascii, None, encoder.key_separator,
               encoder.item_separator, encoder.sort_keys, encoder.skipkeys, encoder.allow_nan)
    circular = encoder.check_circular

    def direct(value: Any) -> str:
        return "".join(make({} if circular else None, *options)(value, 0))

    sample = {"b": [1, 2.5, "\u00e9\x00", None, True], "a": {"c": -0.0}}
    try:
        same = make is not None and encoder.ensure_ascii and direct(sample) == encoder.encode(sample)
    except Exception:  # noqa: BLE001 - another C encoder than this module knows: use the method
        same = False
    return direct if same else encoder.encode


_CANONICAL = _direct(_CANONICAL_ENCODER)
COMPACT = _direct(_COMPACT_ENCODER)  # COMPACT(value): JSON text without spaces, keys in their order


def dumps(value: Any, *, what: str = "value") -> str:
    """Encode canonically (sorted keys) or raise SerializationError naming the offending path."""
    try:
        text = _CANONICAL(value)
    except RecursionError:
        raise _refuse(value, what, f"it is nested deeper than {max_nesting()} levels (DURABLE_MAX_NESTING)"
                      ) from None
    except (TypeError, ValueError) as exc:
        raise _refuse(value, what, storable_text(str(exc))) from None
    data = text.encode("ascii", "replace")
    if _has_unstorable_escape(text, data) or _too_deep(text, max_nesting(), data):
        raise _refuse(value, what, "it holds a NUL, a lone surrogate or nesting the journal cannot store")
    return text


def utf8_size(text: str) -> int:
    """The size in UTF-8 bytes of JSON text written with ensure_ascii, as stored without the escapes."""
    if "\\u" not in text:
        return len(text)
    return len(json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":")).encode("utf-8",
                                                                                              "surrogatepass"))


def check_size(text: str, *, what: str = "payload", limit: int | None = None) -> None:
    """Refuse JSON text longer than the limit in UTF-8 bytes (escapes are never shorter than
    their UTF-8 form, so the exact size is computed only for text longer than the limit)."""
    limit = limit or max_payload_bytes()
    if len(text) > limit and (size := utf8_size(text)) > limit:
        raise PayloadTooLargeError(f"{what} is {size:,} bytes (UTF-8 JSON); the limit is {limit:,} "
                                   "(DURABLE_MAX_PAYLOAD_BYTES)")


def encode(value: Any, *, what: str = "value", limit: bool = True) -> tuple[Any, str]:
    """Return (the value as the journal stores it, its canonical JSON text), validating it."""
    text = dumps(value, what=what)
    if limit:
        check_size(text, what=what)
    if type(value) in _SAME_AFTER_JSON:  # JSON gives back an equal value of the same type: skip the decode
        return value, text
    return json.loads(text), text


# Types whose value json.loads(json.dumps(v)) returns unchanged (a str that could not be stored was
# refused by dumps; a float is written as its repr, which reads back exactly). Not bool's subclasses
# of int, nor str's subclasses: exact types only.
_SAME_AFTER_JSON = frozenset({int, str, bool, float, type(None)})


def to_json(value: Any, *, what: str = "value", limit: bool = True) -> Any:
    """Return the value as the journal will store it (tuples become lists), validating it."""
    return encode(value, what=what, limit=limit)[0]


def check_text(value: str, *, what: str, max_length: int | None = None) -> str:
    """Refuse a name or free text from outside (a signal name, an id) the database cannot store."""
    if not isinstance(value, str):
        raise SerializationError(f"{what} must be text, not {type(value).__name__}")
    if max_length is not None and len(value) > max_length:
        raise SerializationError(f"{what} is {len(value):,} characters; the limit is {max_length:,}")
    problem = _text_problem(value)
    if problem:
        raise SerializationError(f"{what} {problem}")
    return value


def text_fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(value: Any) -> str:
    return hashlib.sha256(dumps(value).encode()).hexdigest()[:16]


# -- making what a step produced storable ---------------------------------------------------
def storable_text(text: str) -> str:
    """Text as the database can store it: unchanged if it can be, else lone surrogates and NUL
    written as backslash escapes (``\\ud800``, ``\\u0000``). Cheap for ordinary text."""
    if not isinstance(text, str):
        text = str(text)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # join valid pairs given as two code points, then escape what is still alone
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if "\x00" in text:
        text = text.replace("\x00", "\\u0000")
    return text


def storable_json(text: str) -> str:
    """JSON text (ensure_ascii) with every NUL and lone surrogate escape made literal text
    (``\\u0000`` -> the characters backslash, u, 0, 0, 0, 0), so jsonb and UTF-8 accept it."""
    if not _has_unstorable_escape(text):
        return text
    return _ESCAPES.sub(lambda m: m.group(0) if m.group(1) else "\\" + m.group(0), text)


def storable(value: Any, *, what: str = "value") -> Any:
    """A produced value (a file listing, a file's text) as the journal can store it: strings and
    keys made storable as ``storable_text`` does. Raises SerializationError for what cannot be
    made JSON at all (other types, NaN, too deep), as ``dumps`` does."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        dumps(value, what=what)  # raises, naming the path
        raise
    if _too_deep(text, max_nesting()):
        dumps(value, what=what)
    if not _has_unstorable_escape(text):
        return value
    return json.loads(storable_json(text))


def exception_text(exc: BaseException) -> tuple[str, str]:
    """(type name, message) of an exception, storable, even when its __str__ raises."""
    try:
        message = str(exc)
    except Exception as failure:  # a hostile __str__ must not take the engine down with it
        message = f"<the exception's message could not be read: {type(failure).__name__}>"
    return storable_text(type(exc).__name__), storable_text(message)
