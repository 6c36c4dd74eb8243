"""Leaderboard snapshots: every category's board as computed by one refresh."""

from django.db import models


class LeaderboardRefresh(models.Model):
    """One recomputation of every category. Pages read the latest; older ones stay viewable
    ("leaderboard as of")."""

    created = models.DateTimeField(auto_now_add=True, db_index=True)
    last_vote_id = models.PositiveBigIntegerField(default=0, help_text="The newest vote this refresh saw.")
    seconds = models.FloatField(default=0.0, help_text="How long the refresh took.")
    stages = models.JSONField(default=dict, blank=True, help_text="Seconds per stage of the refresh.")
    episodes_through = models.DateTimeField(
        null=True, blank=True, help_text="The newest battle end whose fix episodes this refresh recorded."
    )

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"Leaderboard of {self.created:%Y-%m-%d %H:%M:%S}"


class LeaderboardSnapshot(models.Model):
    """One category's leaderboard in a refresh."""

    refresh = models.ForeignKey(LeaderboardRefresh, on_delete=models.CASCADE, related_name="snapshots")
    position = models.PositiveSmallIntegerField(default=0, help_text="Display order of the category.")
    category = models.CharField(max_length=120, help_text='"overall", "first_try", "fixing" or "task:<category>".')
    title = models.CharField(max_length=200)
    votes = models.PositiveIntegerField(help_text="Votes counted.")
    method = models.CharField(max_length=20, default="bootstrap")
    pair_weighted = models.BooleanField(
        default=False,
        help_text="Votes weighted by the inverse of their pair's sampling probability (every counted battle "
        "recorded it).",
    )
    # Per model: model, rating, lower, upper, rank, votes, elo, provisional, fix rates.
    rows = models.JSONField(default=list)
    # The overall board with style control (leaderboard.style): rows as ``rows`` (no Elo), and
    # each style coefficient {value, lower, upper}.
    style_rows = models.JSONField(default=list, blank=True)
    style_coefficients = models.JSONField(default=dict, blank=True)
    unrated = models.JSONField(default=list, help_text="Models without a vote here: not yet rated, not ranked.")
    excluded = models.JSONField(default=dict, help_text="Votes left out, per reason.")
    # Square matrices in the order of model_names (the rated models, in rank order): win
    # fractions (null where never met), votes.
    model_names = models.JSONField(default=list)
    win_fractions = models.JSONField(default=list)
    battle_counts = models.JSONField(default=list)
    # Online Elo, maintained incrementally: its exact values, and the last vote it has taken (votes
    # count once their battle has ended, in the order (battle end, vote id)).
    elo_state = models.JSONField(default=dict)
    elo_through_ended = models.DateTimeField(null=True, blank=True)
    elo_through_vote = models.PositiveBigIntegerField(default=0)
    # How many votes Elo has taken: a later refresh that counts a different number up to the
    # same marker knows exclusions changed, and recomputes Elo from the start.
    elo_votes = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["refresh", "position"]
        constraints = [models.UniqueConstraint(fields=["refresh", "category"], name="snapshot_one_per_category")]

    def __str__(self) -> str:
        return f"{self.category} ({self.refresh})"


class VoteTallyState(models.Model):
    """The counts the latest refresh kept for the next one (leaderboard.tally), stored whole: a
    single row, derived from the votes and rebuilt from them whenever it cannot be followed."""

    data = models.BinaryField(help_text="leaderboard.tally.Tally.to_bytes()")
    stale = models.BooleanField(
        default=False, help_text="A counted battle, vote or reply changed since: the next refresh recounts every vote."
    )
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"Vote counts of {self.updated:%Y-%m-%d %H:%M:%S}" + (" (stale)" if self.stale else "")
