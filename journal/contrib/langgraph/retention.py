"""A run's LangGraph thread goes with the run: retention (and any other deletion of a Run)
deletes the thread's checkpoints, channel versions and writes in the same transaction.

The thread rows have no foreign key to Run (a thread need not be a run), so this receiver is
the link; it is connected when `journal.contrib.langgraph` is imported, which every process that
runs or purges graphs does (the graphs' modules import it).
"""

from __future__ import annotations

from django.db.models.signals import post_delete
from django.dispatch import receiver

from journal.models import LangGraphChannel, LangGraphCheckpoint, LangGraphWrite, Run


@receiver(post_delete, sender=Run, dispatch_uid="journal.contrib.langgraph.delete_thread_of_run")
def delete_thread_of_run(sender, instance: Run, **kwargs) -> None:
    thread_id = str(instance.id)
    for model in (LangGraphWrite, LangGraphChannel, LangGraphCheckpoint):
        model.objects.filter(thread_id=thread_id).delete()
