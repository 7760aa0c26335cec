"""API tokens and webhook endpoints for the HTTP API."""
