"""System checks for the engine's invariants, with stable ids."""

from django.conf import settings
from django.core import checks


@checks.register()
def check_lease(app_configs, **kwargs):
    errors = []
    ttl = getattr(settings, "DURABLE_LEASE_SECONDS", 30)
    if not 1 <= ttl <= 30:
        errors.append(checks.Error(
            f"DURABLE_LEASE_SECONDS={ttl}: a dead worker's runs must be picked up within about 30 s",
            hint="set it between 1 and 30", id="journal.E001"))
    return errors
