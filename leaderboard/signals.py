"""Keeping the refresh's running counts (leaderboard.tally) honest: a battle, vote or reply they
have counted that is changed or deleted afterwards (in the admin: the arena itself never touches
an ended battle) makes them stale, and the next refresh counts every vote again.

Bulk ``QuerySet.update()`` sends no signal: code that updates counted battles, votes or replies
that way calls ``leaderboard.services.mark_tally_stale()`` itself.
"""

from typing import Any

from django.db.models.signals import post_delete, post_save, pre_delete
from django.dispatch import receiver

from leaderboard.services import mark_tally_stale
from votes.models import Battle, Message, Vote


def _is_counted(battle_id: int) -> bool:
    return Battle.objects.filter(pk=battle_id, tallied=True).exists()


@receiver(post_save, sender=Battle)
def counted_battle_saved(sender: type[Battle], instance: Battle, **kwargs: Any) -> None:
    # An instance loaded before a refresh counted its battle still says it is not counted: an
    # ended battle is looked up. (Battle.save never writes ``tallied`` back.)
    if instance.tallied or (instance.is_ended and _is_counted(instance.pk)):
        mark_tally_stale()


@receiver(pre_delete, sender=Battle)
def counted_battle_deleted(sender: type[Battle], instance: Battle, **kwargs: Any) -> None:
    if instance.tallied or _is_counted(instance.pk):
        mark_tally_stale()


@receiver([post_save, post_delete], sender=Vote)
@receiver([post_save, post_delete], sender=Message)
def counted_part_changed(sender: type[Vote | Message], instance: Vote | Message, **kwargs: Any) -> None:
    # The arena saves a vote or reply with its battle at hand, not ended (not counted): no query.
    if sender.battle.is_cached(instance):
        battle = instance.battle
        counted = battle.tallied or (battle.is_ended and _is_counted(battle.pk))
    else:
        counted = _is_counted(instance.battle_id)
    if counted:
        mark_tally_stale()
