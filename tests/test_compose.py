"""compose.yaml is valid against the compose-spec schema and runs every service the design names."""

import subprocess
import sys
from pathlib import Path

import yaml

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
    # daphne's --proxy-headers believes any peer's X-Forwarded-For; the site reads it only from
    # TRUSTED_PROXIES (tests/test_trusted_proxies.py).
    assert "--proxy-headers" not in services["web"]["command"]
    assert "TRUSTED_PROXIES" in compose["x-arena"]["environment"]
