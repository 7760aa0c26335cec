"""Search summaries: what the runs list searches by, kept current by the engine as runs move.

The journal is the truth; these rows are its index for "which runs ran step X" and "which failed
at step X", so a search is an index lookup rather than a scan of every run's session log.
"""

from django.db import models

from journal.models.keys import AppendKey


def step_name_keys(name: str) -> list[str]:
    """The names a search for this step may type: the dotted path and each of its dotted tails
    (``tests.agents.demo.explode`` → ``explode``, ``demo.explode``, …), so the match of "the last
    dotted parts" is an equality on an index."""
    parts = name[:200].split(".")
    return [".".join(parts[i:]) for i in range(len(parts)) if parts[i]]


class RunStep(models.Model):
    """A step name a run recorded (``failed=False``), or the step it failed at (``failed=True``);
    one row per distinct name (and each dotted tail of it) per run."""

    id = AppendKey(primary_key=True)
    run = models.ForeignKey("journal.Run", on_delete=models.CASCADE, related_name="step_names", db_index=False)
    name = models.CharField(max_length=200)
    failed = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "failed", "run"], name="runstep_name")]
        indexes = [models.Index(fields=["run"], name="runstep_run")]

    def __str__(self) -> str:
        return f"{self.run_id} {'failed at' if self.failed else 'ran'} {self.name}"
