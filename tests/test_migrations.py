"""Every model change has its migration."""

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_missing_migrations() -> None:
    call_command("makemigrations", check=True, dry_run=True, verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_replies_checked_before_facts_get_them() -> None:
    """votes 0019 judges the replies checked before the checker named facts again, facts
    included, and makes the leaderboard count (and record episodes) again."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    tally = ("leaderboard", "0007_vote_tally_state")
    before, after = [("votes", "0018_battle_tallied"), tally], [("votes", "0019_fix_episode_facts"), tally]
    executor.migrate(before)
    try:
        apps = executor.loader.project_state(before).apps
        model = apps.get_model("inference", "LLM").objects.create(name="m", family="gemma", preset="/p/m")
        other = apps.get_model("inference", "LLM").objects.create(name="n", family="gemma", preset="/p/n")
        task = apps.get_model("votes", "Task").objects.create(slug="cal", title="Calendar")
        apps.get_model("votes", "TaskTurn").objects.create(
            task=task,
            position=0,
            prompt="Add a meeting with Fred on Nov 11 at 5PM",
            expected_output='add(title="Fred", date="2024-11-11")',
            checker="python_call",
            checker_options={"signature": ["add(title, date)"]},
        )
        battle = apps.get_model("votes", "Battle").objects.create(
            model_a=model, model_b=other, task=task, voter_key="v", public_id="b1"
        )
        reply = apps.get_model("votes", "Message").objects.create(
            battle=battle,
            side="a",
            turn=0,
            role="assistant",
            script_turn=0,
            content='add(title="Fred", date="2023-11-11")',
            check_verdict="mistake",
            check_parts={"function": True, "title": True, "date": False, "calls": True, "text around": True},
        )
        apps.get_model("leaderboard", "VoteTallyState").objects.create(stale=False, data=b"")
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        apps = executor.loader.project_state(after).apps
        parts = apps.get_model("votes", "Message").objects.get(pk=reply.pk).check_parts
        assert parts["date year = 2024"] is False and parts["title = Fred"] is True and parts["date"] is False
        assert apps.get_model("leaderboard", "VoteTallyState").objects.get().stale
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_battles_get_their_snapshot_and_episodes_their_definition(capsys: pytest.CaptureFixture[str]) -> None:
    """votes 0025 gives each task battle the task it was played on as its snapshot, recomputes
    the stored episodes with the correction definition (a prompt to both sides is none), says
    how many it removed and added, and makes the leaderboard count again."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    tally = ("leaderboard", "0007_vote_tally_state")
    before = [("votes", "0024_vote_over_daily_cap"), tally]
    after = [("votes", "0025_battle_snapshot_and_real_corrections"), tally]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        apps = executor.loader.project_state(before).apps
        LLM = apps.get_model("inference", "LLM")
        model, other = (LLM.objects.create(name=name, family="gemma", preset=f"/p/{name}") for name in "mn")
        task = apps.get_model("votes", "Task").objects.create(slug="cal", title="Calendar", system_prompt="Be brief.")
        for position, (prompt, corrects) in enumerate([("Add Fred", False), ("The current year is 2024.", True)]):
            apps.get_model("votes", "TaskTurn").objects.create(
                task=task, position=position, prompt=prompt, checker="none", corrects_previous=corrects
            )
        Battle, Message = apps.get_model("votes", "Battle"), apps.get_model("votes", "Message")
        FixEpisode = apps.get_model("votes", "FixEpisode")
        on_task = Battle.objects.create(
            model_a=model, model_b=other, task=task, voter_key="v", public_id="t", state="ended"
        )
        free = Battle.objects.create(model_a=model, model_b=other, voter_key="v", public_id="f", state="ended")
        # Free chat: 🍄 on A, a new question to both sides (stored as a "correction" before),
        # then a correction to A alone.
        for turn, sides, prompt, rating in [
            (0, "ab", "Add Fred", "mistake"),
            (1, "ab", "Explain photosynthesis.", "mistake"),
            (2, "a", "That's wrong, try again.", "fixed"),
        ]:
            for side in sides:
                Message.objects.create(battle=free, side=side, turn=turn, role="user", content=prompt)
                Message.objects.create(
                    battle=free, side=side, turn=turn, role="assistant", rating=rating if side == "a" else ""
                )
        old = {"model": model, "source": "voter", "specificity": "generic", "side": "a"}
        FixEpisode.objects.create(
            battle=free, wrong_turn=0, attempt=1, correction="Explain photosynthesis.", fixed=False, **old
        )
        FixEpisode.objects.create(
            battle=free, wrong_turn=1, attempt=2, correction="That's wrong, try again.", fixed=True, **old
        )
        apps.get_model("leaderboard", "VoteTallyState").objects.create(stale=False, data=b"")
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        apps = executor.loader.project_state(after).apps
        battle = apps.get_model("votes", "Battle").objects.get(pk=on_task.pk)
        assert battle.system_prompt == "Be brief."
        assert [(turn["prompt"], turn["corrects_previous"]) for turn in battle.script] == [
            ("Add Fred", False),
            ("The current year is 2024.", True),
        ]
        episodes = apps.get_model("votes", "FixEpisode").objects.values_list("wrong_turn", "attempt", "correction")
        assert list(episodes) == [(1, 1, "That's wrong, try again.")]
        assert "2 removed, 1 added, 0 kept" in capsys.readouterr().out
        assert apps.get_model("leaderboard", "VoteTallyState").objects.get().stale
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
