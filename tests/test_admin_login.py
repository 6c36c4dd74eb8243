"""Admin logins are throttled: after ARENA_LOGIN_FAILURES wrong passwords from one address,
that address cannot log in (even with the right password) until the lockout passes; another
address is not affected (django-axes)."""

import pytest
from django.contrib.auth.models import User

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/?next=/admin/"


def log_in(client, password: str, address: str) -> int:
    return client.post(LOGIN, {"username": "admin", "password": password}, REMOTE_ADDR=address).status_code


def test_wrong_passwords_lock_the_address_out(client, settings) -> None:
    User.objects.create_superuser("admin", "a@example.org", "correct-horse-battery")
    attacker, admin = "198.51.100.66", "198.51.100.7"
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in(client, "guess", attacker) == 200  # The form again, with its error.
    assert log_in(client, "guess", attacker) == 429  # The last allowed failure locks the address.
    assert log_in(client, "correct-horse-battery", attacker) == 429  # Even the right password.
    assert log_in(client, "correct-horse-battery", admin) == 302  # Another address logs in.
