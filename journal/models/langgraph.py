"""LangGraph threads stored by `journal.contrib.langgraph.JournalSaver`.

Three tables, the shape LangGraph's own SQL savers use, but the channel values themselves live
in the content-addressed Blob store: a channel row holds only references (a manifest), so a
value that appears in many checkpoints (or threads: `copy_thread`) is stored once, and a growing
list stores each element once (see `journal.contrib.langgraph.values`).

`thread_id` is LangGraph's thread; when a graph runs as a durable-ui run it is the run's id.
`langgraph_run_id` is LangGraph's own run id (from the checkpoint metadata), a different
concept from durable-ui's run, hence the longer name.
"""

from django.db import models
from django.utils import timezone


class LangGraphCheckpoint(models.Model):
    thread_id = models.CharField(max_length=255)
    checkpoint_ns = models.CharField(max_length=255, blank=True, default="")
    checkpoint_id = models.CharField(max_length=255)  # uuid6: sorts by creation
    parent_checkpoint_id = models.CharField(max_length=255, blank=True, default="")  # "" for a root
    langgraph_run_id = models.CharField(max_length=255, blank=True, default="")
    checkpoint_type = models.CharField(max_length=32)  # the serializer's type tag
    checkpoint = models.BinaryField()  # the checkpoint without its channel values
    metadata_type = models.CharField(max_length=32)
    metadata = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["thread_id", "checkpoint_ns", "checkpoint_id"],
                                    name="langgraph_checkpoint_key"),
        ]
        indexes = [models.Index(fields=["langgraph_run_id"], name="langgraph_checkpoint_run")]

    def __str__(self) -> str:
        return f"{self.thread_id}/{self.checkpoint_ns}@{self.checkpoint_id}"


class LangGraphChannel(models.Model):
    """One version of one channel's value: a reference into the Blob store (or "empty")."""

    thread_id = models.CharField(max_length=255)
    checkpoint_ns = models.CharField(max_length=255, blank=True, default="")
    channel = models.CharField(max_length=255)
    version = models.CharField(max_length=255)
    value = models.JSONField()  # ["empty"] | ["value", type, sha256] | ["list", [[type, sha256], ...] chunks]

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["thread_id", "checkpoint_ns", "channel", "version"],
                                    name="langgraph_channel_key"),
        ]

    def __str__(self) -> str:
        return f"{self.thread_id}/{self.checkpoint_ns} {self.channel}@{self.version}"


class LangGraphWrite(models.Model):
    """A pending write of a task, saved before the next checkpoint (so a crashed step keeps its siblings' work)."""

    thread_id = models.CharField(max_length=255)
    checkpoint_ns = models.CharField(max_length=255, blank=True, default="")
    checkpoint_id = models.CharField(max_length=255)
    task_id = models.CharField(max_length=255)
    idx = models.IntegerField()  # negative for the special channels (error, interrupt, ...)
    channel = models.CharField(max_length=255)
    task_path = models.CharField(max_length=1000, blank=True, default="")
    value = models.JSONField()  # a reference into the Blob store, as LangGraphChannel.value

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                                    name="langgraph_write_key"),
        ]

    def __str__(self) -> str:
        return f"{self.thread_id}/{self.checkpoint_ns}@{self.checkpoint_id} {self.task_id}[{self.idx}]"
