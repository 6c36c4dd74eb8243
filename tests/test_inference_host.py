"""manage.py run_inference_host: loads and compiles its models, reports ready, refuses bad input."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def test_host_warms_up_and_reports_its_queues(demo_llms) -> None:
    out = StringIO()
    call_command("run_inference_host", "--models", "tiny-gemma", "--warm-up-only", "--evaluations", stdout=out)
    text = out.getvalue()
    assert "tiny-gemma: loaded and compiled in" in text
    queue = demo_llms[0].queue
    assert f"Inference host ready on {queue}, evaluations" in text


def test_host_refuses_unknown_models_and_queues(demo_llms) -> None:
    with pytest.raises(CommandError, match="No enabled model named ghost"):
        call_command("run_inference_host", "--models", "ghost", "--warm-up-only")
    with pytest.raises(CommandError, match=r"No enabled model on queue model\.ghost"):
        call_command("run_inference_host", "--queues", "model.ghost", "--warm-up-only")


def test_host_serves_over_http_once_warm(demo_llms) -> None:
    out = StringIO()
    call_command("run_inference_host", "--models", "tiny-gemma", "--serve", "--warm-up-only", stdout=out)
    assert "tiny-gemma: loaded and compiled in" in out.getvalue()
