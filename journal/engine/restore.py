"""Restore a run's sandbox directory from a checkpoint manifest.

Recovery calls ``prepare_sandbox`` before the workflow replays: the directory is put back to
the latest checkpoint at or before the last recorded step, so a command that was interrupted
half-way (or a worker that comes back on another machine with an empty disk) replays against
exactly the files the journal's records were made with. Fork and time travel call
``restore_sandbox`` with any step's manifest.

The worker runs as root; everything here refuses to follow a symlink out of the sandbox.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from django.conf import settings

from journal.engine.checkpoints import checkpoint_for, decode_state, note_results
from journal.engine.sandbox_exec import Limits, isolation, kill_leftovers, sandbox_base, sandbox_root, sandbox_uid
from journal.models import Checkpoint, CheckpointDecision, Sandbox
from journal.store import blobs


def restore_enabled() -> bool:
    """DURABLE_SANDBOX_RESTORE=0 turns restore off: the naive 'journal only' baseline of bench/checkpoints.py."""
    value = os.environ.get("DURABLE_SANDBOX_RESTORE", str(getattr(settings, "DURABLE_SANDBOX_RESTORE", "1")))
    return value.strip().lower() not in ("0", "false", "no", "off")


def check_relative(path: str) -> str:
    """Normalise a manifest or helper path; refuse absolute paths and '..' (ValueError)."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(f"bad sandbox path {path!r}")
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if path.startswith("/") or any(p == ".." for p in parts) or not parts:
        raise ValueError(f"path {path!r} escapes the sandbox (absolute or '..')")
    return "/".join(parts)


def ensure_dir(run_id) -> Path:
    """Create the run's directory (0700, owned by its sandbox uid) and the Sandbox row."""
    base = sandbox_base()
    base.mkdir(parents=True, exist_ok=True)
    root = sandbox_root(run_id)
    uid = sandbox_uid(run_id)
    if not root.is_dir():
        root.mkdir(mode=0o700, exist_ok=True)
    if uid is not None:
        if os.stat(base).st_mode & 0o001 == 0:
            base.chmod(os.stat(base).st_mode | 0o711)  # the sandbox uid must be able to reach its own dir
        os.chown(root, uid, uid)
        root.chmod(0o700)
    _ensure_row(run_id, root)
    return root


def _ensure_row(run_id, root: Path) -> None:
    Sandbox.objects.get_or_create(run_id=run_id, defaults={"root": str(root), "isolation": isolation(),
                                                           "limits": Limits().as_dict()})


def _inside(root: Path, target: Path) -> bool:
    real_root = os.path.realpath(root)
    real = os.path.realpath(target)
    return real == real_root or real.startswith(real_root + os.sep)


