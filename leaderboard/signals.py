"""Keeping the refresh's running counts (leaderboard.tally) honest: a battle, vote or reply they
have counted that is changed or deleted afterwards (in the admin: the arena itself never touches
an ended battle) makes them stale, and the next refresh counts every vote again.

Bulk ``QuerySet.update()`` sends no signal: code that updates counted battles, votes or replies
that way calls ``leaderboard.services.mark_tally_stale()`` itself.
"""

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from leaderboard.services import mark_tally_stale
from votes.models import Battle, Message, Vote


@receiver([post_save, post_delete], sender=Battle)
def counted_battle_changed(sender: type[Battle], instance: Battle, **kwargs: Any) -> None:
    if instance.tallied:
        mark_tally_stale()


@receiver([post_save, post_delete], sender=Vote)
@receiver([post_save, post_delete], sender=Message)
def counted_part_changed(sender: type[Vote | Message], instance: Vote | Message, **kwargs: Any) -> None:
    # The arena saves a vote or reply with its battle at hand (not counted: not ended yet).
    if sender.battle.is_cached(instance):
        counted = instance.battle.tallied
    else:
        counted = Battle.objects.filter(pk=instance.battle_id, tallied=True).exists()
    if counted:
        mark_tally_stale()
