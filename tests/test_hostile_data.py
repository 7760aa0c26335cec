"""Hostile data at the failure boundary (DESIGN.md): input a database or an encoder cannot hold is
refused at the door before anything is written; what a step produces is made storable, so a run
fails once, cleanly, and is never left running.

Runs on both databases: PostgreSQL is the strict one (text and jsonb refuse NUL and lone
surrogates), SQLite shows the same behaviour is the engine's, not the database's."""

import json

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import journal
from journal.driver.worker import EmbeddedWorker
from journal.models import EventKind, Run, RunStatus, SessionEvent, Signal, TraceSpan
from journal.store.serialization import _CANONICAL, COMPACT, encode
from tests.agents import hostile

pytestmark = pytest.mark.django_db(transaction=True)


def drive_until_idle(seconds: float = 30) -> None:
    """An embedded worker until nothing is runnable. A run stuck by a failed write would be
    reclaimed and re-run every lease; the assertions on executions and events catch that."""
    EmbeddedWorker(concurrency=1, poll_interval=0.02).run(until_idle=True, max_seconds=seconds)


def kinds(run_id) -> list[str]:
    return list(SessionEvent.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))


def rows() -> tuple[int, int, int]:
    return Run.objects.count(), SessionEvent.objects.count(), Signal.objects.count()


# -- what a step produces ---------------------------------------------------------------
@pytest.mark.parametrize(("kind", "escaped"), [("surrogate", "bad byte \\ud800 here"), ("nul", "nul \\u0000 here")])
def test_a_step_raising_an_unstorable_message_fails_the_run_once_and_its_error_reads_back(kind, escaped):
    run_id = journal.start("hostile-raise", kind)
    drive_until_idle()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED, (run.status, run.error)
    assert hostile.executions() == [f"raise {kind}"]  # ran once: never reclaimed and run again
    assert kinds(run_id).count(EventKind.RUN_FAILED) == 1 and EventKind.RUN_RECOVERED not in kinds(run_id)
    # the stored error is the message, with only the unstorable character written as an escape
    assert run.error_type == "StepError" and escaped in run.error and "HostileMessageError" in run.error
    failed = SessionEvent.objects.get(run_id=run_id, kind=EventKind.STEP_FAILED)
    assert failed.payload["error"] == {"type": "HostileMessageError", "message": escaped}
    final = SessionEvent.objects.get(run_id=run_id, kind=EventKind.RUN_FAILED)
    assert escaped in final.payload["error"] and escaped in final.payload["traceback"]
    span = TraceSpan.objects.get(run_id=run_id, status="error")
    assert span.error == f"HostileMessageError: {escaped}"
    for text in (run.error, failed.payload["error"]["message"], final.payload["traceback"], span.error):
        text.encode("utf-8")  # readable: valid Unicode, as a page or the API will render it
        assert "\x00" not in text


@pytest.mark.parametrize(("kind", "message"), [
    ("deep", "nested deeper than 64 levels"),
    ("nested65", "nested deeper than 64 levels"),
    ("surrogate", "$.k contains a lone surrogate (\\ud800)"),
    ("nul", "$[0] contains a NUL character"),
    ("nan", "$ is nan"),
])
def test_a_step_returning_a_value_that_cannot_be_stored_fails_the_run_once(kind, message):
    run_id = journal.start("hostile-result", kind)
    drive_until_idle()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED, (run.status, run.error)
    assert run.error_type == "SerializationError" and "RecursionError" not in run.error
    assert run.error.startswith("SerializationError: the result of step tests.agents.hostile.produce must be "
                                "JSON-serialisable: $") and message in run.error
    assert hostile.executions() == [f"produce {kind}"]
    assert kinds(run_id).count(EventKind.RUN_FAILED) == 1 and EventKind.RUN_RECOVERED not in kinds(run_id)
    # nothing was recorded for the step: the value never reached the journal
    assert not SessionEvent.objects.steps().filter(run_id=run_id, step_name="tests.agents.hostile.produce").exists()


def test_a_recorded_value_is_made_storable_and_replays_the_same():
    run_id = journal.start("hostile-produced")
    drive_until_idle()
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    journal.signal(run_id, "go")
    drive_until_idle()  # the resumed run replays the recorded value
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"value": {"text": "nul\\u0000 lone\\udcff", "name\\udcff": 1}}


def test_storable_text_keeps_what_can_be_stored_and_escapes_only_what_cannot():
    from journal.store.serialization import storable_text

    assert storable_text("plain") == "plain"
    assert storable_text("caf\u00e9 \U0001f600") == "caf\u00e9 \U0001f600"
    assert storable_text("a\ud800b\x00c") == "a\\ud800b\\u0000c"
    assert storable_text("\ud83d\ude00") == "\U0001f600"  # a valid pair given as two code points is joined


# -- the door: refused before anything is written -------------------------------------------
# (value, what the error says) for the input of a run, whose path starts at $.args[0]. The
# envelope {"args": [...]} counts: 63 levels inside it are 65 in all.
HOSTILE_INPUTS = [
    pytest.param("x\ud800", r"\$.args\[0\] contains a lone surrogate \(\\ud800\)", id="surrogate"),
    pytest.param({"k\udc00ey": 1}, r"\$.args\[0\] has a key that contains a lone surrogate", id="surrogate-key"),
    pytest.param(["ok", "a\x00b"], r"\$.args\[0\]\[1\] contains a NUL", id="nul"),
    pytest.param({"\x00": 1}, r"\$.args\[0\] has a key that contains a NUL", id="nul-key"),
    pytest.param(hostile.deep(10_000), "nested deeper than 64 levels", id="deep-10000"),
    pytest.param(hostile.deep(63), "nested deeper than 64 levels", id="deep-65-in-all"),
    pytest.param({"x": float("nan")}, r"\$.args\[0\].x is nan", id="nan"),
    pytest.param([float("-inf")], r"\$.args\[0\]\[0\] is -inf", id="infinity"),
]

