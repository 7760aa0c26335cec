"""Run one sandbox command with limits: the process-level part of the sandbox, no journal here.

Isolation, strongest first (chosen once per process, see ``isolation()``):

- ``namespaces``: when the worker is root and util-linux ``unshare`` works (it does in our
  containers), the command runs in fresh PID, network, IPC, UTS and mount namespaces (no
  network at all, only its own processes visible, the whole tree dies with its init) and as an
  unprivileged per-run uid (``setpriv``, no capabilities, ``no_new_privs``), so it cannot write
  outside its own 0700 directory (nor into /work, other sandboxes or the database files) and
  RLIMIT_NPROC is enforced (it is not for root).
- ``rlimits``: otherwise (not root), rlimits and a process group only. RLIMIT_NPROC would count
  the worker's own processes, so it is not set: a fork bomb is stopped by the timeout only.

In both: wall-clock timeout (the whole process group is SIGKILLed), RLIMIT_CPU, RLIMIT_AS
(memory), RLIMIT_FSIZE (largest file), RLIMIT_NOFILE, no core dumps, a scrubbed environment,
and output streamed through bounded buffers (a runaway writer is killed, never buffered).
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import selectors
import shutil
import signal
import subprocess
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from django.conf import settings


def sandbox_base() -> Path:
    """Where every run's directory lives (DURABLE_SANDBOX_ROOT)."""
    return Path(settings.DURABLE_SANDBOX_ROOT)


def sandbox_root(run_id) -> Path:
    return sandbox_base() / str(run_id)


BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
PR_SET_PDEATHSIG = 1
try:  # loaded here, not in the forked child
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not glibc/musl
    _libc = None
UID_BASE = 200_000  # per-run uids: 200000..249999, unused by any real account
UID_SPAN = 50_000


@dataclass(frozen=True)
class Limits:
    timeout: float = 60.0  # wall-clock seconds
    cpu_seconds: int = 60
    memory_bytes: int = 1 << 30  # address space per process
    max_processes: int = 64  # per sandbox uid (namespaces mode)
    file_size_bytes: int = 64 << 20
    open_files: int = 256
    output_bytes: int = 64 << 10  # kept per stream (stdout, stderr)
    output_kill_bytes: int = 8 << 20  # total output after which the command is killed

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Execution:
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    failure_reason: str = ""
    duration_ms: float = 0.0
    extra: dict = field(default_factory=dict)


@functools.cache
def isolation() -> str:
    """'namespaces' when we can unshare and drop to a per-run uid here; else 'rlimits'."""
    if os.environ.get("DURABLE_SANDBOX_ISOLATION") == "rlimits":
        return "rlimits"
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        return "rlimits"
    try:
        probe = subprocess.run([*_namespace_prefix(UID_BASE), "/bin/true"], capture_output=True, timeout=10,
                               env={"PATH": BASE_PATH})
    except (OSError, subprocess.SubprocessError):
        return "rlimits"
    return "namespaces" if probe.returncode == 0 else "rlimits"


def sandbox_uid(run_id) -> int | None:
    """The unprivileged uid a run's commands execute as (None when commands run as the worker's user)."""
    if isolation() != "namespaces":
        return None
    return UID_BASE + zlib.crc32(str(run_id).encode()) % UID_SPAN


def _namespace_prefix(uid: int) -> list[str]:
    return [
        "unshare", "--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts", "--mount", "--mount-proc", "--",
        # setpriv's credential change clears unshare's --kill-child death signal; set it again after it.
        "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--pdeathsig=KILL", "--",
        # PID 1 of a namespace ignores default-action signals; run the command as its child instead.
        "/bin/sh", "-c", '"$@"; exit $?', "sandbox-init",
    ]


def _preexec(limits: Limits, set_nproc: bool):
    def apply() -> None:
        # If the worker dies (SIGKILL, OOM), its command dies with it (and, through unshare's
        # --kill-child, the whole namespace): no orphan keeps writing while another worker restores.
        if _libc is not None:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        cpu = max(1, int(limits.cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if set_nproc:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))

    return apply


