"""Every URL in the URLconf, as every role, with hostile query strings and form values: never a 5xx.

The URL list is read from the resolver, not written here, so a new view is walked the day it is
added; path parameters are filled with real ids (runs of each status, an approval, a rule, a
webhook) and bogus ones (unknown, malformed, too large for a column). Parameter names come from the
views' own source (every ``request.GET.get("x")`` / ``request.POST.get("x")``), plus random ones.

Values are what breaks parsers and databases: Unicode digits ("²" passes ``isdigit()``, not
``int()``), integers past 64 bits, NUL, lone surrogates, NaN/Infinity/deep JSON, huge strings.
They are sent the way an attacker sends them: percent-encoded bytes (a surrogate as its
"surrogatepass" bytes), so the server's own decoding is part of what is tested.

Django's admin (its own code, for superusers) gets GET requests only: a hostile POST to an admin
delete page would delete the personas this walk logs in with.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.urls import NoReverseMatch, URLPattern, URLResolver, get_resolver, resolve, reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.models import Approval, RetentionRule
from runs.models import ApiToken, AuditEntry, WebhookEndpoint
from runs.roles import ensure_roles
from runs.views.actions import ACTIONS
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("viewer", "operator", "admin")
EXAMPLES = 15  # hypothesis examples per (URL pattern, role); the fixed sweep below covers every path


def _params_in(path: Path) -> set[str]:
    text = path.read_text()
    return (set(re.findall(r'(?:GET|POST|params)\.(?:get|getlist)\(\s*"([^"]+)"', text))
            | set(re.findall(r'_text\(request,\s*"([^"]+)"', text)))


def _module_params() -> dict[str, list[str]]:
    """The query/form parameters each view module reads, from its source: the walk follows the views."""
    found = {f"runs.views.{path.stem}": _params_in(path) for path in (ROOT / "runs" / "views").glob("*.py")}
    found["runs.views.runs"] |= _params_in(ROOT / "runs" / "queries.py")  # the list's filters
    return {module: sorted(names) for module, names in found.items()}


MODULE_PARAMS = _module_params()
PARAMS = sorted(set().union(*MODULE_PARAMS.values()))

BAD_VALUES = [
    "", " ", "²", "٣", "१२", "1_000", "-1", "0", "+5", "1e9", "9" * 25, "-" + "9" * 25, str(2**63), str(2**64),
    "zzz", "NaN", "Infinity", "null", "[]", "{}", '{"a": NaN}', '["\\u0000"]', '"\\ud800"', "[" * 5000,
    '{"a":' * 200 + "1" + "}" * 200, "\x00", "a\x00b", "\ud800", "x\udfffy", "../../etc/passwd", "//evil.example",
    "<script>alert(1)</script>", "' OR 1=1 --", "x" * 5000, "2024-13-45", "0001-01-01T00:00+23:59",
    "9999-12-31T23:59-23:59", "Ǆ" * 300, "\N{RIGHT-TO-LEFT OVERRIDE}", "-created", "steps", "cost",
]

ANY_CHAR = st.characters(exclude_categories=())  # includes surrogates (category Cs), NUL and controls
UNICODE_DIGITS = st.text(st.sampled_from("0123456789²³¹٠١٢३৪๕۶߇᠘"), min_size=1, max_size=25)
JSON_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(ANY_CHAR, max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(ANY_CHAR, max_size=5), inner, max_size=3),
    max_leaves=8,
).map(lambda v: json.dumps(v))  # ensure_ascii and allow_nan: "\\ud800", "\\u0000", NaN as JSON text


def _values(extra: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(BAD_VALUES + extra),
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        UNICODE_DIGITS,
        st.text(ANY_CHAR, max_size=30),
        JSON_TEXT,
    )


def _encode(pairs: list[tuple[str, str]]) -> str:
    """Form/query encoding as raw bytes allow it: a surrogate goes out as its 3 surrogatepass bytes."""

    def q(text: str) -> str:
        return quote(text.encode("utf-8", "surrogatepass"), safe="")

    return "&".join(f"{q(k)}={q(v)}" for k, v in pairs)


# --- the URLconf, resolved ---------------------------------------------------------------------------


def _patterns(patterns=None, namespace: str = ""):
    """(view name for reverse(), parameter names) for every URL the project serves."""
    for p in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(p, URLResolver):
            ns = ":".join(filter(None, [namespace, p.namespace]))
            yield from _patterns(p.url_patterns, ns)
        elif isinstance(p, URLPattern) and p.name:
            params = list(p.pattern.regex.groupindex)
            yield (f"{namespace}:{p.name}" if namespace else p.name), params


def _candidates(data: dict) -> dict[str, list]:
    """Values for path parameters by name: real ones first, then unknown, malformed and oversized."""
    bogus_uuid = str(uuid.uuid4())
    run_ids = data["runs"]
    return {
        "run_id": [*run_ids, bogus_uuid, "zzz", "9" * 30],
        "approval_id": [data["approval"], bogus_uuid, "zzz"],
        "seq": [1, 3, 0, 10**25],
        "rule_id": [data["rule"], 0, 10**25],
        "action": [*ACTIONS, "bogus"],
        "agent": ["dash_ok", "no-such-agent", "x" * 300, "²"],
        "endpoint": [data["webhook"], "nope"],
        "object_id": ["1", "zzz", "9" * 30],
        "content_type_id": ["1", "zzz"],
        "id": ["1", "zzz"],
        "app_label": ["journal", "runs", "auth"],
        "job_id": [data["bulk_job"], bogus_uuid],
    }


def _fill(name: str, params: list[str], candidates: dict[str, list]) -> list[str]:
    """Concrete paths for one pattern: each parameter's candidates in turn, the others at their first."""
    if not params:
        return [reverse(name)]
    paths = []
    for varying in params:
        for value in candidates.get(varying, ["x"]):
            kwargs = {p: (value if p == varying else candidates.get(p, ["x"])[0]) for p in params}
            try:
                paths.append(reverse(name, kwargs=kwargs))
            except NoReverseMatch:  # e.g. "zzz" where the converter wants a uuid: not a URL this app serves
                continue
    return sorted(set(paths))


