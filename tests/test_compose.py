"""compose.yaml is valid against the compose-spec schema, runs every service the design names, and
its health checks pass on a real deployment's settings."""

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.db import connection

from votes.testing.stack import Stack, database_url

ROOT = Path(__file__).resolve().parent.parent


def test_compose_file_matches_compose_spec() -> None:
    result = subprocess.run(
        [Path(sys.executable).parent / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", "compose.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_services_and_health_checks() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "inference", "beat"} <= set(services)
    for name in ("postgres", "redis", "web", "inference"):
        assert "healthcheck" in services[name], name
    inference = " ".join(services["inference"]["command"])
    assert "run_inference_host" in inference and "model." in inference
    assert services["migrate"]["restart"] == "no"
    # Models served elsewhere: a light worker streams their replies, and vLLM runs only on request.
    endpoints = " ".join(services["endpoints"]["command"])
    assert "ARENA_ENDPOINT_QUEUE" in endpoints and "--pool threads" in endpoints
    assert "VLLM_API_KEY" in services["endpoints"]["environment"]
    assert services["vllm"]["profiles"] == ["vllm"] and "ports" not in services["vllm"]
    # daphne's --proxy-headers believes any peer's X-Forwarded-For; the site reads it only from
    # TRUSTED_PROXIES (tests/test_trusted_proxies.py).
    assert "--proxy-headers" not in services["web"]["command"]
    assert "TRUSTED_PROXIES" in compose["x-arena"]["environment"]


@pytest.mark.django_db(transaction=True)
def test_the_web_health_check_passes_with_a_real_allowed_hosts(tmp_path: Path) -> None:
    """compose's own health-check command, run against daphne serving a real site name over
    HTTPS: the probe comes by address, and is answered before the Host check and the redirect, as
    are readiness (a load balancer's probe) and the metrics (Prometheus's scrape). Any other page
    asked for by address is refused (400), as it should be."""
    probe = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["web"]["healthcheck"]["test"]
    assert probe[:3] == ["CMD", "python", "-c"] and "http://127.0.0.1:8000/healthz" in probe[3]
    stack = Stack(
        database_url=database_url(connection.settings_dict),
        redis_url=settings.REDIS_URL,
        log_dir=tmp_path,
        env={"ALLOWED_HOSTS": "arena.example.org", "HTTPS": "1"},
    )
    try:
        _, url = stack.start_web()
        checked = subprocess.run([sys.executable, "-c", probe[3].replace("http://127.0.0.1:8000", url)], timeout=30)
        assert checked.returncode == 0
        with urllib.request.urlopen(f"{url}/readyz", timeout=30) as response:
            assert response.status == 200 and json.loads(response.read())["status"] == "ok"
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
            assert response.status == 200 and b"arena_replies_failed_total" in response.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/leaderboard/", timeout=10)
        assert refused.value.code == 400
    finally:
        stack.stop()


def test_compose_exposes_metrics_and_readiness_but_scrapes_nothing() -> None:
    """Operators' endpoints (docs/operations.md): the web tier's /metrics and /readyz on its port,
    each worker's metrics on a port of its own within the compose network; no Prometheus."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert not any("prometheus" in str(service.get("image", "")) for service in services.values())
    for name in ("worker", "inference"):
        environment = services[name]["environment"]
        assert environment["ARENA_METRICS_PORT"].endswith(":-9100}"), name
        assert services[name]["expose"] == ["9100"], name
        assert "ports" not in services[name], name  # Not published on the host.
    # The prefork pool's processes add their values up in a directory that starts empty.
    multiproc = services["worker"]["environment"]["PROMETHEUS_MULTIPROC_DIR"]
    assert any(mount.split(":")[0] == multiproc for mount in services["worker"]["tmpfs"])
    assert "PROMETHEUS_MULTIPROC_DIR" not in services["inference"]["environment"]  # A thread pool.
    # Its health check's own process would leave files there every 30 s.
    assert "env -u PROMETHEUS_MULTIPROC_DIR " in services["worker"]["healthcheck"]["test"][1]
    assert "LOG_FORMAT" in compose["x-arena"]["environment"]
