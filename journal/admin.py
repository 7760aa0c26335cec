from django.contrib import admin

from journal import models


@admin.register(models.Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "agent", "version", "status", "created_at", "steps", "lease_owner")
    list_filter = ("status", "agent")
    search_fields = ("id", "agent", "error")
    readonly_fields = [f.name for f in models.Run._meta.fields]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(models.SessionEvent)
class SessionEventAdmin(ReadOnlyAdmin):
    list_display = ("run", "seq", "kind", "position", "step_name", "actor", "created_at")
    list_filter = ("kind",)
    search_fields = ("run__id", "step_name")

    def has_add_permission(self, request):
        return False


@admin.register(models.Harness)
class HarnessAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "fingerprint", "durability", "checkpoint_policy", "registered_at")


@admin.register(models.Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "hostname", "pid", "concurrency", "heartbeat_at", "stopped_at")


@admin.register(models.SideEffect)
class SideEffectAdmin(ReadOnlyAdmin):
    list_display = ("run", "position", "step_name", "idempotency_key", "status", "attempts")
    list_filter = ("status",)


@admin.register(models.Signal)
class SignalAdmin(ReadOnlyAdmin):
    list_display = ("run", "name", "actor", "created_at", "consumed_at")


@admin.register(models.Sandbox)
class SandboxAdmin(ReadOnlyAdmin):
    list_display = ("run", "root", "isolation", "created_at")


@admin.register(models.SandboxCommand)
class SandboxCommandAdmin(ReadOnlyAdmin):
    list_display = ("run", "position", "command", "exit_code", "duration_ms")


@admin.register(models.Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("run", "position", "decision", "reason", "bytes_written")


@admin.register(models.Blob)
class BlobAdmin(ReadOnlyAdmin):
    list_display = ("sha256", "size", "stored_size", "created_at")
    exclude = ("data",)


@admin.register(models.TraceSpan)
class TraceSpanAdmin(ReadOnlyAdmin):
    list_display = ("run", "name", "kind", "position", "status", "duration_ms")
