"""The research API (/api/v1) and dumps: endpoints, pagination, filters, keys, throttling,
privacy, and the dump rated by rate_battles giving the site's leaderboard."""

import csv
import gzip
import hashlib
import io
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import RequestFactory
from django.utils import timezone

from arena_site.api_common import ADDRESS_THROTTLE, SlidingWindowThrottle
from inference.models import LLM
from leaderboard import services as leaderboard_services
from votes import services
from votes.models import Battle, FlaggedVoter, Message, ResearcherKey, Task, Vote

pytestmark = pytest.mark.django_db
NOW = timezone.now()


@pytest.fixture(autouse=True)
def _generous_throttle(settings) -> None:
    settings.ARENA_API_ANON_PER_MINUTE = 10_000
    settings.ARENA_API_KEY_PER_MINUTE = 10_000


def voter(name: str) -> str:
    """A voter key as the arena makes them (a keyed hash of the session)."""
    return hashlib.sha256(name.encode()).hexdigest()


@pytest.fixture
def arena(db) -> list[Battle]:
    """Ten ended battles between three models (one corrected and voted twice), plus one leaked,
    one unfinished and one by a flagged voter."""
    models = [
        LLM.objects.create(name=n, family="gemma", preset=f"/p/{n}", context_tokens=2048) for n in ("ant", "bee", "cat")
    ]
    task = Task.objects.create(slug="cal", title="Calendar", category="API calls", system_prompt="Be brief.")
    battles = []
    choices = ["a", "b", "a", "tie", "a", "both_bad", "a", "b", "a", "a"]
    for index, choice in enumerate(choices):
        a, b = models[index % 3], models[(index + 1) % 3]
        battle = Battle.objects.create(
            model_a=a,
            model_b=b,
            voter_key=voter(f"voter-{index % 4}"),
            task=task if index < 5 else None,
            state=Battle.State.ENDED,
            ended=NOW + timedelta(minutes=index),
        )
        for side in "ab":
            Message.objects.create(battle=battle, side=side, turn=0, role="user", content=f"prompt {index}")
            Message.objects.create(
                battle=battle,
                side=side,
                turn=0,
                role="assistant",
                content=f"reply {index}{side}",
                token_count=3,
                rating="mistake" if side == "a" else "correct",
                check_verdict="mistake",
            )
        Vote.objects.create(battle=battle, choice=choice, stage="first_try")
        battles.append(battle)
    # Battle 0: side A corrected, then an after-fix vote.
    Message.objects.create(battle=battles[0], side="a", turn=1, role="user", content="The year is 2024.")
    Message.objects.create(battle=battles[0], side="a", turn=1, role="assistant", content="fixed", rating="fixed")
    Vote.objects.create(battle=battles[0], choice="a", stage="after_fix", after_turn=1)
    leaked = Battle.objects.create(
        model_a=models[0],
        model_b=models[1],
        voter_key=voter("v"),
        state=Battle.State.ENDED,
        ended=NOW,
        excluded=True,
        excluded_reason="the reply of side A names 'Gemma'",
    )
    Vote.objects.create(battle=leaked, choice="a")
    unfinished = Battle.objects.create(model_a=models[0], model_b=models[2], voter_key=voter("u"))
    Vote.objects.create(battle=unfinished, choice="b")
    troll = Battle.objects.create(
        model_a=models[1], model_b=models[2], voter_key=voter("troll"), state=Battle.State.ENDED, ended=NOW
    )
    Vote.objects.create(battle=troll, choice="a")
    FlaggedVoter.objects.create(voter_key=voter("troll"), reason="spam")
    return battles


@pytest.fixture
def key_header(db) -> dict[str, str]:
    _, token = services.issue_researcher_key("lab")
    return {"HTTP_X_API_KEY": token}


def jsonl(response) -> list[dict]:
    return [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]


