"""Versioning of in-flight runs."""

from __future__ import annotations


def check_before_resume(ctx, defn) -> None:
    """Hook before a run is resumed on possibly changed code."""


def patched(ctx, change_id: str) -> bool:
    raise NotImplementedError
