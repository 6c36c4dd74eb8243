"""How long a voter waits for text: a real browser plays battles on a running arena.

Chromium (Playwright) opens the arena as a new voter would, one fresh browser context (a new
session) per battle, types a prompt and presses Send; the page itself records, on its own clock
(``performance.now()``), when Send was pressed and when each side's reply first showed text.
Battles are played one after another, each to the end of both replies, so each is measured on
an otherwise idle arena. It waits first until every model anonymous battles draw is ready
(``/roster/``): the figure is the warm arena's.

Each battle's slower model's own time for its reply (``Message.generation_ms``) is read from the
arena's database where the benchmark shares it (the embedded arena's, on the same machine): the
ratio of the battle's wall time to it is what the arena's pacing adds to the models' own work.
So is what the slowest model anonymous battles may draw would need for the battle's longer reply
(its median time to first token and speed on its recent replies): an anonymous battle is paced
for that model whichever pair it drew, and the ratio to it is what the pacing adds beyond that.

Used by ``manage.py bench_first_text`` (docs/operations.md states its figures).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import httpx

PROMPT = "Add a meeting with Fred on Nov 11 at 5PM"

# Installed before Send: the time Send was pressed, and the first text of each side's reply.
WATCH = """() => {
  window.benchSentAt = null;
  window.benchFirstText = {a: null, b: null};
  document.getElementById('prompt-form').addEventListener('submit', () => {
    if (window.benchSentAt === null) { window.benchSentAt = performance.now(); }
  }, {capture: true});
  new MutationObserver(() => {
    for (const side of ['a', 'b']) {
      const text = document.querySelector('#log-' + side + ' .msg.assistant .text');
      if (window.benchFirstText[side] === null && text && text.textContent.trim().length > 0) {
        window.benchFirstText[side] = performance.now();
      }
    }
  }).observe(document.getElementById('arena'), {subtree: true, childList: true, characterData: true});
}"""


BOTH_SHOWN = "() => window.benchFirstText.a !== null && window.benchFirstText.b !== null"
BOTH_FINISHED = (
    "() => document.querySelectorAll('.log .msg.assistant:is(.is-done, .is-stopped, .is-failed)').length === 2"
)
FAILED = "() => document.querySelectorAll('.log .msg.assistant.is-failed').length"
TIMES = "() => ({sent: window.benchSentAt, ...window.benchFirstText, now: performance.now()})"


# What the report summarises: seconds, then ratios of the wall time.
FIELDS = ("first_side_s", "both_sides_s", "finished_s", "over_slower_model", "over_slowest_model")


@dataclass(frozen=True)
class Battle:
    first_side_s: float  # From Send to the first text on either side.
    both_sides_s: float  # From Send to text on both sides.
    finished_s: float  # From Send to both replies finished.
    battle_id: str = ""
    # The slower side's model's own time for its reply (from its request to its last token,
    # before pacing), read from the arena's database where this process shares it; else None.
    slower_model_s: float | None = None
    # What the slowest model anonymous battles may draw needs for the longer reply (typically).
    slowest_model_s: float | None = None

    @property
    def over_slower_model(self) -> float | None:
        """Both finished, over the slower model's own time: what the arena adds to the models'."""
        return None if not self.slower_model_s else self.finished_s / self.slower_model_s

    @property
    def over_slowest_model(self) -> float | None:
        """Both finished, over what the slowest drawable model needs for the longer reply."""
        return None if not self.slowest_model_s else self.finished_s / self.slowest_model_s


@dataclass(frozen=True)
class Report:
    url: str
    battles: list[Battle]

    def summary(self) -> dict[str, dict[str, float]]:
        result = {}
        for field in FIELDS:
            values = sorted(value for battle in self.battles if (value := getattr(battle, field)) is not None)
            if not values:
                continue
            result[field] = {
                "median": statistics.median(values),
                "p90": values[min(len(values) - 1, int(0.9 * len(values)))],
                "max": values[-1],
            }
        return result

    def as_dict(self) -> dict[str, Any]:
        battles = [
            {**asdict(b), "over_slower_model": b.over_slower_model, "over_slowest_model": b.over_slowest_model}
            for b in self.battles
        ]
        return {"url": self.url, "battles": battles, "summary": self.summary()}

    def with_model_times(
        self,
        slower_model_s: Callable[[str], float | None],
        slowest_model_s: Callable[[str], float | None] = lambda battle_id: None,
    ) -> Report:
        """The report with each battle's slower model's own time and what the slowest drawable
        model needs for its longer reply (``slower_model_s`` and ``slowest_model_s`` of its id)."""
        return Report(
            self.url,
            [
                replace(b, slower_model_s=slower_model_s(b.battle_id), slowest_model_s=slowest_model_s(b.battle_id))
                for b in self.battles
            ],
        )


class NotReady(RuntimeError):
    pass


class BattleFailed(RuntimeError):
    pass


def wait_until_warm(url: str, timeout_s: float) -> dict[str, Any]:
    """Until every model anonymous battles draw is ready (the arena's own ``/roster/``). An arena
    that does not answer yet is starting (``scripts/serve &`` just before): waited for too."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            roster = httpx.get(url.rstrip("/") + "/roster/", timeout=10).json()
        except httpx.TransportError as error:
            state = f"{url} does not answer ({error})"
        else:
            if roster["total"] >= 2 and roster["ready"] == roster["total"]:
                return roster
            state = f"{roster['ready']} of {roster['total']} models ready"
        if time.monotonic() > deadline:
            raise NotReady(f"Not warm after {timeout_s:.0f} s: {state}.")
        time.sleep(1)


def play(browser: Any, url: str, prompt: str = PROMPT, timeout_s: float = 600) -> Battle:
    """One battle in a fresh context: Send, then wait for both replies to finish."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(url.rstrip("/") + "/")
        page.wait_for_function("() => !document.getElementById('send').disabled", timeout=60_000)
        page.evaluate(WATCH)
        page.fill("#prompt", prompt)
        page.click("#send")
        timeout_ms = timeout_s * 1000
        page.wait_for_function(BOTH_SHOWN, timeout=timeout_ms)
        page.wait_for_function(BOTH_FINISHED, timeout=timeout_ms)
        times = page.evaluate(TIMES)
        battle_id = page.url.rstrip("/").rsplit("/", 1)[-1]  # The page moves to /battle/<id>/.
        if page.evaluate(FAILED):
            raise BattleFailed(
                "A reply failed: " + page.locator(".log .msg.assistant.is-failed .stats").first.inner_text()
            )
    finally:
        context.close()
    first = min(times["a"], times["b"]) - times["sent"]
    both = max(times["a"], times["b"]) - times["sent"]
    return Battle(first / 1000, both / 1000, (times["now"] - times["sent"]) / 1000, battle_id)


def measure(url: str, battles: int, *, browser: Any, prompt: str = PROMPT, ready_timeout_s: float = 900) -> Report:
    wait_until_warm(url, ready_timeout_s)
    return Report(url, [play(browser, url, prompt) for _ in range(battles)])
