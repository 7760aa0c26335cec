from django.apps import AppConfig


class JournalConfig(AppConfig):
    name = "journal"
    verbose_name = "Durable engine"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from journal import checks, discovery  # noqa: F401  (registers system checks)

        discovery.autodiscover()
