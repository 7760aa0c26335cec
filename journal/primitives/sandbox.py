"""ctx.sandbox: a run's working directory, where its commands execute, each one a durable step.

``ctx.sandbox.run(cmd)`` takes a step position like any step: replay returns the recorded
result and never runs the command again. The files a command (or a file helper) changes are
found by snapshotting the directory (path -> size, mtime, sha256) before and after; the change
marks the sandbox dirty so the ``selective`` checkpoint policy saves it. Reads are journaled
too: on replay the directory holds the files of the crash point, not of the step that read.

What this isolation does and does not protect against: see ``journal.engine.sandbox_exec`` and the
README ("Sandbox isolation").
"""

from __future__ import annotations

import hashlib
import os
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.utils import timezone

from journal.engine.checkpoints import after_step
from journal.engine.protocol import begin, record_value, recorded_result, result_payload, span
from journal.engine.restore import check_relative, current_entries, ensure_dir, sandbox_root, write_bytes
from journal.engine.sandbox_exec import Limits, execute, sandbox_uid, scrubbed_env
from journal.models import EventKind, Sandbox, SandboxCommand
from journal.models.trace import SpanKind
from journal.store.errors import DurableError, PayloadTooLargeError
from journal.store.outage import engine_call
from journal.store.serialization import fingerprint

RUN_STEP = "sandbox.run"
STORED_OUTPUT = 64 << 10  # bytes of stdout/stderr kept in the record and the SandboxCommand row


class SandboxPathError(DurableError, ValueError):
    """A file helper was given a path outside the run's sandbox ('..', absolute, or through a symlink)."""


@dataclass
class CommandResult:
    """What ``ctx.sandbox.run`` returns (and what replay returns, from the record)."""

    command: str
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    failure_reason: str = ""  # the limit it hit, a path escape, ...; "" for a command that just exited
    truncated: bool = False
    duration_ms: float = 0.0
    cwd: str = "."
    files_created: list[str] = field(default_factory=list)
    files_modified: list[str] = field(default_factory=list)
    files_deleted: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.failure_reason

    @property
    def changed(self) -> list[str]:
        return sorted(self.files_created + self.files_modified + self.files_deleted)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> CommandResult:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


class Snapshotter:
    """path -> sha256 of a directory, re-hashing only files whose stat changed.

    A cached hash is trusted only for a file last modified well before it was hashed (git's
    "racy" rule): a same-size rewrite within the filesystem's mtime granularity is re-hashed.
    """

    RACY_NS = 1_000_000_000

    def __init__(self, root: Path):
        self.root = root
        self.cache: dict[str, tuple[int, int, int, str, int]] = {}

    def take(self) -> dict[str, str]:
        out: dict[str, str] = {}
        cache: dict[str, tuple[int, int, int, str, int]] = {}
        for rel, (kind, st) in current_entries(self.root).items():
            if kind == "link":
                out[rel] = "->" + os.readlink(self.root / rel)
                continue
            if kind != "file":
                continue
            key = (st.st_size, st.st_mtime_ns, st.st_ino)
            hit = self.cache.get(rel)
            if hit is not None and hit[:3] == key and st.st_mtime_ns + self.RACY_NS < hit[4]:
                sha = hit[3]
            else:
                sha = _sha_file(self.root / rel)
            cache[rel] = (*key, sha, time.time_ns())
            out[rel] = sha
        self.cache = cache
        return out


