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
