"""The dynamic benchmark: an admin promotes a battle's corrected turn into a curated task whose
context is the real mistake, and battles and evaluation runs on it start from that mistake."""

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from inference.models import LLM
from votes import selectors, services
from votes.models import Battle, EvaluationRun, FixEpisode, Message, Task

pytestmark = pytest.mark.django_db

WRONG = 'action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="5PM", duration=30)'
RIGHT = 'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)'


@pytest.fixture
def admin_client(client):
    client.force_login(User.objects.create_superuser("admin", "admin@example.org", "pw"))
    return client


@pytest.fixture
def episode() -> FixEpisode:
    """A calendar battle whose side A got the time wrong, was corrected by the script's "The
    current year is 2024." and fixed it; its episode as the refresh records it."""
    call_command("import_tasks", verbosity=0)
    calendar = Task.objects.get(slug="calendar")
    models = [
        LLM.objects.create(name=name, family="gemma", preset=f"/p/{name}", context_tokens=2048) for name in ("m1", "m2")
    ]
    battle = Battle.objects.create(
        model_a=models[0], model_b=models[1], voter_key="v", task=calendar, state="ended", **calendar.snapshot()
    )
    for turn, (prompt, reply) in enumerate(
        [("Add a meeting with Fred on Nov 11 at 5PM", WRONG), ("The current year is 2024.", RIGHT)]
    ):
        Message.objects.create(battle=battle, side="a", turn=turn, role="user", content=prompt, script_turn=turn)
        message = Message.objects.create(
            battle=battle, side="a", turn=turn, role="assistant", content=reply, script_turn=turn
        )
        services.review_reply(message)
    services.record_fix_episodes()
    return FixEpisode.objects.get()


def test_an_admin_promotes_a_corrected_turn_into_a_task(admin_client, episode) -> None:
    url = f"/admin/votes/fixepisode/{episode.pk}/promote/"
    page = admin_client.get(url)
    assert page.status_code == 200
    content = page.content.decode()
    assert "5PM" in content and "The current year is 2024." in content  # the mistake and its correction
    # The form starts from the scripted correction's expected output and checker.
    form = page.context["form"]
    assert form.initial["expected_output"] == RIGHT.replace("2023", "2024")
    assert form.initial["checker"] == "python_call" and form.initial["slug"] == f"calendar-fix-{episode.pk}"

    response = admin_client.post(
        url,
        {
            "slug": "fred-time",
            "title": "Fix Fred's time",
            "expected_output": RIGHT,
            "checker": "python_call",
            "checker_options": '{"signature": ["action.add_calendar_entry(title, date, time, duration=30)"]}',
            "active": "on",
        },
    )
    assert response.status_code == 302
    task = Task.objects.get(slug="fred-time")
    assert task.active and task.system_prompt == Task.objects.get(slug="calendar").system_prompt
    assert task.context == [
        {"role": "user", "content": "Add a meeting with Fred on Nov 11 at 5PM"},
        {"role": "assistant", "content": WRONG},
    ]
    (turn,) = task.turns.all()
    assert (turn.prompt, turn.expected_output, turn.corrects_previous) == ("The current year is 2024.", RIGHT, True)
    assert "m1" in task.notes and "fixed" in task.notes  # for admins only

    # A battle on it: both models are handed the mistake as their own, and voters see it.
    battle = services.start_battle(voter_key="voter", task=task)
    submitted = services.submit_prompt(battle=battle, text="The current year is 2024.")
    context = selectors.generation_context(submitted.jobs[0].message_id)
    assert context.conversation == [
        ("user", "Add a meeting with Fred on Nov 11 at 5PM"),
        ("assistant", WRONG),
        ("user", "The current year is 2024."),
    ]
    assert selectors.battle_state(battle)["task"]["context"] == task.context
    # The reply is checked against the admin's expected output.
    reply = Message.objects.get(pk=submitted.jobs[0].message_id)
    reply.content = RIGHT
    reply.status = Message.Status.DONE
    services.review_reply(reply)
    assert reply.check_verdict == "correct"


def test_an_evaluation_run_starts_from_the_promoted_mistake(episode) -> None:
    from votes.evaluation_services import create_evaluation, run_evaluation

    task = services.promote_fix_episode(
        episode, slug="fred-time", title="Fred", expected_output=RIGHT, checker="exact", checker_options={}
    )
    seen = []

    def generate(llm, system_prompt, conversation, seed):
        seen.append(list(conversation))
        return RIGHT

    run = create_evaluation(task=task, llms=[episode.model], attempts=1, max_tries=0, fix_attempts=0)
    run_evaluation(run.pk, generate=generate)
    assert EvaluationRun.objects.get(pk=run.pk).status == "done"
    assert seen and all(
        conversation[:2] == [("user", "Add a meeting with Fred on Nov 11 at 5PM"), ("assistant", WRONG)]
        for conversation in seen
    )


def test_promotion_refuses_clearly_and_writes_nothing(admin_client, episode) -> None:
    url = f"/admin/votes/fixepisode/{episode.pk}/promote/"
    base = {"slug": "fred-time", "title": "Fred", "expected_output": RIGHT, "checker": "python_call"}
    # An expected output that fails its own check, and a slug taken.
    bad = admin_client.post(url, {**base, "checker_options": '{"patterns": {"date": "nope"}}'})
    assert bad.status_code == 200 and bad.context["form"].errors
    taken = admin_client.post(url, {**base, "slug": "calendar", "checker_options": "{}"})
    assert "slug" in taken.context["form"].errors
    # A reply that names a model cannot be shown to voters.
    Message.objects.filter(role="assistant", turn=0).update(identity_leak="m1")
    leak = admin_client.post(url, {**base, "checker_options": "{}"})
    assert "names a model" in str(leak.context["form"].errors)
    assert not Task.objects.filter(slug="fred-time").exists()
    # The action takes exactly one episode.
    response = admin_client.post(
        "/admin/votes/fixepisode/", {"action": "promote", "_selected_action": [episode.pk, episode.pk + 1000]}
    )
    assert response.status_code == 302  # back to the list, with the message
    # An evaluation run's episode has no battle to promote.
    with pytest.raises(Exception, match="live battle"):
        services.promote_fix_episode(
            FixEpisode(model=episode.model, wrong_turn=0, correction="x", fixed=False),
            slug="x",
            title="x",
            expected_output="x",
            checker="exact",
        )


def test_a_task_context_must_be_a_conversation_ending_with_the_model() -> None:
    bad_contexts = [
        [{"role": "assistant", "content": "hi"}],  # starts with the model
        [{"role": "user", "content": "hi"}],  # no reply to correct
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}],  # empty
        "hello",
    ]
    for context in bad_contexts:
        data = {
            "tasks": [{"slug": "t", "title": "T", "context": context, "turns": [{"prompt": "p", "checker": "none"}]}]
        }
        with pytest.raises(services.TaskImportError, match="context"):
            services.import_tasks(data)
    assert not Task.objects.filter(slug="t").exists()


def test_only_an_admin_who_may_add_tasks_can_promote(client, episode) -> None:
    from django.contrib.auth.models import Permission

    staff = User.objects.create_user("staff", "staff@example.org", "pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_fixepisode"))
    client.force_login(staff)
    assert client.get(f"/admin/votes/fixepisode/{episode.pk}/promote/").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="add_task"))
    staff = User.objects.get(pk=staff.pk)  # Permissions are cached on the user.
    client.force_login(staff)
    assert client.get(f"/admin/votes/fixepisode/{episode.pk}/promote/").status_code == 200
