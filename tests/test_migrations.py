"""Every model change has its migration."""

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_missing_migrations() -> None:
    call_command("makemigrations", check=True, dry_run=True, verbosity=0)