def test_leaderboard_models_tasks(client, arena) -> None:
    assert client.get("/api/v1/leaderboard").status_code == 404  # Not computed yet.
    refresh = leaderboard_services.refresh_leaderboard(rounds=50)
    board = client.get("/api/v1/leaderboard").json()
    assert board["refresh_id"] == refresh.pk and board["category"] == "overall"
    assert {row["model"] for row in board["rows"]} == {"ant", "bee", "cat"}
    # Each row's votes to swap with the next one down, as stored; none below the last.
    stored = refresh.snapshots.get(category="overall").rows
    assert [row["swap_votes"] for row in board["rows"]] == [row["swap_votes"] for row in stored]
    assert board["rows"][-1]["swap_votes"] is None
    assert board["excluded"] == {"identity leak": 1, "flagged voter": 1, "over daily cap": 0, "unfinished battle": 1}
    assert "fixing" in board["categories"] and "task:API calls" in board["categories"]
    assert client.get("/api/v1/leaderboard", {"category": "fixing"}).json()["votes"] == 1
    assert client.get("/api/v1/leaderboard", {"category": "nope"}).status_code == 404
    assert client.get("/api/v1/leaderboard", {"refresh": 99999}).status_code == 404
    assert client.get("/api/v1/leaderboard", {"refresh": "x"}).status_code == 422
    assert [m["name"] for m in client.get("/api/v1/models").json()] == ["ant", "bee", "cat"]
    (task,) = client.get("/api/v1/tasks").json()
    assert task["slug"] == "cal" and task["system_prompt"] == "Be brief." and task["turns"] == []


def test_votes_without_a_key_are_a_small_sample(client, arena, settings) -> None:
    settings.ARENA_API_SAMPLE_SIZE = 3
    records = jsonl(client.get("/api/v1/votes"))
    first_try = Vote.objects.filter(battle__in=arena, stage="first_try")
    newest = list(first_try.order_by("-pk").values_list("pk", flat=True)[:2])
    # The overall category (first-try votes) among the 3 newest counted votes of any category:
    # the newest is battle 0's after-fix vote, so two first-try votes.
    assert sorted(r["vote_id"] for r in records) == sorted(newest)
    assert client.get("/api/v1/votes", {"cursor": 1}).status_code == 401
    assert client.get("/api/v1/votes", {"include_excluded": True}).status_code == 401


def test_votes_paginate_by_cursor_without_gaps_or_repeats(client, arena, key_header) -> None:
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 3, "category": "overall", **({"cursor": cursor} if cursor else {})}
        response = client.get("/api/v1/votes", params, **key_header)
        assert response.status_code == 200
        seen += [r["vote_id"] for r in jsonl(response)]
        pages += 1
        cursor = response.headers.get("X-Next-Cursor")
        if cursor is None:
            break
    expected = list(
        Vote.objects.filter(battle__in=arena, stage="first_try").order_by("pk").values_list("pk", flat=True)
    )
    assert seen == expected and pages == 4  # 10 votes by 3: the last page has one.
    exact = client.get("/api/v1/votes", {"limit": 10, "category": "overall"}, **key_header)
    assert exact.headers.get("X-Next-Cursor") is None and len(jsonl(exact)) == 10


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 10**9},
        {"category": "everything"},
        {"category": "task:\x00calendar"},  # no NUL reaches PostgreSQL
        {"since": "yesterday"},
        {"since": "2026-01-01\x00"},
        {"format": "xml"},
        {"cursor": "x"},
    ],
)
def test_bad_vote_parameters_are_422(client, arena, key_header, params) -> None:
    response = client.get("/api/v1/votes", params, **key_header)
    assert response.status_code == 422 and response.json()["detail"]


