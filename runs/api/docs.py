"""The API's Swagger UI page, rendered from this server's own static files.

django-ninja serves them so only when ``ninja`` is an installed app, and otherwise links a CDN (which
a machine without internet, or the page's CSP, would refuse). It is not an installed app here: every
installed app is imported by every process at start-up, and ninja with pydantic cost each worker
about 0.12 s before it could resume a run. Its templates and static files are on the template and
static paths instead (``NINJA_DIR`` in settings), and this page renders its template directly:
what ninja's ``Swagger.render_page`` does when the app is installed.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from ninja.openapi import docs


class LocalSwagger(docs.Swagger):
    def render_page(self, request: HttpRequest, api: Any, **kwargs: Any) -> HttpResponse:
        swagger = {**self.settings, "url": self.get_openapi_url(api, kwargs)}
        return render(request, self.template, {"swagger_settings": json.dumps(swagger, indent=1), "api": api,
                                               "add_csrf": docs._csrf_needed(api)})