def scrubbed_env(home: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {"PATH": BASE_PATH, "HOME": home, "LANG": "C.UTF-8"}
    for key, value in (extra or {}).items():
        if not isinstance(key, str) or not isinstance(value, str) or not key or "=" in key or "\0" in key + value:
            raise ValueError(f"sandbox env entries must be str -> str without '=' in the name: {key!r}")
        env[key] = value
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_leftovers(run_id) -> None:
    """Kill anything still running as a run's sandbox uid (before its files are restored)."""
    _kill_uid(sandbox_uid(run_id))


def _kill_uid(uid: int | None) -> None:
    """Kill every process left running as the sandbox uid (a child that escaped the group).

    In namespaces mode the PID namespace dies with its init, so this finds nothing; it is the
    belt to those braces, and costs one short-lived process.
    """
    if uid is None:
        return
    try:
        subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", "kill", "-KILL", "-1"],
                       capture_output=True, timeout=10, env={"PATH": BASE_PATH})
    except (OSError, subprocess.SubprocessError):
        pass


def _decode(data: bytearray) -> str:
    """Output as text the journal can store: bad UTF-8 becomes U+FFFD, NUL the six characters \\u0000
    (PostgreSQL's text and jsonb refuse NUL; journal.store.serialization.storable_text writes the same)."""
    return bytes(data).decode("utf-8", errors="replace").replace("\x00", "\\u0000")


def execute(argv: list[str], *, cwd: str, env: dict[str, str], limits: Limits, uid: int | None) -> Execution:
    """Run argv in cwd under the limits; never raises for anything the command does."""
    mode = isolation()
    full = [*_namespace_prefix(uid), *argv] if mode == "namespaces" and uid is not None else list(argv)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(full, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=_preexec(limits, set_nproc=mode == "namespaces"))
    except OSError as exc:
        return Execution(None, failure_reason=f"could not start: {exc.strerror or exc}",
                         duration_ms=(time.monotonic() - t0) * 1000)
    kept = {"stdout": bytearray(), "stderr": bytearray()}
    total = 0
    truncated = False
    reason = ""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    deadline = t0 + limits.timeout
    open_streams = 2
    try:
        while open_streams:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = f"timeout: still running after {limits.timeout:g}s; its processes were killed"
                break
            for key, _ in sel.select(timeout=min(remaining, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                total += len(chunk)
                buf = kept[key.data]
                room = limits.output_bytes - len(buf)
                if room > 0:
                    buf += chunk[:room]
                if len(chunk) > room:
                    truncated = True
            if total > limits.output_kill_bytes:
                reason = f"output limit: more than {limits.output_kill_bytes:,} bytes of output; killed"
                break
            if open_streams and proc.poll() is not None and mode != "namespaces":
                # The command exited but a background child still holds its pipes: stop it.
                _kill_group(proc)
    finally:
        if reason:
            _kill_group(proc)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
        _kill_group(proc)
        _kill_uid(uid if reason else None)
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    exit_code = proc.returncode
    stderr = _decode(kept["stderr"])
    if not reason:
        reason = _explain(exit_code, stderr, limits, namespaced=mode == "namespaces")
    elif _hit_process_limit(stderr):
        reason += f" (it also hit the process limit of {limits.max_processes}: a fork bomb?)"
    return Execution(exit_code=None if reason.startswith(("timeout", "output limit")) else exit_code,
                     stdout=_decode(kept["stdout"]), stderr=stderr, truncated=truncated, failure_reason=reason,
                     duration_ms=(time.monotonic() - t0) * 1000, extra={"isolation": mode, "output_total": total})


def _signal_of(exit_code: int | None, namespaced: bool) -> int | None:
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if namespaced and exit_code > 128:  # the namespace's init shell reports a signalled child as 128+n
        return exit_code - 128
    return None


def _hit_process_limit(stderr: str) -> bool:
    tail = stderr[-4000:]
    return "Cannot fork" in tail or ("Resource temporarily unavailable" in tail and "fork" in tail)


def _explain(exit_code: int | None, stderr: str, limits: Limits, namespaced: bool) -> str:
    """Name the limit a failed command hit; '' when it just exited (non-zero is the agent's business)."""
    sig = _signal_of(exit_code, namespaced)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and "cpu" in stderr.lower()):
        return f"cpu limit: more than {limits.cpu_seconds}s of CPU time"
    if sig == signal.SIGXFSZ:
        return f"file size limit: a file grew past {limits.file_size_bytes:,} bytes"
    tail = stderr[-4000:]
    if "MemoryError" in tail or "Cannot allocate memory" in tail or "bad_alloc" in tail or "Out of memory" in tail:
        return f"memory limit: allocation refused above {limits.memory_bytes:,} bytes of address space"
    if _hit_process_limit(tail):
        return f"process limit: more than {limits.max_processes} processes"
    if sig is not None:
        return f"killed by signal {signal.Signals(sig).name}" if sig in signal.valid_signals() else f"signal {sig}"
    return ""
