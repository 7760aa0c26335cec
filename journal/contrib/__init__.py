"""Optional bridges to other libraries, each behind an extra (``pip install durable-ui[pydantic-ai]``).

The top floor of the engine: a bridge may import anything in ``journal``; nothing in ``journal``
imports a bridge (``lint-imports`` checks both).
"""
