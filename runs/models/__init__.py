"""UI-only data: audit entries, saved filters, API tokens. The engine's tables live in journal.models."""

from runs.models.access import *  # noqa: F401,F403  (API tokens, webhook secrets: the HTTP API)
from runs.models.audit import *  # noqa: F401,F403  (audit log, settings: the dashboard)
from runs.models.bulk import *  # noqa: F401,F403,E402  (bulk actions on a search, in the background)