def test_vote_filters_formats_and_exclusions(client, arena, key_header) -> None:
    records = jsonl(client.get("/api/v1/votes", {"category": "overall"}, **key_header))
    assert len(records) == 10
    first = next(r for r in records if r["battle_id"] == arena[0].public_id)
    assert first["stage"] == "first_try" and first["winner"] == "model_a"  # Overall: first-try votes.
    services.record_fix_episodes()  # As every leaderboard refresh does.
    corrected = jsonl(client.get("/api/v1/votes", {"category": "after_correction"}, **key_header))
    assert [(r["battle_id"], r["stage"]) for r in corrected] == [(arena[0].public_id, "after_fix")]
    fixed = corrected[0]
    assert fixed["corrections"] == [{"side": "a", "turn": 1, "text": "The year is 2024."}]
    assert [m["role"] for m in fixed["conversation_a"]] == ["user", "assistant", "user", "assistant"]
    assert fixed["conversation_a"][1] == {"role": "assistant", "content": "reply 0a", "num_tokens": 3}
    assert fixed["ratings_a"][1]["rating"] == "fixed" and fixed["task"] == "cal"
    assert {"question_id", "judge", "anony", "language", "tstamp", "turn"} <= set(first)
    window = {"since": (NOW + timedelta(minutes=2)).isoformat(), "until": (NOW + timedelta(minutes=5)).isoformat()}
    assert len(jsonl(client.get("/api/v1/votes", window, **key_header))) == 3
    assert len(jsonl(client.get("/api/v1/votes", {"category": "task:API calls"}, **key_header))) == 5
    everything = jsonl(client.get("/api/v1/votes", {"category": "overall", "include_excluded": True}, **key_header))
    reasons = sorted(r["excluded_reason"] or "" for r in everything if r["excluded"])
    # The battle still in progress is not there at all: its names would reach its voter's side.
    assert reasons == ["flagged voter: spam", "identity leak: the reply of side A names 'Gemma'"]
    rows = list(
        csv.DictReader(
            io.StringIO(
                b"".join(client.get("/api/v1/votes", {"format": "csv"}, **key_header).streaming_content).decode()
            )
        )
    )
    assert len(rows) == 10 and json.loads(rows[0]["conversation_a"])[0]["role"] == "user"