# the same for a signal payload, the root of its own path
HOSTILE_PAYLOADS = [
    pytest.param("x\ud800", r"\$ contains a lone surrogate", id="surrogate"),
    pytest.param({"k\udc00ey": 1}, r"\$ has a key that contains a lone surrogate", id="surrogate-key"),
    pytest.param(["ok", "a\x00b"], r"\$\[1\] contains a NUL", id="nul"),
    pytest.param({"\x00": 1}, r"\$ has a key that contains a NUL", id="nul-key"),
    pytest.param(hostile.deep(10_000), "nested deeper than 64 levels", id="deep-10000"),
    pytest.param(hostile.deep(65), "nested deeper than 64 levels", id="deep-65"),
    pytest.param({"x": float("nan")}, r"\$.x is nan", id="nan"),
    pytest.param([float("inf")], r"\$\[0\] is inf", id="infinity"),
]


@pytest.mark.parametrize(("value", "match"), HOSTILE_INPUTS)
def test_start_refuses_hostile_input_and_writes_nothing(value, match):
    before = rows()
    with pytest.raises(journal.SerializationError, match=match):
        journal.start("hostile-echo", value)
    assert rows() == before


@pytest.mark.parametrize(("value", "match"), HOSTILE_PAYLOADS)
def test_signal_refuses_a_hostile_payload_and_writes_nothing(value, match):
    run_id = journal.start("hostile-echo", "fine")
    before = rows()
    with pytest.raises(journal.SerializationError, match=match):
        journal.signal(run_id, "go", value)
    assert rows() == before


@pytest.mark.parametrize(("name", "signal_id", "match"), [
    ("go\x00", "", "the signal name contains a NUL"),
    ("go\ud800", "", "the signal name contains a lone surrogate"),
    ("go", "id\x00", "the signal id contains a NUL"),
    ("go", "id\udfff", "the signal id contains a lone surrogate"),
])
def test_signal_refuses_a_name_or_id_the_database_cannot_store(name, signal_id, match):
    run_id = journal.start("hostile-echo", "fine")
    before = rows()
    with pytest.raises(journal.SerializationError, match=match):
        journal.signal(run_id, name, {"ok": True}, signal_id=signal_id)
    assert rows() == before


def test_the_payload_limit_counts_utf8_bytes_not_escaped_characters(settings):
    settings.DURABLE_MAX_PAYLOAD_BYTES = 4096
    run_id = journal.start("hostile-echo", "\u00e9" * 1800)  # 3,600 bytes of UTF-8 (10,800 escaped characters)
    assert Run.objects.filter(id=run_id).exists()
    before = rows()
    with pytest.raises(journal.PayloadTooLargeError, match=r"is 4,\d{3} bytes \(UTF-8 JSON\); the limit is 4,096"):
        journal.start("hostile-echo", "\u00e9" * 2100)  # 4,200 bytes
    with pytest.raises(journal.PayloadTooLargeError, match="the limit is 4,096"):
        journal.signal(run_id, "go", "\U0001f600" * 1100)  # 4,400 bytes
    assert rows() == before
    journal.signal(run_id, "go", "\U0001f600" * 1000)  # 4,000 bytes: accepted


def test_the_nesting_limit_is_a_setting(settings):
    settings.DURABLE_MAX_NESTING = 5
    before = rows()
    with pytest.raises(journal.SerializationError, match="nested deeper than 5 levels"):
        journal.start("hostile-echo", hostile.deep(4))  # + the {args: [...]} envelope: 6 levels
    assert rows() == before
    journal.start("hostile-echo", hostile.deep(3))


def test_what_can_be_stored_is_stored_exactly(drive):
    """The checks refuse only what cannot be stored: look-alikes (a backslash followed by u0000,
    brackets inside strings, emoji) go in and come back unchanged."""
    value = {"literal": "\\u0000 and \\ud800", "emoji": "\U0001f600", "brackets": "]]]]" * 40 + "[[" * 80,
             "quote": '"\\"]', "deep": hostile.deep(60), "accents": "caf\u00e9"}
    run_id = journal.start("hostile-echo", value)
    journal.signal(run_id, "go", value)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"echo": value, "signal": value}


def test_encode_is_canonical_as_before():
    value = {"b": [1, 2.5, None, True], "a": "caf\u00e9 \U0001f600", "c": {"z": "\\", "y": '"'}}
    stored, text = encode(value)
    assert text == json.dumps(value, sort_keys=True, separators=(",", ":"))  # fingerprints of old journals hold
    assert stored == value


_ANY_TEXT = st.text(st.characters(exclude_categories=()))  # lone surrogates and NUL too
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_ANY_TEXT, inner, max_size=4),
    max_leaves=20)


@pytest.mark.django_db(transaction=False)
@given(_JSON)
@hypothesis_settings(max_examples=300, deadline=None)
def test_the_journals_encoders_write_exactly_what_json_writes(value):
    """The engine calls json's C encoder directly (``serialization._direct``): the text of every record,
    and the canonical text that fingerprints arguments, must stay byte for byte json's."""
    assert COMPACT(value) == json.dumps(value, separators=(",", ":"))
    assert _CANONICAL(value) == json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def test_the_direct_encoders_refuse_what_json_refuses():
    looped: list = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular"):
        COMPACT(looped)
    with pytest.raises(ValueError, match="JSON compliant"):
        _CANONICAL({"x": [float("nan"), float("inf")]})
    with pytest.raises(TypeError, match="not JSON serializable"):
        COMPACT({"x": object()})
