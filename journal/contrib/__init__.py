"""Optional bridges to other libraries, each behind its own extra (``pip install durable-ui[langgraph]``,
``durable-ui[pydantic-ai]``).

The top floor of the engine: a bridge may import anything in ``journal``; nothing in ``journal``
imports a bridge (``lint-imports`` checks both).
"""
