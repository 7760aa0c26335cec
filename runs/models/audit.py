"""Audit log and dashboard settings."""
