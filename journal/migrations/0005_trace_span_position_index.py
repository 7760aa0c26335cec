"""An index on (run, position) for trace spans: the run page reads a window of step positions of a long run."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('journal', '0004_langgraph_checkpoints'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='tracespan',
            index=models.Index(fields=['run', 'position'], name='span_run_position'),
        ),
    ]
