"""Dashboard views, one module per page: small decorated functions that call journal's public API."""
