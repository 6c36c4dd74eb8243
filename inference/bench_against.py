"""Benchmark: the arena's own host against another OpenAI-compatible server, over the same
protocol (``manage.py bench_engine --against URL``). Plain module: no Django, no JAX.

Both servers get the same prompts (calendar requests rendered with the model family's chat
template, ``inference.bench.bench_prompts``) as plain completions (``POST /v1/completions``),
streamed, greedy, with ``ignore_eos`` so that every reply is exactly ``max_new_tokens`` long on
both: token counts come from each server's usage chunk, and the two servers do the same work.
For each concurrency level N, N client threads each keep one request in flight until every prompt
is done. Time to first token is from sending the request to the first text; a request's latency
is to its last event; aggregate tokens/s is every token of the level over its wall time. Rounds
run the servers in turn, ``repeats`` times, and each server's figures pool its rounds, so that a
passing slowdown of the machine weighs on both alike. ``ratio`` is the arena's aggregate tokens/s
over the other's at each level; ``same_text`` says whether the two wrote the same text for every
prompt (with the same weights, greedy: a correctness check of both).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import connect_sse

ARENA = "arena"
OTHER = "other"


@dataclass(frozen=True)
class Server:
    base_url: str  # The API root, e.g. "http://127.0.0.1:8000/v1".
    model: str
    api_key: str | None = None


@dataclass
class Sample:
    prompt: int
    ttft_s: float
    latency_s: float
    tokens: int
    text: str


def stream_completion(
    client: httpx.Client, server: Server, prompt: str, max_new_tokens: int
) -> tuple[float, float, int, str]:
    """One streamed completion: (time to first text, latency, tokens, text)."""
    body = {
        "model": server.model,
        "prompt": prompt,
        "max_tokens": max_new_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    text = ""
    with connect_sse(
        client, "POST", server.base_url.rstrip("/") + "/completions", json=body, headers=headers
    ) as events:
        if events.response.status_code != 200:
            events.response.read()
            raise RuntimeError(
                f"{server.base_url} answered HTTP {events.response.status_code}: {events.response.text[:300]}"
            )
        for event in events.iter_sse():
            if event.data.strip() == "[DONE]":
                break
            chunk = json.loads(event.data)
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    first = first if first is not None else time.perf_counter() - started
                    text += choice["text"]
            usage = chunk.get("usage")
            if usage:
                tokens = int(usage["completion_tokens"])
    if first is None or not tokens:
        raise RuntimeError(f"{server.base_url} gave no text or no usage for a prompt.")
    return first, time.perf_counter() - started, tokens, text


def run_level(
    server: Server, prompts: Sequence[str], concurrency: int, max_new_tokens: int
) -> tuple[list[Sample], float]:
    """Every prompt once, ``concurrency`` in flight: the samples and the wall time."""
    order = iter(range(len(prompts)))
    lock = threading.Lock()
    samples: list[Sample] = []
    errors: list[BaseException] = []

    def client_thread() -> None:
        with httpx.Client(timeout=httpx.Timeout(600, connect=10)) as client:
            while True:
                with lock:
                    index = next(order, None)
                if index is None or errors:
                    return
                try:
                    ttft, latency, tokens, text = stream_completion(client, server, prompts[index], max_new_tokens)
                except BaseException as error:  # Reported after the level.
                    errors.append(error)
                    return
                with lock:
                    samples.append(Sample(index, ttft, latency, tokens, text))

    threads = [threading.Thread(target=client_thread) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return samples, time.perf_counter() - started


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _summary(samples: list[Sample], wall_s: float) -> dict[str, float]:
    ttfts = [sample.ttft_s for sample in samples]
    latencies = [sample.latency_s for sample in samples]
    tokens = sum(sample.tokens for sample in samples)
    return {
        "requests": len(samples),
        "tokens": tokens,
        "aggregate_tokens_per_s": tokens / wall_s,
        "ttft_p50_s": _percentile(ttfts, 50),
        "ttft_p95_s": _percentile(ttfts, 95),
        "latency_p50_s": _percentile(latencies, 50),
        "latency_p95_s": _percentile(latencies, 95),
    }


def run_against(
    arena: Server,
    other: Server,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 128,
    concurrency: Sequence[int] = (1, 8),
    repeats: int = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    if not prompts or repeats < 1 or not concurrency or min(concurrency) < 1 or max_new_tokens < 1:
        raise ValueError("The benchmark needs prompts, at least one round, positive levels and tokens.")
    servers = {ARENA: arena, OTHER: other}
    for name, server in servers.items():  # Warm both (their first shapes, their caches) untimed.
        run_level(server, prompts[: max(concurrency)], max(concurrency), max_new_tokens)
        if progress:
            progress(f"warmed {name} ({server.base_url})")
    pooled: dict[tuple[str, int], tuple[list[Sample], float]] = {}
    for round_index, level, name in itertools.product(range(repeats), concurrency, servers):
        samples, wall = run_level(servers[name], prompts, level, max_new_tokens)
        earlier, earlier_wall = pooled.get((name, level), ([], 0.0))
        pooled[(name, level)] = (earlier + samples, earlier_wall + wall)
        if progress:
            rate = sum(sample.tokens for sample in samples) / wall
            progress(f"round {round_index + 1}/{repeats}, {level} at once, {name}: {rate:.1f} tokens/s")
    levels = []
    for level in concurrency:
        figures = {name: _summary(*pooled[(name, level)]) for name in servers}
        ratio = figures[ARENA]["aggregate_tokens_per_s"] / figures[OTHER]["aggregate_tokens_per_s"]
        levels.append({"concurrency": level, ARENA: figures[ARENA], OTHER: figures[OTHER], "ratio": ratio})
    texts = {name: {s.prompt: s.text for s in pooled[(name, concurrency[0])][0]} for name in servers}
    return {
        "arena": {"url": arena.base_url, "model": arena.model},
        "other": {"url": other.base_url, "model": other.model},
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "levels": levels,
        "same_text": texts[ARENA] == texts[OTHER],
    }


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"arena: {result['arena']['url']} ({result['arena']['model']})",
        f"other: {result['other']['url']} ({result['other']['model']})",
        f"{result['prompts']} prompts x {result['repeats']} rounds, {result['max_new_tokens']} new tokens each, greedy",
        f"{'at once':>7}  {'server':<6} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p95':>9} {'latency p95':>12}",
    ]
    for level in result["levels"]:
        for name in (ARENA, OTHER):
            figures = level[name]
            lines.append(
                f"{level['concurrency']:>7}  {name:<6} {figures['aggregate_tokens_per_s']:>9.1f} "
                f"{figures['ttft_p50_s']:>8.3f}s {figures['ttft_p95_s']:>8.3f}s {figures['latency_p95_s']:>11.3f}s"
            )
        lines.append(f"{'':>7}  arena / other: {level['ratio']:.2f}x")
    lines.append(f"same text on every prompt: {'yes' if result['same_text'] else 'no'}")
    return "\n".join(lines)
