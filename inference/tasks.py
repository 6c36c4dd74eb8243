"""Celery tasks of the inference app: the beat's endpoint check (inference.readiness)."""

from celery import shared_task

from inference import warming


@shared_task(name="inference.check_endpoints", ignore_result=True)
def check_endpoints() -> int:
    """Report each enabled model served elsewhere ready while its server lists it."""
    return warming.check_endpoints()
