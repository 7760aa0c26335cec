"""Agent discovery: each installed app's ``agents.py`` and the modules in DURABLE_AGENT_MODULES."""

from __future__ import annotations

import importlib

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule


def autodiscover() -> list[str]:
    loaded = []
    for config in apps.get_app_configs():
        if module_has_submodule(config.module, "agents"):
            importlib.import_module(f"{config.name}.agents")
            loaded.append(f"{config.name}.agents")
    for name in getattr(settings, "DURABLE_AGENT_MODULES", []):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"DURABLE_AGENT_MODULES names {name!r}, which cannot be imported: {exc}"
            ) from exc
        loaded.append(name)
    return loaded