# --- the walk -----------------------------------------------------------------------------------------


@pytest.fixture
def world(drive, personas):
    """Real runs of each status, an approval, a rule, a webhook, an audit entry, a token and a superuser."""
    demo = make_demo_runs(drive)
    rule = RetentionRule.objects.create(agent="dash_ok", status="completed", keep_days=30)
    WebhookEndpoint.objects.create(name="hook", secret="s3cret", actor="hook")
    AuditEntry.objects.create(actor="operator", action="cancel", run_id=demo.failed)
    _token, secret = ApiToken.issue("walker", ["runs:start", "runs:read", "signals:send", "approvals:decide"],
                                    roles=["operator"])
    User.objects.create_superuser("root", password="root-pass")
    from runs.models.bulk import BulkJob, BulkJobStatus

    job = BulkJob.objects.create(actor="operator", action="cancel", status=BulkJobStatus.FINISHED)
    return {
        "runs": [demo.ok, demo.failed, demo.waiting, demo.review, demo.evil],
        "approval": str(Approval.objects.values_list("id", flat=True).first()),
        "rule": rule.id, "webhook": "hook", "token": secret, "bulk_job": str(job.id),
    }


def _plausible(world: dict) -> dict[str, list[str]]:
    """Values a real form would send, so one hostile field at a time gets past the others' checks."""
    runs = [str(r) for r in world["runs"]]
    return {
        "decision": ["accept", "edit", "reject", "respond"], "status": ["completed", "failed", ""],
        "action": ["cancel", "retry", "compensate", "pause_agent", "unpause_agent"],
        "resolution": ["done", "retry", "skip"], "role": ["viewer", "operator", "admin", ""],
        "keep_days": ["30", "1"], "agent": ["dash_ok", ""], "run_id": runs, "run_ids": runs, "run": runs,
        "approval_id": ["", world["approval"]], "ids": [",".join(runs)], "step": ["1", "2"], "at_step": ["1", "2"],
        "position": ["1", "2"], "after": ["0", "1"], "before": ["1", ""], "payload": ['{"a": 1}', ""],
        "result": ['{"ok": true}'], "edited": ['{"x": 1}'], "override": ['"v"'], "name": ["go", "approval"],
        "comment": ["because"], "reason": ["because"], "username": ["viewer", "nobody"],
        "fragment": ["journal", "list"], "next": ["/"], "q": ["dash"], "sort": ["-created", "steps", "cost"],
        "since": ["2020-01-01"], "until": ["2999-01-01T10:00"], "actor": ["operator"], "version": ["1"],
        "edit": ["on", ""], "limit": ["5"],
    }