def _sha_file(path: Path) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _diff(before: dict[str, str], after: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    created = sorted(set(after) - set(before))
    deleted = sorted(set(before) - set(after))
    modified = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    return created, modified, deleted


class SandboxHandle:
    """``ctx.sandbox``. Created lazily by the Context; the directory appears on first use."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._snap: Snapshotter | None = None
        self._row_id: int | None = None

    # -- paths ---------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return sandbox_root(self.ctx.run_id)

    def _ready(self) -> Path:
        if self._snap is None:
            root = ensure_dir(self.ctx.run_id)
            self._row_id = Sandbox.objects.filter(run_id=self.ctx.run_id).values_list("id", flat=True).first()
            self._snap = Snapshotter(root)
        return self.root

    def resolve(self, path: str, *, must_exist: bool = False) -> Path:
        """The absolute path of ``path`` inside the sandbox, or SandboxPathError. Symlinks are resolved."""
        try:
            rel = check_relative(path) if path not in (".", "") else "."
        except ValueError as exc:
            raise SandboxPathError(str(exc)) from None
        root = os.path.realpath(self._ready())
        target = os.path.realpath(os.path.join(root, rel))
        if target != root and not target.startswith(root + os.sep):
            raise SandboxPathError(f"path {path!r} escapes the sandbox (it resolves to {target})")
        if must_exist and not os.path.lexists(target):
            raise SandboxPathError(f"no file {path!r} in the sandbox")
        return Path(target)

    # -- the bookkeeping shared by every changing operation ----------------------------------
    def _after_change(self, after: dict[str, str], created, modified, deleted) -> None:
        ctx = self.ctx
        ctx.sandbox_manifest = after
        unsaved = ctx.sandbox_unsaved
        unsaved |= set(created) | set(modified)
        unsaved -= set(deleted)
        ctx.sandbox_unsaved = unsaved
        if created or modified or deleted:
            ctx.sandbox_dirty = True

    def _commit(self, position: int, step_name: str, result: dict, call: dict, args_hash: str, row: dict,
                summary: dict, checkpoint: bool | None, started, ms: float) -> None:
        ctx = self.ctx
        payload = {**result_payload(result), "args_hash": args_hash, "kind": "sandbox", "args": call,
                   "started_at": started.isoformat(), "duration_ms": round(ms, 3)}
        span(ctx, step_name, SpanKind.SANDBOX, position, started, ms,
             status="ok" if not row.get("failure_reason") and row.get("exit_code") == 0 else "error",
             error=row.get("failure_reason", ""))
        ctx.writer.record(EventKind.SANDBOX_COMMAND, {"position": position, **summary}, step_name=step_name,
                          durability="exit")  # rides in the step's transaction below
        sandbox_id = self._row_id

        def commit(extra) -> None:
            def write_row() -> None:
                SandboxCommand.objects.create(run_id=ctx.run_id, sandbox_id=sandbox_id, position=position, **row)
                if extra is not None:
                    extra()

            ctx.writer.record(EventKind.STEP_COMPLETED, payload, position=position, step_name=step_name,
                              extra=write_row)

        after_step(ctx, position, SimpleNamespace(name=step_name, checkpoint=checkpoint), commit, payload)

    def _replayed(self, step_name: str, call: dict) -> tuple[int, str, Any]:
        ctx = self.ctx
        args_hash = fingerprint(call)
        position, record = begin(ctx, step_name, args_hash)
        return position, args_hash, (recorded_result(record) if record is not None else None)

    # -- commands --------------------------------------------------------------------------
    @engine_call
    def run(self, cmd: str | list[str], *, timeout: float = 60, env: dict[str, str] | None = None, cwd: str = ".",
            cpu_seconds: int | None = None, memory_bytes: int | None = None, checkpoint: bool | None = None,
            ) -> CommandResult:
        """Run a shell string (via /bin/sh -c) or an argv list in the sandbox, as a durable step."""
        if isinstance(cmd, str):
            argv, text = ["/bin/sh", "-c", cmd], cmd
        elif isinstance(cmd, list | tuple) and cmd and all(isinstance(a, str) for a in cmd):
            argv, text = list(cmd), shlex.join(cmd)
        else:
            raise TypeError("sandbox.run takes a shell command string or a non-empty list of str")
        limits = Limits(timeout=float(timeout), **({"cpu_seconds": int(cpu_seconds)} if cpu_seconds else {}),
                        **({"memory_bytes": int(memory_bytes)} if memory_bytes else {}))
        env = dict(env or {})
        call = {"cmd": text, "argv": argv, "cwd": cwd, "env": env, "limits": limits.as_dict()}
        position, args_hash, recorded = self._replayed(RUN_STEP, call)
        if recorded is not None:
            return CommandResult.from_json(recorded)
        root = self._ready()
        started = timezone.now()
        t0 = time.perf_counter()
        before = self._snap.take()
        try:
            workdir = self.resolve(cwd)
            if not workdir.is_dir():
                raise SandboxPathError(f"cwd {cwd!r} is not a directory in the sandbox")
        except SandboxPathError as exc:
            execution = None
            reason = f"path escape: {exc}" if "escapes" in str(exc) else str(exc)
        else:
            try:
                full_env = scrubbed_env(str(root), env)
            except ValueError as exc:
                execution, reason = None, f"bad env: {exc}"
            else:
                execution = execute(argv, cwd=str(workdir), env=full_env, limits=limits,
                                    uid=sandbox_uid(self.ctx.run_id))
                reason = execution.failure_reason
        after = self._snap.take()
        created, modified, deleted = _diff(before, after)
        self._after_change(after, created, modified, deleted)
        ms = (time.perf_counter() - t0) * 1000
        result = CommandResult(
            command=text, exit_code=execution.exit_code if execution else None,
            stdout=execution.stdout[:STORED_OUTPUT] if execution else "",
            stderr=execution.stderr[:STORED_OUTPUT] if execution else "",
            failure_reason=reason[:200], truncated=execution.truncated if execution else False,
            duration_ms=round(ms, 3), cwd=cwd, files_created=created, files_modified=modified, files_deleted=deleted)
        row = {"command": text, "argv": argv, "cwd": cwd, "exit_code": result.exit_code, "stdout": result.stdout,
               "stderr": result.stderr, "truncated": result.truncated, "failure_reason": result.failure_reason,
               "duration_ms": ms, "files_created": created, "files_modified": modified, "files_deleted": deleted}
        summary = {"command": text[:500], "exit_code": result.exit_code, "failure_reason": result.failure_reason,
                   "changed": len(created) + len(modified) + len(deleted)}
        self._commit(position, RUN_STEP, result.to_json(), call, args_hash, row, summary, checkpoint, started, ms)
        return result

    # -- file helpers ------------------------------------------------------------------------
    @engine_call
    def write_file(self, path: str, content: str | bytes, *, checkpoint: bool | None = None) -> dict:
        """Write a file (text as UTF-8) inside the sandbox, as a durable step; returns {"path", "changed", ...}."""
        _check_path(path)
        data = content.encode() if isinstance(content, str) else bytes(content)
        sha = hashlib.sha256(data).hexdigest()
        call = {"path": path, "sha256": sha, "size": len(data)}
        position, args_hash, recorded = self._replayed("sandbox.write_file", call)
        if recorded is not None:
            return recorded
        return self._change(position, args_hash, "sandbox.write_file", call, f"write_file {path}", checkpoint,
                            lambda target, rel: write_bytes(self.root, rel, data, sandbox_uid(self.ctx.run_id)))

    @engine_call
    def delete_file(self, path: str, *, checkpoint: bool | None = None) -> dict:
        """Delete a file (not a directory) in the sandbox, as a durable step; a missing file is not an error."""
        _check_path(path)
        call = {"path": path}
        position, args_hash, recorded = self._replayed("sandbox.delete_file", call)
        if recorded is not None:
            return recorded

        def delete(target: Path, rel: str) -> None:
            if target.is_dir() and not target.is_symlink():
                raise SandboxPathError(f"{path!r} is a directory; use sandbox.run('rm -r ...')")
            target.unlink(missing_ok=True)

        return self._change(position, args_hash, "sandbox.delete_file", call, f"delete_file {path}", checkpoint,
                            delete)

    def _change(self, position, args_hash, step_name, call, text, checkpoint, act) -> dict:
        rel = check_relative(call["path"])
        # The parent must resolve inside; the last component itself is never followed.
        self.resolve(os.path.dirname(rel) or ".")
        target = self.root / rel
        started = timezone.now()
        t0 = time.perf_counter()
        # Only this path can change (no command runs, and every command's stragglers were killed):
        # update the current manifest for it instead of walking the whole workspace.
        before = dict(self.ctx.sandbox_manifest)
        act(target, rel)
        after = dict(before)
        after.pop(rel, None)
        if os.path.islink(target):
            after[rel] = "->" + os.readlink(target)
        elif target.is_file():
            after[rel] = _sha_file(target)
        created, modified, deleted = _diff(before, after)
        self._after_change(after, created, modified, deleted)
        ms = (time.perf_counter() - t0) * 1000
        result = {"path": rel, "changed": bool(created or modified or deleted), "created": bool(created)}
        row = {"command": text, "argv": [], "cwd": ".", "exit_code": 0, "duration_ms": ms,
               "files_created": created, "files_modified": modified, "files_deleted": deleted}
        self._commit(position, step_name, result, call, args_hash, row, {"command": text[:500], "exit_code": 0,
                     "changed": len(created) + len(modified) + len(deleted)}, checkpoint, started, ms)
        return result

    @engine_call
    def read_file(self, path: str, *, binary: bool = False) -> str | bytes:
        """A file's content, journaled: replay returns what the first execution read."""
        def read() -> Any:
            target = self.resolve(path, must_exist=True)
            limit = int(getattr(settings, "DURABLE_MAX_PAYLOAD_BYTES", 1_000_000)) // (2 if binary else 1)
            if target.is_file() and target.stat().st_size > limit:
                raise PayloadTooLargeError(f"sandbox file {path!r} is {target.stat().st_size:,} bytes: too large to "
                                           f"journal (limit {limit:,}); read it inside a command or a step instead")
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                data = fh.read()
            return data.hex() if binary else data.decode("utf-8", errors="replace")

        value = record_value(self.ctx, "sandbox.read_file", read)
        return bytes.fromhex(value) if binary else value

    @engine_call
    def list_files(self) -> list[str]:
        """Relative paths of the regular files and symlinks in the sandbox, sorted; journaled like reads."""
        def listing() -> list[str]:
            root = self._ready()
            return sorted(rel for rel, (kind, _) in current_entries(root).items() if kind in ("file", "link"))

        return record_value(self.ctx, "sandbox.list_files", listing)

    @engine_call
    def exists(self, path: str) -> bool:
        return record_value(self.ctx, "sandbox.exists", lambda: os.path.lexists(self.resolve(path)))


def _check_path(path: str) -> None:
    """Refuse '..' and absolute paths before the step takes a position (so nothing is recorded)."""
    try:
        check_relative(path)
    except ValueError as exc:
        raise SandboxPathError(str(exc)) from None

