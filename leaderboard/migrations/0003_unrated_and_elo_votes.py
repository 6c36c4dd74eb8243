from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("leaderboard", "0002_incremental_elo"),
    ]

    operations = [
        migrations.AddField(
            model_name="leaderboardsnapshot",
            name="unrated",
            field=models.JSONField(
                default=list, help_text="Models without a vote here: not yet rated, not ranked."
            ),
        ),
        migrations.AddField(
            model_name="leaderboardsnapshot",
            name="elo_votes",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