def test_keys_revocation_and_throttling(client, arena, settings) -> None:
    key, token = services.issue_researcher_key("lab")
    assert client.get("/api/v1/battles", HTTP_X_API_KEY="nope").status_code == 401
    assert client.get("/api/v1/battles").status_code == 401
    assert client.get("/api/v1/battles", HTTP_X_API_KEY=token).status_code == 200
    assert ResearcherKey.objects.get(pk=key.pk).last_used is not None
    assert ResearcherKey.objects.get(pk=key.pk).key_hash == hashlib.sha256(token.encode()).hexdigest()
    settings.ARENA_API_KEY_PER_MINUTE = 2
    assert client.get("/api/v1/models", HTTP_X_API_KEY=token).status_code == 200
    throttled = client.get("/api/v1/models", HTTP_X_API_KEY=token)
    assert throttled.status_code == 429 and "a minute" in throttled.json()["detail"]
    settings.ARENA_API_ANON_PER_MINUTE = 1
    assert client.get("/api/v1/models", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/api/v1/models", REMOTE_ADDR="10.1.2.3").status_code == 429
    # The budget is the network's (its /24), not the address's.
    assert client.get("/api/v1/models", REMOTE_ADDR="10.1.2.4").status_code == 429
    ResearcherKey.objects.filter(pk=key.pk).update(revoked=True)
    # From a network with budget left: a revoked key spends the network's anonymous budget too.
    assert client.get("/api/v1/models", HTTP_X_API_KEY=token, REMOTE_ADDR="10.1.3.4").status_code == 403


def test_battles_and_privacy(client, arena, key_header) -> None:
    page = client.get("/api/v1/battles", {"limit": 4}, **key_header).json()
    assert len(page["battles"]) == 4 and page["next_cursor"] == page["battles"][-1]["battle_id"]
    rest = client.get("/api/v1/battles", {"cursor": page["next_cursor"], "limit": 100}, **key_header).json()
    ids = [b["battle_id"] for b in page["battles"] + rest["battles"]]
    assert len(ids) == len(set(ids)) == 12 and rest["next_cursor"] is None  # Ended battles only.
    one = client.get(f"/api/v1/battles/{arena[0].public_id}", **key_header).json()
    assert one["votes"][1] == {"stage": "after_fix", "choice": "a", "after_turn": 1}
    assert one["turns"][0]["replies"]["a"]["check"]["verdict"] == "mistake"
    assert client.get("/api/v1/battles/nope", **key_header).status_code == 404
    assert client.get("/api/v1/battles", {"cursor": "nope"}, **key_header).status_code == 404
    assert client.get("/api/v1/battles", {"cursor": "no pe"}, **key_header).status_code == 422
    # No session key or voter key anywhere; the judge is stable and keyed.
    texts = [
        json.dumps(page),
        json.dumps(rest),
        b"".join(client.get("/api/v1/votes", **key_header).streaming_content).decode(),
    ]
    for battle in Battle.objects.all():
        assert all(battle.voter_key not in text for text in texts)
    judges = {b["battle_id"]: b["judge"] for b in page["battles"] + rest["battles"]}
    assert judges[arena[0].public_id] == judges[arena[4].public_id]  # Same voter, same judge.
    assert judges[arena[0].public_id] != judges[arena[1].public_id]


def test_evaluations_endpoints(client, arena) -> None:
    assert client.get("/api/v1/evaluations").json() == []
    assert client.get("/api/v1/evaluations/1").status_code == 404


def test_openapi_documents_every_error(client) -> None:
    schema = client.get("/api/v1/openapi.json").json()
    votes = schema["paths"]["/api/v1/votes"]["get"]["responses"]
    assert {"200", "401", "403", "422", "429"} <= set(votes)
    assert "application/x-ndjson" in votes["200"]["content"]
    assert client.get("/api/v1/docs").status_code == 200


def test_export_dump_and_serving_it(client, arena, key_header, tmp_path: Path, settings) -> None:
    settings.ARENA_DUMP_DIR = tmp_path
    err = StringIO()
    call_command("export_dump", f"--out={tmp_path}", stdout=StringIO(), stderr=err)
    (folder,) = tmp_path.iterdir()
    card = json.loads((folder / "dataset_card.json").read_text())
    # Every vote of the ended battles; the battle still in progress is left out.
    assert card["records"] == 13 and card["counts"]["by_stage"] == {"first_try": 12, "after_fix": 1}
    assert card["counts"]["excluded"] == {"identity leak": 1, "flagged voter": 1}
    for name, info in card["files"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == info["sha256"]
    lines = gzip.decompress((folder / "votes.jsonl.gz").read_bytes()).decode().splitlines()
    assert len(lines) == 13 and "licence" in card and (folder / "README.md").exists()
    listed = client.get("/api/v1/dumps").json()
    assert {f"{folder.name}/votes.jsonl.gz", f"{folder.name}/dataset_card.json"} <= {f["name"] for f in listed}
    served = client.get(f"/api/v1/dumps/{folder.name}/votes.jsonl.gz", **key_header)
    assert served.status_code == 200 and b"".join(served.streaming_content) == (folder / "votes.jsonl.gz").read_bytes()
    assert client.get(f"/api/v1/dumps/{folder.name}/votes.jsonl.gz").status_code == 401
    assert client.get("/api/v1/dumps/..%2F..%2Fetc/passwd", **key_header).status_code == 404


def test_dump_names_that_are_not_dump_files_get_a_json_404_and_links_are_never_listed(
    client, key_header, tmp_path: Path, settings
) -> None:
    settings.ARENA_DUMP_DIR = tmp_path / "dumps"
    day = settings.ARENA_DUMP_DIR / "2026-12-04"
    day.mkdir(parents=True)
    (day / "votes.jsonl.gz").write_bytes(b"dump")
    secret = tmp_path / "secret.txt"
    secret.write_text("not a dump")
    (day / "linked.txt").symlink_to(secret)  # A link to a file outside the dump folder,
    (settings.ARENA_DUMP_DIR / "2026-12-05").symlink_to(tmp_path)  # and a linked day folder.
    listed = {f["name"] for f in client.get("/api/v1/dumps", **key_header).json()}
    assert listed == {"2026-12-04/votes.jsonl.gz"}
    assert client.get("/api/v1/dumps/2026-12-04/votes.jsonl.gz", **key_header).status_code == 200
    for path in ("2026-12-04/%00", "2026-12-04/a%00b", "%00/votes.jsonl.gz", "2026-12-04/linked.txt",
                 "2026-12-05/secret.txt", "2026-12-04/..", "..%2F..%2Fetc/passwd", "2026-12-04/.hidden"):  # fmt: skip
        response = client.get(f"/api/v1/dumps/{path}", **key_header)
        # JSON either way: the route's "No such dump file." or, where a slash leaves no route, the API's
        # "Not found.".
        assert response.status_code == 404 and response.json()["detail"] in {"No such dump file.", "Not found."}, path


def test_a_path_the_api_does_not_have_gets_json_and_pages_keep_their_404_page(client) -> None:
    for path in ("/api/v1/nothing-here", "/api/v2/models", "/api/v1/dumps/a/b/c"):
        response = client.get(path)
        assert response.status_code == 404 and response["Content-Type"] == "application/json", path
        assert response.json() == {"detail": "Not found."}
    page = client.get("/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")


def test_votes_of_a_battle_in_progress_reach_no_one(client, arena, key_header, tmp_path: Path) -> None:
    live = Battle.objects.exclude(state=Battle.State.ENDED).get()
    responses = [
        client.get("/api/v1/votes", {"include_excluded": True}, **key_header),
        client.get("/api/v1/votes", {"include_excluded": True, "format": "csv"}, **key_header),
        client.get("/api/v1/votes", {"include_excluded": True, "category": "after_correction"}, **key_header),
        client.get("/api/v1/votes"),
    ]
    for response in responses:
        assert response.status_code == 200
        assert live.public_id not in b"".join(response.streaming_content).decode()
    assert client.get(f"/api/v1/battles/{live.public_id}", **key_header).status_code == 404
    call_command("export_dump", f"--out={tmp_path}", stdout=StringIO(), stderr=StringIO())
    (folder,) = tmp_path.iterdir()
    for name in ("votes.jsonl.gz", "votes.csv.gz", "episodes.jsonl.gz"):
        assert live.public_id not in gzip.decompress((folder / name).read_bytes()).decode(), name


def test_the_anonymous_sample_is_a_true_cap(client, arena, settings) -> None:
    """Walking time windows and categories one after another reaches no vote beyond the newest
    ARENA_API_SAMPLE_SIZE counted ones (the probe got every counted vote in three requests)."""
    settings.ARENA_API_SAMPLE_SIZE = 3
    newest = {(arena[0].public_id, "after_fix"), (arena[9].public_id, "first_try"), (arena[8].public_id, "first_try")}
    seen = set()
    for category in ("overall", "after_correction", "task:API calls"):
        for minutes in range(-1, 12):
            for bound in ("until", "since"):
                window = {"category": category, bound: (NOW + timedelta(minutes=minutes)).isoformat()}
                seen |= {(r["battle_id"], r["stage"]) for r in jsonl(client.get("/api/v1/votes", window))}
    assert seen <= newest and len(seen) >= 2  # Never beyond the pool, whatever the filters.


def test_unknown_and_revoked_keys_spend_the_address_budget(client, settings) -> None:
    settings.ARENA_API_ANON_PER_MINUTE = 2
    key, token = services.issue_researcher_key("lab")
    ResearcherKey.objects.filter(pk=key.pk).update(revoked=True)
    address = "198.19.7.7"
    assert client.get("/api/v1/models", HTTP_X_API_KEY="guess-1", REMOTE_ADDR=address).status_code == 401
    assert client.get("/api/v1/models", HTTP_X_API_KEY=token, REMOTE_ADDR=address).status_code == 403
    for guess in (token, "guess-2", None):  # Then the address is over its budget, whatever it sends.
        headers = {"HTTP_X_API_KEY": guess} if guess else {}
        assert client.get("/api/v1/models", REMOTE_ADDR=address, **headers).status_code == 429


def test_the_throttle_window_slides_and_a_429_says_when_to_retry(client, settings, monkeypatch) -> None:
    """A full budget just before a minute ends and more just after do not pass twice the budget:
    what was sent before the boundary still counts after it. The 429 says when to come back."""
    settings.ARENA_API_ANON_PER_MINUTE = 3
    boundary = 60 * 30_000_000.0
    now = [boundary - 1]
    monkeypatch.setattr(SlidingWindowThrottle, "timer", staticmethod(lambda: now[0]))
    address = "198.19.8.8"
    for _ in range(3):
        assert client.get("/api/v1/models", REMOTE_ADDR=address).status_code == 200
    now[0] = boundary + 1
    refused = client.get("/api/v1/models", REMOTE_ADDR=address)
    assert refused.status_code == 429 and 1 <= int(refused["Retry-After"]) <= 60
    assert refused.json()["detail"] == f"Too many requests: at most 3 a minute; retry in {refused['Retry-After']} s."
    now[0] = boundary + 61  # The burst has slid out of the last minute.
    assert client.get("/api/v1/models", REMOTE_ADDR=address).status_code == 200


def test_requests_arriving_together_are_each_counted(settings, monkeypatch) -> None:
    """An atomic count in the cache: requests at the same moment (several web processes) cannot
    all read the same count and pass. (ninja's own throttle, which reads a list of times and writes
    it back, let 80 of these 80 requests through against a budget of 20.)"""
    settings.ARENA_API_ANON_PER_MINUTE = 20
    monkeypatch.setattr(SlidingWindowThrottle, "timer", staticmethod(lambda: 60 * 30_000_010.0 + 5))
    request = RequestFactory().get("/api/v1/models", REMOTE_ADDR="198.19.9.9")
    start = threading.Barrier(16)

    def burst(_: int) -> int:
        start.wait()
        return sum(ADDRESS_THROTTLE.allow_request(request) for _ in range(5))

    with ThreadPoolExecutor(16) as pool:
        assert sum(pool.map(burst, range(16))) == 20


def test_the_vote_dump_rated_by_rate_battles_is_the_sites_leaderboard(client, arena, key_header, tmp_path) -> None:
    site = leaderboard_services.refresh_leaderboard(rounds=200, seed=0).snapshots.get(category="overall")
    dump = tmp_path / "votes.jsonl"
    dump.write_bytes(b"".join(client.get("/api/v1/votes", {"category": "overall"}, **key_header).streaming_content))
    out = StringIO()
    call_command("rate_battles", str(dump), "--json", "--rounds=200", "--seed=0", stdout=out)
    rated = json.loads(out.getvalue())
    fields = ("model", "rating", "lower", "upper", "rank", "votes", "elo", "swap_votes")
    assert [{f: row[f] for f in fields} for row in rated] == [{f: row[f] for f in fields} for row in site.rows]


def test_admin_issues_a_key_shown_once_and_beat_dumps_nightly(client, settings) -> None:
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("admin", "a@example.org", "pw"))
    response = client.post("/admin/votes/researcherkey/add/", {"name": "Lab X"})
    # The token is on the response page itself, never stored in a cookie (messages) or cached.
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    token = response.context["token"]
    assert f'value="{token}"' in response.content.decode()
    assert all(token not in morsel.value for morsel in response.cookies.values())
    assert all(token not in morsel.value for morsel in client.cookies.values())
    key = ResearcherKey.objects.get(name="Lab X")
    assert token not in client.get("/admin/votes/researcherkey/").content.decode()
    assert key.key_hash == hashlib.sha256(token.encode()).hexdigest() and token.startswith(key.prefix)
    assert token not in client.get(f"/admin/votes/researcherkey/{key.pk}/change/").content.decode()
    assert client.get("/api/v1/battles", HTTP_X_API_KEY=token).status_code == 200
    nightly = settings.CELERY_BEAT_SCHEDULE["nightly-dump"]
    assert nightly["task"] == "votes.export_dump" and nightly["schedule"].hour == {3}


def test_fix_episodes_are_exported_and_rate_fixes_reads_them(client, arena, key_header, tmp_path) -> None:
    services.record_fix_episodes()  # As every leaderboard refresh does.
    assert client.get("/api/v1/episodes").status_code == 401
    page = client.get("/api/v1/episodes", **key_header).json()
    assert page["next_cursor"] is None
    (episode,) = page["episodes"]
    assert episode["battle"] == arena[0].public_id and episode["model"] == "ant" and episode["fixed"] is True
    assert (episode["source"], episode["feedback_kind"], episode["correction"]) == (
        "voter",
        "prescriptive",
        "The year is 2024.",
    )
    assert client.get("/api/v1/episodes", {"limit": 0}, **key_header).status_code == 422
    path = tmp_path / "episodes.json"
    path.write_text(json.dumps(page["episodes"]))
    out = StringIO()
    call_command("rate_fixes", str(path), "--json", stdout=out)
    assert [(row["model"], row["episodes"], row["fix_rate"]) for row in json.loads(out.getvalue())] == [("ant", 1, 1.0)]
