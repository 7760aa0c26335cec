"""The template backend every page renders through: Django's, plus one guarantee — its output can be
written as UTF-8.

A Python string may hold a lone surrogate ("\\ud800"); UTF-8 cannot. Such text reaches pages from
agent output, exception messages and tool output read back from JSON columns (which keep it escaped),
and Django only notices when the response encodes the rendered page: a 500 for the whole page,
whatever template, filter or tag put the character there. Making the *rendered text* writable here
covers every page, fragment, partial and error page at once, instead of patching each view or filter.

Each surrogate code point is shown as its escape (``\\ud800``), not dropped or replaced by U+FFFD, so an
engineer reading a failed run sees what the data held. The escape is six ASCII characters with no
HTML, JS or URL meaning, so it is as inert as the text it replaces in every context a template writes.
"""

from __future__ import annotations

import re

from django.template.backends.django import DjangoTemplates as _DjangoTemplates
from django.template.backends.django import Template as _Template
from django.template.backends.django import reraise
from django.template.exceptions import TemplateDoesNotExist
from django.utils.safestring import SafeData, mark_safe

_SURROGATE = re.compile("[\ud800-\udfff]")


def writable(text: str) -> str:
    """``text`` with every surrogate code point replaced by its visible escape; safe-ness is kept."""
    if not _SURROGATE.search(text):  # the common case: one C-speed scan, no copy
        return text
    fixed = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return mark_safe(fixed) if isinstance(text, SafeData) else fixed


class Template(_Template):
    def render(self, context=None, request=None) -> str:
        return writable(super().render(context, request))


class DjangoTemplates(_DjangoTemplates):
    """settings.TEMPLATES' backend (with NAME "django", so django-template-partials still wraps it)."""

    def from_string(self, template_code):
        return Template(self.engine.from_string(template_code), self)

    def get_template(self, template_name):
        try:
            return Template(self.engine.get_template(template_name), self)
        except TemplateDoesNotExist as exc:
            reraise(exc, self)