class Walk:
    """Sends requests and keeps every 5xx (or exception escaping a view) with the request that caused it."""

    def __init__(self, client, world: dict):
        self.client = client
        self.token = world["token"]
        self.plausible = _plausible(world)
        self.extra = [*map(str, world["runs"]), world["approval"], str(world["rule"])]
        self.sent = 0
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []

    def send(self, method: str, path: str, pairs: list[tuple[str, str]], htmx: bool = False) -> int:
        headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
        if path.startswith("/api/"):
            headers["HTTP_AUTHORIZATION"] = f"Bearer {self.token}"
        body = _encode(pairs)
        self.sent += 1
        try:
            if method == "GET":
                response = self.client.get(f"{path}?{body}" if body else path, **headers)
            else:
                response = self.client.post(path, data=body, content_type="application/x-www-form-urlencoded",
                                            **headers)
        except Exception as exc:  # the test client re-raises what a view let escape: that is the 500
            self.failures.append(f"{method} {path} {pairs!r:.400}: {type(exc).__name__}: {exc!s:.300}")
            return 500
        self.statuses[response.status_code] += 1
        if response.status_code >= 500:
            self.failures.append(f"{method} {path} {pairs!r:.400}: HTTP {response.status_code}")
        return response.status_code

    def base(self, params: list[str]) -> dict[str, str]:
        return {p: self.plausible.get(p, ["x"])[0] for p in params}

    def served(self, path: str, methods: tuple[str, ...], params: list[str]) -> list[str]:
        """The methods this role may use on ``path`` with a plausible form: 405 (wrong method), 403
        (role) and a redirect to the login page leave nothing behind them to explore."""
        out = []
        for method in methods:
            status = self.send(method, path, list(self.base(params).items()))
            if status not in (405, 403, 401):
                out.append(method)
        return out

    def sweep(self, path: str, method: str, params: list[str]) -> None:
        """Each parameter the view reads, in turn, with each value that broke a parser before."""
        for name in params:
            for bad in SWEEP_VALUES:
                form = {**self.base(params), name: bad}
                self.send(method, path, list(form.items()), htmx=method == "POST")

    def explore(self, paths: list[str], methods: list[str], params: list[str]) -> None:
        plausible = self.plausible
        value = _values(self.extra)

        def form(draw_keys):
            overrides, strangers = draw_keys
            return list({**self.base(params), **overrides}.items()) + strangers

        field = st.sampled_from(params) if params else st.sampled_from(PARAMS)
        forms = st.tuples(
            st.dictionaries(field, value | st.sampled_from(sum(plausible.values(), [])), max_size=4),
            st.lists(st.tuples(st.sampled_from(PARAMS) | st.text(ANY_CHAR, max_size=8), value), max_size=3),
        ).map(form)

        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(path=st.sampled_from(paths), method=st.sampled_from(methods), pairs=forms, htmx=st.booleans())
        def probe(path, method, pairs, htmx):
            self.send(method, path, pairs, htmx)

        probe()


