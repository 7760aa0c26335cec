"""The audit log in Django's admin: read-only, because an audit trail that can be edited is not one."""

from django.contrib import admin

from runs.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("created_at", "actor", "action", "run_id", "target", "ok")
    list_filter = ("action", "ok")
    search_fields = ("actor", "comment", "result", "target")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
