import os

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured


class JournalConfig(AppConfig):
    name = "journal"
    verbose_name = "Durable engine"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here because Django's app loading requires it: these modules import models.
        from journal.driver import worker
        from journal.integrations import bell, checks, discovery  # noqa: F401  (checks registers system checks)
        from journal.operations import retention
        from journal.store import doorbell

        if any(os.environ.get(name) for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
            # Imported here because Django's app loading requires it, and only then: the otel extra is optional.
            try:
                from journal.integrations import otel
            except ImportError as exc:
                raise ImproperlyConfigured(f"OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed "
                                           f"({exc.name}): pip install 'durable-ui[otel]'") from exc
            otel.install()
        doorbell.set_backend(bell.ring)  # seams: the store rings, Celery (a higher floor) answers;
        worker.add_housekeeping(retention.purge)  # the driver runs what the operations floor registers
        bell.prepare()  # Celery imported at start-up only where it is switched on
        discovery.autodiscover()
