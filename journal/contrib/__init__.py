"""Optional bridges to other libraries, each behind its own extra (`pip install durable-ui[langgraph]`).

The top floor: a bridge may import anything in `journal`; nothing in `journal` imports a bridge.
"""
