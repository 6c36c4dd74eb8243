"""Smoke test of the engine benchmark (inference.bench and `manage.py bench_engine`): tiny sizes,
structure and sanity of the figures only; timings are machine-dependent and never asserted."""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command

from inference.bench import bench_prompts, default_preset, format_table, roofline, run_bench
from inference.registry import read_preset

REPO = Path(__file__).resolve().parents[1]
PRESET = REPO / "tests" / "fixtures" / "presets" / "tiny-gemma"
PRESETS_DIR = REPO / "inference" / "presets"
# Timings of the machine and of busy steps as short as they go: their figures are checked for
# structure only.
SIZES = {"prompts": 2, "max_new_tokens": 8, "concurrency": (1, 2), "slots": 2, "repeats": 2, "timing_seconds": 0.01}
FIGURES = ("aggregate_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "stream_tokens_per_s_p50", "wall_s")
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")


def check_result(result: dict[str, Any]) -> None:
    json.dumps(result)  # Serialisable as it is.
    assert result["prompts"] == 2 and result["slots"] == 2
    assert result["repeats"] == 2
    assert "speedup_8" in result and result["speedup_8"] is None  # No level 8 in this run.
    assert result["recompiles_after_warmup"] == 0
    assert result["outputs_consistent"] is True
    # The engine's own dispatch size, as served, and the one it settled at.
    assert result["steps_per_dispatch"] is None
    assert 1 <= result["steps_per_dispatch_settled"] <= result["max_steps_per_dispatch"]
    assert result["tokens_per_prompt_min"] >= 8
    serial = result["serial_generate"]
    levels = result["engine"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    for figures in (serial, *levels):
        assert figures["requests"] == 4  # Two prompts, two rounds, pooled.
        assert figures["tokens"] == serial["tokens"] > 0  # Exactly the same work in both paths.
        assert all(figures[name] > 0 for name in FIGURES), figures
        assert figures["ttft_p50_s"] <= figures["ttft_p95_s"]
    assert all(level["compilations"] == 0 for level in levels)
    # The two prompts share the chat template and system prompt: later prefills start from it.
    cache = result["prefix_cache"]
    assert cache["rows"] > 0 and cache["hits"] > 0
    assert 0 < cache["reused_tokens"] < cache["prompt_tokens"]
    machine = result["machine"]
    assert machine["memory_bytes_per_s"] > 0 and machine["flops_per_s"] > 0
    # The bound takes the faster of the two memory reads: all cores (JAX) and one thread (NumPy).
    assert machine["memory_bytes_per_s"] == max(
        machine["memory_bytes_per_s_all_cores"], machine["memory_bytes_per_s_one_thread"]
    )
    # Decode steps of every slot, timed at each window the workload's positions pass through:
    # from the one holding the shortest prompt to the one holding the longest request's end.
    steps = result["busy_decode_steps"]
    windows = [step["window"] for step in steps]
    assert windows == sorted(windows) and windows[-1] >= result["max_length"]
    assert windows[0] >= result["prompt_tokens_min"]
    for step in steps:
        assert step["step_s"] > 0
        assert step["tokens_per_s"] == pytest.approx(result["slots"] / step["step_s"])
    (bound,) = result["roofline"]  # Level 1 (no level 8 here).
    assert bound["batch"] == 1
    assert bound["bound_tokens_per_s"] == min(bound["memory_bound_tokens_per_s"], bound["compute_bound_tokens_per_s"])
    assert bound["engine_share_of_bound"] == pytest.approx(bound["engine_tokens_per_s"] / bound["bound_tokens_per_s"])
    assert bound["matmul_floor_tokens_per_s"] > 0
    assert bound["engine_share_of_matmul_floor"] == pytest.approx(
        bound["engine_tokens_per_s"] / bound["matmul_floor_tokens_per_s"]
    )


def test_roofline_arithmetic() -> None:
    class Model:
        weights = [np.zeros((1000, 250), np.float32)]  # 1 MB of float32 weights

        def count_params(self) -> int:
            return 250_000

    rates = {"memory_bytes_per_s": 10e9, "flops_per_s": 100e9}
    one, eight = roofline(Model(), rates, 1), roofline(Model(), rates, 8)
    assert one["weight_bytes_per_step"] == 1_000_000 and one["flops_per_token"] == 500_000
    assert one["memory_bound_tokens_per_s"] == pytest.approx(10_000)  # one step, one token, 1 MB read
    assert eight["memory_bound_tokens_per_s"] == pytest.approx(80_000)  # the same read gives 8 tokens
    assert one["compute_bound_tokens_per_s"] == pytest.approx(200_000)
    assert eight["bound_tokens_per_s"] == pytest.approx(80_000)


def test_bench_on_the_imported_smollm2(smollm2_preset: Path) -> None:
    """The real-model benchmark path: SmolLM2 takes no start token, which keras-hub's generate()
    adds anyway, so its serial path runs generate's compiled function on the prompt's ids."""
    # Two prefill buckets and one window besides the context's: a 30-block model compiles each
    # in seconds; the engine's default set (every bucket and window of the context) is the
    # benchmark command's.
    result = run_bench(smollm2_preset, **SIZES, buckets=(32, 256), windows=(256,))
    check_result(result)
    assert result["family"] == "chatml" and result["outputs_consistent"]


def test_run_bench_small() -> None:
    result = run_bench(PRESET, **SIZES)
    check_result(result)
    assert result["family"] == "gemma"
    table = format_table(result)
    assert "serial generate()" in table and "engine x2" in table and "speedup_8: n/a" in table


def test_bench_engine_command_json() -> None:
    out = io.StringIO()
    call_command(
        "bench_engine", "--preset", str(PRESET), "--prompts", "2", "--max-new-tokens", "8",
        "--concurrency", "1,2", "--slots", "2", "--repeats", "2", "--timing-seconds", "0.01", "--json", stdout=out,
    )  # fmt: skip
    check_result(json.loads(out.getvalue()))


def test_prompts_are_calendar_requests_of_varied_length() -> None:
    prompts = bench_prompts("llama3", 8)
    assert len(set(prompts)) == 8 and len({len(p) for p in prompts}) > 2
    assert all(p.startswith("<|begin_of_text|>") and "calendar" in p for p in prompts)
    assert bench_prompts("llama3", 8) == prompts  # Deterministic.


def test_default_preset_is_the_strong_demo_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="No strong demo preset"):
        default_preset(tmp_path)
    for name, quality in (("a-weak", "weak"), ("b-strong", "strong")):
        shutil.copytree(PRESET, tmp_path / name)
        metadata = json.loads((tmp_path / name / "metadata.json").read_text())
        metadata["fix_arena"] = {"quality": quality}
        (tmp_path / name / "metadata.json").write_text(json.dumps(metadata))
    assert default_preset(tmp_path) == tmp_path / "b-strong"
    assert read_preset(PRESETS_DIR / "gemma-calendar").quality == "strong"
    assert default_preset() == PRESETS_DIR / "gemma-calendar"  # The bundled one.


def test_bench_engine_against_another_openai_compatible_server(tmp_path: Path) -> None:
    """The arena's host (a child process the command starts) against another server of the same
    weights: both servers' figures at each level, the ratio, and the same greedy text."""
    from inference.hosts.openai_server import host_process

    with host_process({"other": PRESET}, tmp_path / "other.log", slots=2, compile_all=False) as url:
        out = io.StringIO()
        call_command(
            "bench_engine", "--preset", str(PRESET), "--against", url, "--served-model", "other", "--json",
            "--prompts", "2", "--max-new-tokens", "8", "--concurrency", "1,2", "--slots", "2", "--repeats", "1",
            stdout=out,
        )  # fmt: skip
    result = json.loads(out.getvalue())
    assert result["other"] == {"url": url, "model": "other"} and result["same_text"] is True
    assert [level["concurrency"] for level in result["levels"]] == [1, 2]
    for level in result["levels"]:
        for server in ("arena", "other"):
            figures = level[server]
            assert figures["requests"] == 2 and figures["tokens"] == 2 * 8  # ignore_eos: exact lengths.
            assert figures["aggregate_tokens_per_s"] > 0 and 0 < figures["ttft_p50_s"] <= figures["ttft_p95_s"]
        assert level["ratio"] == pytest.approx(
            level["arena"]["aggregate_tokens_per_s"] / level["other"]["aggregate_tokens_per_s"]
        )


def test_bench_engine_against_needs_the_served_model() -> None:
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="--against needs --served-model"):
        call_command("bench_engine", "--preset", str(PRESET), "--against", "http://127.0.0.1:9/v1")


