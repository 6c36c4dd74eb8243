"""Reads of the model roster."""

from collections.abc import Sequence

from django.conf import settings

from inference.models import LLM


def models_for_host(*, names: Sequence[str] = (), queues: Sequence[str] = ()) -> list[LLM]:
    """The enabled models an inference host serves: by name, by queue, or all of them; never a
    model served elsewhere (its endpoint).

    Raises ValueError naming any requested model or queue that the roster does not have.
    """
    models = LLM.objects.enabled().filter(endpoint_url="").order_by("name")
    if names:
        elsewhere = sorted(LLM.objects.filter(name__in=names).exclude(endpoint_url="").values_list("name", flat=True))
        if elsewhere:
            raise ValueError(f"{', '.join(elsewhere)} is served by its endpoint, not by an inference host.")
        models = models.filter(name__in=names)
        missing = sorted(set(names) - {m.name for m in models})
        if missing:
            raise ValueError(f"No enabled model named {', '.join(missing)} in the roster.")
    if queues:
        models = models.filter(queue__in=queues)
        missing = sorted(set(queues) - {m.queue for m in models})
        if missing:
            raise ValueError(f"No enabled model on queue {', '.join(missing)}.")
    return list(models)


def hosted_beside(model: LLM) -> list[LLM]:
    """The other enabled models hosted with ``model`` on the arena's own engines (not served
    elsewhere), by name: in the embedded arena every one (its in-process worker serves them all),
    else those of its queue (the same workers serve them)."""
    others = LLM.objects.enabled().filter(endpoint_url="").exclude(pk=model.pk)
    if settings.GENERATION_BACKEND != "in-process":
        others = others.filter(queue=model.queue)
    return list(others.order_by("name"))
