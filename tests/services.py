#!/usr/bin/env python3
"""Find (or start) the services the test suite needs, and print shell exports for them.

    eval "$(python tests/services.py postgres redis)"

PostgreSQL: $DATABASE_URL if it names one; else the server on 127.0.0.1:5432; else a
throwaway cluster from Debian's postgresql package (installed if missing and we are root).
Redis: $REDIS_URL; else 127.0.0.1:6379; else a throwaway redis-server. ``browser`` makes sure
Debian's chromium is installed for the Playwright tests (it never downloads a browser build).
Progress goes to stderr; stdout carries only the export lines.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time

PG_PORT = 55432
REDIS_PORT = 56379
STATE = "/tmp/durable-ui-services"


def say(msg: str) -> None:
    print(f"services: {msg}", file=sys.stderr, flush=True)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def apt_install(*packages: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    say(f"installing {' '.join(packages)} from Debian's packages")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, stdout=sys.stderr)
    return subprocess.run(["apt-get", "install", "-y", "-qq", *packages], env=env, stdout=sys.stderr).returncode == 0


def postgres() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        say("PostgreSQL from DATABASE_URL")
        return url
    if port_open("127.0.0.1", 5432):
        say("PostgreSQL on 127.0.0.1:5432")
        return "postgres://postgres@127.0.0.1:5432/durable_ui"
    if port_open("127.0.0.1", PG_PORT):
        return f"postgres://postgres@127.0.0.1:{PG_PORT}/durable_ui"
    initdb = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not initdb and apt_install("postgresql"):
        initdb = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not initdb:
        sys.exit("services: no PostgreSQL reachable and none can be installed; set DATABASE_URL")
    bindir = os.path.dirname(initdb[-1])
    data = os.path.join(STATE, "pg")
    os.makedirs(STATE, exist_ok=True)
    run_as = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
    if os.geteuid() == 0:
        shutil.chown(STATE, "postgres")
    if not os.path.exists(os.path.join(data, "PG_VERSION")):
        say(f"creating a throwaway PostgreSQL cluster in {data}")
        subprocess.run([*run_as, f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                       check=True, stdout=sys.stderr)
    subprocess.run([*run_as, f"{bindir}/pg_ctl", "-D", data, "-l", os.path.join(STATE, "pg.log"), "-w", "-o",
                    f"-p {PG_PORT} -k {STATE} -c listen_addresses=127.0.0.1", "start"], check=True, stdout=sys.stderr)
    return f"postgres://postgres@127.0.0.1:{PG_PORT}/durable_ui"


def redis() -> str:
    url = os.environ.get("REDIS_URL", "")
    if url:
        say("Redis from REDIS_URL")
        return url
    if port_open("127.0.0.1", 6379):
        say("Redis on 127.0.0.1:6379")
        return "redis://127.0.0.1:6379/0"
    if not port_open("127.0.0.1", REDIS_PORT):
        if not shutil.which("redis-server") and not apt_install("redis-server"):
            say("no Redis reachable and none can be installed: the Celery tests will be skipped")
            return ""
        say(f"starting a throwaway redis-server on port {REDIS_PORT}")
        subprocess.run(["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", str(REDIS_PORT),
                        "--save", "", "--appendonly", "no"], check=True, stdout=sys.stderr)
        for _ in range(50):
            if port_open("127.0.0.1", REDIS_PORT):
                break
            time.sleep(0.1)
    return f"redis://127.0.0.1:{REDIS_PORT}/0"


def browser() -> None:
    if os.path.exists("/usr/bin/chromium"):
        return
    if not apt_install("chromium"):
        say("Debian's chromium is not installed and cannot be: the browser tests will be skipped")


def main(argv: list[str]) -> None:
    for what in argv or ["postgres", "redis"]:
        if what == "postgres":
            print(f"export DATABASE_URL={postgres()}")
        elif what == "redis":
            url = redis()
            print(f"export REDIS_URL={url}" if url else "unset REDIS_URL")
        elif what == "browser":
            browser()
        else:
            sys.exit(f"services: unknown service {what!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
