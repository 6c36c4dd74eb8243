from typing import Any

from django.apps import AppConfig
from django.core import checks


class VotesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "votes"
    verbose_name = "Battles and votes"

    def ready(self) -> None:
        checks.register(check_rate_limits)
        checks.register(check_pair_sampling)


def check_rate_limits(**kwargs: Any) -> list[checks.CheckMessage]:
    """A malformed ARENA_RATE_LIMITS stops the site at start-up, with the reason."""
    from django.conf import settings

    from votes.rate_limits import parse_limits

    try:
        parse_limits(settings.ARENA_RATE_LIMITS)
    except ValueError as error:
        return [checks.Error(str(error), id="votes.E001")]
    return []


def check_pair_sampling(**kwargs: Any) -> list[checks.CheckMessage]:
    """ARENA_PAIR_SAMPLING names a policy of votes.pairing."""
    from django.conf import settings

    from votes.pairing import POLICIES

    if settings.ARENA_PAIR_SAMPLING not in POLICIES:
        message = f"ARENA_PAIR_SAMPLING is {settings.ARENA_PAIR_SAMPLING!r}; expected one of {', '.join(POLICIES)}."
        return [checks.Error(message, id="votes.E002")]
    return []
