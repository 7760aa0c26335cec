from django.contrib.auth import views as auth_views
from django.urls import path

from runs.views import actions, approvals, audit, common, compare, detail, erasure, retention, runs, thread, workers

urlpatterns = [
    path("favicon.ico", common.favicon, name="favicon"),
    path("login/", auth_views.LoginView.as_view(template_name="registration/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", runs.run_list, name="run_list"),
    path("runs/live/", runs.run_list_live, name="run_list_live"),
    path("runs/bulk/", runs.bulk_action, name="run_bulk"),
    path("runs/bulk/<uuid:job_id>/", runs.bulk_job, name="bulk_job"),
    path("runs/compare/", compare.compare, name="run_compare"),
    path("runs/<uuid:run_id>/", detail.run_detail, name="run_detail"),
    path("runs/<uuid:run_id>/header/", detail.run_header, name="run_header"),
    path("runs/<uuid:run_id>/tail/", detail.run_tail, name="run_tail"),
    path("runs/<uuid:run_id>/events/", detail.run_events, name="run_events"),
    path("runs/<uuid:run_id>/events/<int:seq>/payload/", detail.event_payload, name="event_payload"),
    path("runs/<uuid:run_id>/thread/", thread.run_thread, name="run_thread"),
    path("runs/<uuid:run_id>/act/<slug:action>/", actions.run_action, name="run_act"),
    path("approvals/", approvals.inbox, name="approvals"),
    path("approvals/decide/", approvals.decide, name="approval_decide"),
    path("approvals/badge/", approvals.badge, name="approvals_badge"),
    path("workers/", workers.workers, name="workers"),
    path("agents/<str:agent>/act/", workers.agent_action, name="agent_act"),
    path("overview/", workers.overview, name="overview"),
    path("audit/", audit.audit_log, name="audit"),
    path("settings/roles/", audit.roles, name="roles"),
    path("settings/roles/set/", audit.set_role, name="set_role"),
    path("settings/retention/", retention.retention_page, name="retention"),
    path("settings/retention/set/", retention.retention_set, name="retention_set"),
    path("settings/retention/<int:rule_id>/delete/", retention.retention_delete, name="retention_delete"),
    path("settings/retention/purge/", retention.retention_purge, name="retention_purge"),
    path("settings/erasure/", erasure.erasure_page, name="erasure"),
    path("settings/erasure/erase/", erasure.erasure_erase, name="erasure_erase"),
]
