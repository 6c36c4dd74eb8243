"""inference.model_process: a process about to serve models (manage.py serve, bench_engine
--memory) runs Keras without scikit-learn and pandas, which the virtual environment has for the
tests, and serves a model all the same. Each case in a fresh Python process, as the marks hold
for a process's life. (That manage.py serve prepares its process so:
tests/test_model_readiness.py.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import PRESETS_DIR

REPO = Path(__file__).resolve().parents[1]

REPORT = """
import json, sys
print(json.dumps({name: sys.modules.get(name) is not None for name in ("keras", "sklearn", "pandas")}))
"""


def run(script: str) -> dict[str, bool]:
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "KERAS_BACKEND": "jax"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_keras_imports_the_test_only_packages_where_they_are_installed() -> None:
    """What there is to save: here, as in the arena's virtual environment, Keras imports both."""
    assert run("import keras" + REPORT) == {"keras": True, "sklearn": True, "pandas": True}


def test_a_prepared_process_serves_a_model_without_them() -> None:
    script = (
        f"""
from inference import model_process
assert model_process.prepare() == ("sklearn", "pandas")
import keras_hub
import inference.tokenizers  # The bundled presets' tokenizer class.
lm = keras_hub.models.CausalLM.from_preset({str(PRESETS_DIR / "tiny-gemma")!r})
text = lm.generate("Add a meeting with Fred", max_length=24)
assert isinstance(text, str) and text.startswith("Add a meeting with Fred"), text
try:
    import sklearn
except ImportError:
    pass
else:
    raise AssertionError("sklearn was imported")
"""
        + REPORT
    )
    assert run(script) == {"keras": True, "sklearn": False, "pandas": False}


def test_packages_already_imported_are_left_alone() -> None:
    script = (
        """
import pandas
from inference import model_process
assert model_process.prepare() == ("sklearn",)
import keras
"""
        + REPORT
    )
    assert run(script) == {"keras": True, "sklearn": False, "pandas": True}