def test_bench_engine_reports_the_resident_memory_of_one_model(tmp_path: Path) -> None:
    """--memory, as docs/models.md runs it: one preset in a fresh process, loaded and warmed as
    the arena does with its slot and prefix pool settings."""
    environment = {
        **os.environ,
        "ARENA_ENGINE_SLOTS": "2",
        "ARENA_PREFIX_CACHE_ROWS": "3",
        "ARENA_PREFIX_CACHE_TOKENS": "256",
        "ARENA_ENGINE_COMPACT": "true",
        "ARENA_VAR_DIR": str(tmp_path),
    }
    command = [sys.executable, "manage.py", "bench_engine", "--memory", "--json", "--preset", str(PRESET)]
    done = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["preset"], result["slots"], result["prefix_cache_rows"], result["prefix_cache_tokens"]) == (
        "tiny-gemma",
        2,
        3,
        256,
    )
    assert result["compact"] is True
    assert result["compilations"] > 0 and result["loaded_mib"] > 0 and result["warm_up_mib"] > 0
    assert result["model_mib"] == pytest.approx(result["loaded_mib"] + result["warm_up_mib"])
    assert result["peak_mib"] >= result["process_mib"] + result["runtime_mib"] + result["model_mib"]
    # Then each window's decode step, timed (up to 1024 positions).
    assert result["step_ms"] and all(int(window) <= 1024 and ms > 0 for window, ms in result["step_ms"].items())


