"""Admin logins are throttled: after ARENA_LOGIN_FAILURES wrong passwords from one network (the
/24 or /64, as every per-client limit counts), no address of that network can log in (even with
the right password) until the lockout passes; another network is not affected (django-axes)."""

import pytest
from django.contrib.auth.models import User

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/?next=/admin/"


def log_in(client, password: str, address: str) -> int:
    return client.post(LOGIN, {"username": "admin", "password": password}, REMOTE_ADDR=address).status_code


def test_wrong_passwords_lock_the_network_out(client, settings) -> None:
    User.objects.create_superuser("admin", "a@example.org", "correct-horse-battery")
    attacker, neighbour, admin = "198.51.100.66", "198.51.100.67", "203.0.113.7"
    for guess in range(settings.AXES_FAILURE_LIMIT - 1):
        # The form again, with its error; spread over the network's addresses, the failures add up.
        assert log_in(client, "guess", f"198.51.100.{10 + guess}") == 200
    assert log_in(client, "guess", attacker) == 429  # The last allowed failure locks the network.
    assert log_in(client, "correct-horse-battery", attacker) == 429  # Even the right password.
    assert log_in(client, "correct-horse-battery", neighbour) == 429  # From the same /24.
    assert log_in(client, "correct-horse-battery", admin) == 302  # Another network logs in.