SWEEP_VALUES = ["²", "9" * 25, "zzz", "-1", '{"deep": ' * 150 + "NaN" + "}" * 150]
ADMIN_QUERIES = [[], [("q", "²"), ("o", "9" * 25), ("p", "zzz")], [("e", "1"), ("_changelist_filters", "\ud800")],
                 [("id__gt", "9" * 25), ("status__exact", "zzz")]]


def _view_module(path: str) -> str:
    func = resolve(path).func
    func = getattr(func, "__wrapped__", func)
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return getattr(func, "__module__", "")


def _as(client, role: str) -> None:
    """Log in as ``role`` with exactly that role again (a hostile set_role may have changed it)."""
    ensure_roles()
    from django.contrib.auth.models import Group

    user = User.objects.get(username=role)
    user.groups.set([Group.objects.get(name=role)])
    client.force_login(user)


@pytest.mark.parametrize("role", ROLES)
def test_no_url_answers_5xx_to_hostile_input(client, world, role):
    started = time.monotonic()
    candidates = _candidates(world)
    patterns = [(name, params) for name, params in _patterns() if not name.startswith("admin:")]
    walk = Walk(client, world)
    paths_seen = explored = 0
    for name, path_params in patterns:
        paths = _fill(name, path_params, candidates)
        paths_seen += len(paths)
        _as(client, role)
        params = MODULE_PARAMS.get(_view_module(paths[0]), [])
        methods: set[str] = set()
        for path in paths:
            for method in walk.served(path, ("GET", "POST"), params):
                methods.add(method)
                walk.sweep(path, method, params)
        if methods:
            explored += 1
            walk.explore(paths, sorted(methods), params)
    print(f"{role}: {len(patterns)} URL patterns ({explored} explored), {paths_seen} paths, {walk.sent} requests, "
          f"{time.monotonic() - started:.1f}s; answers {dict(sorted(walk.statuses.items()))}")
    assert len(patterns) > 25 and walk.sent > 500, "the walk lost its URLs"
    assert {"before", "keep_days", "run_id", "step", "q"} <= set(PARAMS), "the walk lost its parameters"
    assert not walk.failures, f"{len(walk.failures)} of {walk.sent} requests failed:\n" + "\n".join(walk.failures[:40])


@pytest.mark.parametrize("role", [*ROLES, "root"])
def test_admin_pages_answer_hostile_queries_without_5xx(client, world, role):
    """Django's admin, as each role and as a superuser (the roles are not staff): GET only."""
    if role == "root":
        client.force_login(User.objects.get(username="root"))
    else:
        _as(client, role)
    walk = Walk(client, world)
    candidates = _candidates(world)
    for name, params in _patterns():
        if name.startswith("admin:") and name != "admin:logout":
            for path in _fill(name, params, candidates):
                for query in ADMIN_QUERIES:
                    walk.send("GET", path, query)
    print(f"admin site as {role}: {walk.sent} requests; answers {dict(sorted(walk.statuses.items()))}")
    assert walk.sent > 300
    assert not walk.failures, f"{len(walk.failures)} of {walk.sent} requests failed:\n" + "\n".join(walk.failures[:40])


def test_the_known_cases_are_a_message_or_a_400(client, world):
    """The three 500s of issue 11 item 5, each answered in the page now."""
    _as(client, "admin")
    assert client.get("/audit/?before=%C2%B2").status_code == 200
    response = client.post("/settings/retention/set/", {"keep_days": "9" * 25, "agent": "", "status": ""},
                           follow=True)
    assert response.status_code == 200 and b"keep days must be a whole number" in response.content
    response = client.post("/approvals/decide/", {"run_id": "zzz", "decision": "accept"}, follow=True)
    assert response.status_code == 200 and b"neither an approval nor a run" in response.content
    assert client.get("/?q=%00").status_code == 400
    assert client.get("/?sort=steps&after=" + "eyJhIjoxfQ").status_code == 200  # a forged cursor: a message