def test_bench_engine_reports_what_a_model_adds_beside_another_of_its_architecture(tmp_path: Path) -> None:
    """--memory --beside, as docs/models.md measures a fixer beside its base: the other preset
    is loaded and warmed first; a copy of it (the same architecture) then compiles nothing."""
    import shutil

    twin = tmp_path / "tiny-gemma-twin"
    shutil.copytree(PRESET, twin)
    environment = {**os.environ, "ARENA_VAR_DIR": str(tmp_path)}
    command = [sys.executable, "manage.py", "bench_engine", "--memory", "--json", "--preset", str(twin)]
    done = subprocess.run(
        [*command, "--beside", str(PRESET)], cwd=REPO, env=environment, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["preset"], result["beside"], result["compilations"]) == ("tiny-gemma-twin", "tiny-gemma", 0)


def test_bench_engine_beside_goes_with_memory() -> None:
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="--beside and --adapter go with --memory"):
        call_command("bench_engine", "--preset", str(PRESET), "--beside", str(PRESET))


def test_bench_engine_times_a_sampling_step_against_sorting_the_vocabulary() -> None:
    """`bench_engine --sampling`: one draw of every row's next token at the arena's default
    sampling settings, on the model's own logits, among the most likely tokens first and by
    sorting the whole vocabulary, and greedy; the tokens the draws choose among are counted
    from those logits."""
    out = io.StringIO()
    call_command(
        "bench_engine", "--preset", str(PRESET), "--sampling", "--slots", "3", "--timing-seconds", "0.01", "--json",
        stdout=out,
    )  # fmt: skip
    result = json.loads(out.getvalue())
    vocabulary = json.loads((PRESET / "config.json").read_text())["config"]["vocabulary_size"]
    assert result["rows"] == 3 and result["vocabulary"] == vocabulary
    assert (result["temperature"], result["top_k"], result["top_p"]) == (0.7, 0, 0.95)
    assert 1 <= result["kept_tokens_median"] <= result["kept_tokens_max"] <= result["vocabulary"]
    assert all(result[key] > 0 for key in ("candidates_ms", "sorted_ms", "greedy_ms"))
    assert result["sorted_over_candidates"] == pytest.approx(result["sorted_ms"] / result["candidates_ms"])