def _hash_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def current_entries(root: Path) -> dict[str, tuple[str, os.stat_result]]:
    """Everything under root that is not a directory: rel path -> ("file"|"link"|"other", lstat)."""
    out: dict[str, tuple[str, os.stat_result]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            kind = "file" if stat.S_ISREG(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "other"
            out[os.path.relpath(full, root)] = (kind, st)
    return out


def _chown(path: Path, uid: int | None) -> None:
    if uid is not None:
        os.chown(path, uid, uid, follow_symlinks=False)


def _make_parents(root: Path, rel: str, uid: int | None) -> Path:
    target = root / rel
    parent = target.parent
    missing = []
    p = parent
    while p != root and not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir()
        _chown(d, uid)
    if not _inside(root, parent) or parent.is_symlink():
        raise ValueError(f"path {rel!r} escapes the sandbox through a symlink")
    return target


def write_bytes(root: Path, rel: str, data: bytes, uid: int | None) -> None:
    """Write a file inside root without following symlinks (atomic replace, owned by the sandbox uid)."""
    target = _make_parents(root, rel, uid)
    tmp = target.with_name(f".{target.name}.restore-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    _chown(tmp, uid)
    os.replace(tmp, target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def restore_sandbox(run_id, manifest: dict[str, str], *, position: int | None = None, reason: str = "") -> Path:
    """Make the run's sandbox directory hold exactly ``manifest`` (path -> sha256, or "->target" for a link).

    Files already right are left alone (compared by size and hash), others rewritten from the
    blob store, anything not in the manifest removed. With ``position``, also records a
    Checkpoint at that position for this run, so its own recovery finds these files (fork uses
    it to give a child its parent's files).
    """
    root = ensure_dir(run_id)
    uid = sandbox_uid(run_id)
    wanted = {check_relative(p): sha for p, sha in manifest.items()}
    present = current_entries(root)
    for rel, (kind, _) in present.items():
        sha = wanted.get(rel)
        if sha is None or kind == "other" or (kind == "link") != sha.startswith("->"):
            _remove(root / rel)
    # A file in the manifest where a directory now stands: clear the directory first.
    for rel in wanted:
        target = root / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
    present = current_entries(root)
    to_fetch: dict[str, str] = {}
    for rel, sha in wanted.items():
        if sha.startswith("->"):
            target = root / rel
            if rel in present and os.readlink(target) == sha[2:]:
                continue
            target.unlink(missing_ok=True)
            _make_parents(root, rel, uid)
            os.symlink(sha[2:], target)
            _chown(target, uid)
            continue
        if rel in present and present[rel][0] == "file":
            have = _hash_file(root / rel)
            if have == sha:
                continue
        to_fetch[rel] = sha
    contents = blobs.get_many(list(set(to_fetch.values()))) if to_fetch else {}
    for rel, sha in to_fetch.items():
        if sha not in contents:
            raise LookupError(f"blob {sha[:12]} for {rel!r} is missing from the store: cannot restore the sandbox")
        write_bytes(root, rel, contents[sha], uid)
    _prune_empty_dirs(root)
    if position is not None:
        Checkpoint.objects.create(run_id=run_id, position=position, step_name="restore",
                                  decision=CheckpointDecision.TAKEN, reason=reason or "restored",
                                  manifest=wanted, files_changed=len(wanted))
    return root


def _prune_empty_dirs(root: Path) -> None:
    """Directories are not in manifests; an emptied one is removed so the tree matches the checkpoint."""
    for dirpath, _dirs, _files in os.walk(root, topdown=False, followlinks=False):
        if Path(dirpath) == root:
            continue
        if not os.listdir(dirpath):
            os.rmdir(dirpath)


def scan_manifest(root: Path) -> dict[str, str]:
    """Hash what is on disk (used by the naive baseline, which trusts the disk as it is)."""
    out = {}
    for rel, (kind, _) in current_entries(root).items():
        if kind == "file":
            out[rel] = _hash_file(root / rel)
        elif kind == "link":
            out[rel] = "->" + os.readlink(root / rel)
    return out


def prepare_sandbox(ctx) -> None:
    """Before a (re)run replays: restore the sandbox to the latest checkpoint at or before the last
    recorded step. Costs one indexed query for a resumed run and nothing for a fresh one."""
    ctx.sandbox_manifest = {}
    ctx.sandbox_unsaved = set()
    ctx.sandbox_dirty = False
    ctx.checkpointed_state = None
    ctx.checkpointed_position = None
    ctx.state_chain = None
    last = max(ctx.recorded, default=0)
    fresh = last == 0 and ctx.run.forked_from_id is None
    if fresh and ctx.run.attempts <= 1:
        return  # a first attempt of a new run: no files anywhere (a short run's drive skips the disk)
    root = sandbox_root(ctx.run_id)
    if not restore_enabled():
        if root.is_dir():
            ctx.sandbox_manifest = scan_manifest(root)
        return
    if fresh:
        if root.exists():  # an earlier attempt that crashed before recording anything left files behind
            restore_sandbox(ctx.run_id, {})
        return
    found = checkpoint_for(ctx.run.id, last)
    if found is None and not root.exists():
        return
    if root.exists():
        kill_leftovers(ctx.run_id)  # a command of the previous attempt must not write during the restore
    manifest = dict(found.manifest) if found is not None else {}
    restore_sandbox(ctx.run_id, manifest)
    ctx.sandbox_manifest = manifest
    if found is not None:
        referred: dict = {}
        ctx.checkpointed_state = decode_state(found.run_id, found, referred)
        if str(found.run_id) == ctx.run_id:
            note_results(ctx, referred)
        # Deltas name a base position of this run; a checkpoint inherited through fork lineage is
        # not one, so the next checkpoint stores the state whole (state_chain None).
        ctx.checkpointed_position = found.position if str(found.run_id) == ctx.run_id else None
        ctx.state_chain = None
