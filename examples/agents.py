"""The example agents, registered when Django starts (discovered as the ``examples`` app's agents.py)."""

from examples import coderepair, contracts, research  # noqa: F401  (importing registers the workflows)
