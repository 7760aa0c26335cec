"""The production deployment (README "Deploying"): settings that pass ``check --deploy``, and the dashboard
served by gunicorn with DEBUG=0, its static files from WhiteNoise, loading in Chromium.

Every process here gets the production environment explicitly: the test process's own settings are the
development ones (plain storage, no HTTPS), which is what the rest of the suite runs with.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, database_url

CHROMIUM = "/usr/bin/chromium"


def production_env(**extra: str) -> dict[str, str]:
    # Not this process's test switches (test_browser.py sets DJANGO_ALLOW_ASYNC_UNSAFE, which check --deploy
    # rightly refuses), nor a developer's DURABLE_* settings.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST", "DURABLE_", "SECURE_")) and k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update({
        "DJANGO_SETTINGS_MODULE": "durable_ui.settings", "PYTHONPATH": str(ROOT), "DEBUG": "0",
        "DURABLE_PRODUCTION": "1", "SECRET_KEY": secrets.token_urlsafe(64), "ALLOWED_HOSTS": "dash.example.com",
    })
    env.update(extra)
    return env


def manage(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_is_clean_with_the_production_environment():
    result = manage(production_env(), "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_names_what_the_plain_http_toggles_relax():
    """The relaxations for a local http test are real switches: check --deploy sees each one."""
    env = production_env(DURABLE_SSL_REDIRECT="0", DURABLE_SECURE_COOKIES="0", DURABLE_HSTS_SECONDS="0")
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stdout + result.stderr, warning


def _settings_in(env: dict, *names: str) -> dict:
    code = ("import json, django; django.setup(); from django.conf import settings as s; "
            f"print(json.dumps({{n: getattr(s, n, None) for n in {list(names)!r}}}))")
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_behind_a_proxy_the_forwarded_proto_header_is_trusted_only_when_named():
    named = _settings_in(production_env(DURABLE_PROXY_SSL_HEADER="X-Forwarded-Proto"), "SECURE_PROXY_SSL_HEADER")
    assert named["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert _settings_in(production_env(), "SECURE_PROXY_SSL_HEADER")["SECURE_PROXY_SSL_HEADER"] is None


def test_production_refuses_debug_and_the_development_secret_key():
    for extra in ({"DEBUG": "1"}, {"SECRET_KEY": "insecure-dev-key-set-SECRET_KEY-in-production"},
                  {"SECRET_KEY": "short"}):
        result = manage(production_env(**extra), "check")
        assert result.returncode != 0 and "ImproperlyConfigured" in result.stderr, (extra, result.stderr[-500:])


def test_development_settings_need_no_collectstatic():
    """Tests, the demo and runserver with DEBUG off serve the source folders: no manifest needed."""
    env = {k: v for k, v in production_env().items() if k != "DURABLE_PRODUCTION"}
    found = _settings_in(env, "STORAGES", "WHITENOISE_USE_FINDERS", "SECURE_SSL_REDIRECT")
    assert found["STORAGES"]["staticfiles"]["BACKEND"].endswith(".StaticFilesStorage")
    assert found["WHITENOISE_USE_FINDERS"] is True and found["SECURE_SSL_REDIRECT"] is False


# --- gunicorn + Chromium --------------------------------------------------------------------------


class Gunicorn:
    """gunicorn serving the test database in production mode on a free port, over plain http."""

    def __init__(self, tmp_path: Path):
        self.static_root = tmp_path / "static"
        self.log_path = tmp_path / "gunicorn.log"
        self.env = production_env(
            DATABASE_URL=database_url(), STATIC_ROOT=str(self.static_root), ALLOWED_HOSTS="127.0.0.1,localhost",
            DURABLE_SSL_REDIRECT="0", DURABLE_SECURE_COOKIES="0", DURABLE_HSTS_SECONDS="0")
        collected = manage(self.env, "collectstatic", "--noinput", "--verbosity", "0")
        assert collected.returncode == 0, collected.stderr
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "durable_ui.wsgi", "--bind", "127.0.0.1:0", "--workers", "2",
                 "--access-logfile", "-", "--timeout", "60"], env=self.env, cwd=ROOT, stdout=log,
                stderr=subprocess.STDOUT)
        self.url = self._wait_listening()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_listening(self, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            match = re.search(r"Listening at: (http://127\.0\.0\.1:\d+)", self.log())
            if match and "Booting worker" in self.log():
                return match.group(1)
            assert self.proc.poll() is None, f"gunicorn exited:\n{self.log()[-3000:]}"
            time.sleep(0.1)
        raise AssertionError(f"gunicorn did not start in {timeout}s:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def gunicorn(tmp_path):
    server = Gunicorn(tmp_path)
    yield server
    server.stop()


def _fetch(url: str, **headers: str):
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - a localhost test server
        return response.status, dict(response.headers), response.read()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian's chromium is not installed at /usr/bin/chromium")
def test_the_dashboard_behind_gunicorn_with_debug_off_loads_its_pages_and_static_files(gunicorn, personas, drive):
    playwright_sync = pytest.importorskip("playwright.sync_api")
    from tests.dashboard_data import make_demo_runs

    demo = make_demo_runs(drive)
    failures: list[str] = []
    statics: list[str] = []
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        page = browser.new_page()
        page.set_default_timeout(20_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        def seen(response):
            if response.status >= 400:
                failures.append(f"{response.status} {response.url}")
            if "/static/" in response.url:
                statics.append(response.url)

        page.on("response", seen)
        page.goto(f"{gunicorn.url}/login/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", "operator-pass")
        page.click("button[type=submit]")
        page.wait_for_url(f"{gunicorn.url}/")
        assert page.locator("table.runs tbody tr").count() == 6
        assert page.evaluate("typeof window.htmx") == "object", "htmx did not load"
        styled = page.evaluate("[...document.styleSheets].reduce((n, s) => n + s.cssRules.length, 0)")
        assert styled > 10, "dashboard.css did not load"
        page.goto(f"{gunicorn.url}/runs/{demo.failed}/")
        page.wait_for_function("typeof window.Plotly === 'object'")
        assert page.evaluate("typeof window.htmx") == "object"
        page.keyboard.press("ArrowLeft")  # dashboard.js's stepper keys drive htmx: the live path works
        page.wait_for_url(re.compile(r"step="))
        browser.close()
    assert not failures, failures
    assert not errors, errors
    names = {url.rsplit("/", 1)[-1] for url in statics}
    for stem in ("dashboard", "htmx.min", "plotly.min"):
        assert any(re.fullmatch(rf"{re.escape(stem)}\.[0-9a-f]{{12}}\.(css|js)", n) for n in names), (stem, names)
    # Served compressed, with a far-future cache lifetime (the name changes when the content does).
    css = next(url for url in statics if "/dashboard." in url and url.endswith(".css"))
    status, headers, body = _fetch(css, **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("Content-Encoding") == "gzip"
    assert "immutable" in headers.get("Cache-Control", "") and gzip.decompress(body)
    assert " 500 " not in gunicorn.log()
