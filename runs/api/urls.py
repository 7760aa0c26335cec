"""Mounted by durable_ui/urls.py at /api/."""

from django.urls import path

from runs.api.endpoints import api

urlpatterns = [path("", api.urls)]
