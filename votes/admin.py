import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from arena_site.admin_text import TypedTextAdmin, TypedTextField
from inference.models import LLM
from votes import evaluation_services, selectors, services
from votes.models import (
    Battle,
    EvaluationReply,
    EvaluationRun,
    FixEpisode,
    FlaggedNetwork,
    FlaggedVoter,
    Message,
    ResearcherKey,
    Task,
    TaskTurn,
    Vote,
)


class TaskTurnInline(TypedTextAdmin, admin.StackedInline):
    model = TaskTurn
    extra = 0
    ordering = ("position",)
    fields = ("position", "prompt", "expected_output", "checker", "checker_options", "corrects_previous")


class PromoteEpisodeForm(forms.Form):
    slug = forms.SlugField(max_length=60)
    title = forms.CharField(max_length=200)
    expected_output = TypedTextField(widget=forms.Textarea, help_text="The reply that fixes the mistake.")
    checker = forms.ChoiceField(choices=TaskTurn.Checker.choices)
    checker_options = forms.JSONField(required=False, initial=dict)
    active = forms.BooleanField(required=False, initial=True, help_text="Offer it to voters at once.")


class TaskImportForm(forms.Form):
    file = forms.FileField(help_text="A JSON file as written by Export (or `manage.py export_tasks`).")
    keep_existing = forms.BooleanField(required=False, help_text="Leave tasks whose slug exists untouched.")


@admin.register(Task)
class TaskAdmin(TypedTextAdmin, admin.ModelAdmin):
    list_display = ("title", "slug", "category", "active", "turn_count", "updated")
    list_filter = ("active", "category")
    search_fields = ("title", "slug", "system_prompt", "notes")
    prepopulated_fields = {"slug": ("title",)}
    inlines = [TaskTurnInline]
    actions = ["activate", "deactivate", "duplicate", "export_json", "run_evaluation"]
    change_list_template = "admin/votes/task/change_list.html"

    @admin.display(description="turns")
    def turn_count(self, task: Task) -> int:
        return task.turns.count()

    @admin.action(description="Activate the selected tasks")
    def activate(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        self.message_user(request, f"{queryset.update(active=True)} task(s) activated.")

    @admin.action(description="Deactivate the selected tasks")
    def deactivate(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        self.message_user(request, f"{queryset.update(active=False)} task(s) deactivated.")

    @admin.action(description="Duplicate the selected tasks (copies are inactive)")
    def duplicate(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        copies = [services.duplicate_task(task) for task in queryset]
        self.message_user(request, f"Created {', '.join(copy.slug for copy in copies)}.")

    @admin.action(description="Export the selected tasks as JSON")
    def export_json(self, request: HttpRequest, queryset: QuerySet[Task]) -> HttpResponse:
        response = HttpResponse(
            json.dumps(selectors.export_tasks(queryset.order_by("slug")), indent=2, ensure_ascii=False),
            content_type="application/json",
        )
        response["Content-Disposition"] = 'attachment; filename="tasks.json"'
        return response

    @admin.action(description="Run an evaluation of every enabled model on the selected tasks")
    def run_evaluation(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        llms = list(LLM.objects.enabled())
        if len(llms) < 1:
            self.message_user(request, "No enabled model to evaluate.", messages.ERROR)
            return
        for task in queryset:
            run = evaluation_services.start_evaluation(task=task, llms=llms)
            url = reverse("votes:evaluation", args=[run.pk])
            self.message_user(request, f"Evaluation {run.pk} of {task.slug} started: {url}")

    def get_urls(self) -> list[Any]:
        return [
            path("import/", self.admin_site.admin_view(self.import_view), name="votes_task_import"),
            *super().get_urls(),
        ]

    def import_view(self, request: HttpRequest) -> HttpResponse:
        form = TaskImportForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            try:
                data = json.loads(form.cleaned_data["file"].read().decode("utf-8"))
                imported = services.import_tasks(data, keep_existing=form.cleaned_data["keep_existing"])
            except (UnicodeDecodeError, ValueError) as error:  # TaskImportError is a ValueError.
                form.add_error("file", f"{error} Nothing was imported.")
            else:
                self.message_user(request, f"Imported {len(imported)} task(s).")
                return HttpResponseRedirect(reverse("admin:votes_task_changelist"))
        context = {**self.admin_site.each_context(request), "form": form, "title": "Import tasks", "opts": Task._meta}
        return render(request, "admin/votes/task/import.html", context)


class MessageInline(TypedTextAdmin, admin.TabularInline):
    model = Message
    extra = 0
    fields = (
        "turn",
        "side",
        "role",
        "status",
        "content",
        "rating",
        "check_verdict",
        "check_reason",
        "identity_leak",
        "token_count",
    )
    readonly_fields = fields
    can_delete = False


class VoteInline(TypedTextAdmin, admin.TabularInline):
    model = Vote
    extra = 0
    fields = ("stage", "choice", "after_turn", "created")
    readonly_fields = fields
    can_delete = False


@admin.register(Battle)
class BattleAdmin(TypedTextAdmin, admin.ModelAdmin):
    list_display = ("public_id", "task", "model_a", "model_b", "state", "excluded", "created")
    list_filter = ("state", "excluded", "task", "model_a", "model_b")
    search_fields = ("public_id", "excluded_reason")
    # What its models were given stays as it was (Battle.system_prompt, context, script).
    readonly_fields = (
        "public_id",
        "voter_key",
        "network_key",
        "created",
        "ended",
        "system_prompt",
        "context",
        "script",
    )
    inlines = [VoteInline, MessageInline]
    actions = ["flag_voters"]

    @admin.action(description="Flag the voters of the selected battles (their votes leave the leaderboard)")
    def flag_voters(self, request: HttpRequest, queryset: QuerySet[Battle]) -> None:
        keys = set(queryset.values_list("voter_key", flat=True))
        for key in keys:
            flag, created = FlaggedVoter.objects.get_or_create(
                voter_key=key, defaults={"reason": f"flagged by {request.user}"}
            )
            if not created and flag.cleared:  # Flagged again after a review.
                FlaggedVoter.objects.filter(pk=flag.pk).update(cleared=False, reason=f"flagged by {request.user}")
        self.message_user(request, f"{len(keys)} voter(s) flagged.")


@admin.register(FlaggedVoter)
class FlaggedVoterAdmin(TypedTextAdmin, admin.ModelAdmin):
    """Review flags: clearing one puts the voter's votes back into the leaderboard (from its
    next refresh) and keeps the anomaly detection from flagging that voter again."""

    list_display = ("voter_key", "source", "reason", "p_value", "cleared", "created")
    list_filter = ("source", "cleared")
    search_fields = ("voter_key", "reason")
    readonly_fields = ("voter_key", "network", "source", "p_value", "created")
    actions = ["clear_flags", "restore_flags"]

    @admin.action(description="Clear the selected flags (their votes count again)")
    def clear_flags(self, request: HttpRequest, queryset: QuerySet[FlaggedVoter]) -> None:
        count = queryset.update(cleared=True)
        self.message_user(request, f"{count} flag(s) cleared.")

    @admin.action(description="Restore the selected flags (their votes are excluded again)")
    def restore_flags(self, request: HttpRequest, queryset: QuerySet[FlaggedVoter]) -> None:
        count = queryset.update(cleared=False)
        self.message_user(request, f"{count} flag(s) restored.")


@admin.register(FlaggedNetwork)
class FlaggedNetworkAdmin(TypedTextAdmin, admin.ModelAdmin):
    """Review network flags: clearing one clears the flags of the voters flagged for voting from
    it (their votes count again from the next refresh), and the detection leaves it alone."""

    list_display = ("network_key", "source", "reason", "p_value", "voters", "cleared", "created")
    list_filter = ("source", "cleared")
    search_fields = ("network_key", "reason")
    readonly_fields = ("network_key", "source", "p_value", "created")
    actions = ["clear_flags", "restore_flags"]

    @admin.display(description="voters flagged through it")
    def voters(self, flag: FlaggedNetwork) -> int:
        return flag.voter_flags.count()

    @admin.action(description="Clear the selected network flags and their voters' (their votes count again)")
    def clear_flags(self, request: HttpRequest, queryset: QuerySet[FlaggedNetwork]) -> None:
        count = queryset.update(cleared=True)
        FlaggedVoter.objects.filter(network__in=queryset).update(cleared=True)
        self.message_user(request, f"{count} network flag(s) cleared.")

    @admin.action(description="Restore the selected network flags and their voters' (their votes are excluded again)")
    def restore_flags(self, request: HttpRequest, queryset: QuerySet[FlaggedNetwork]) -> None:
        count = queryset.update(cleared=False)
        FlaggedVoter.objects.filter(network__in=queryset).update(cleared=False)
        self.message_user(request, f"{count} network flag(s) restored.")


@admin.register(Message)
class MessageAdmin(TypedTextAdmin, admin.ModelAdmin):
    list_display = ("battle", "turn", "side", "role", "status", "rating", "check_verdict", "token_count")
    list_filter = ("role", "status", "side", "rating", "check_verdict")
    search_fields = ("battle__public_id", "content")
    raw_id_fields = ("battle",)


@admin.register(Vote)
class VoteAdmin(TypedTextAdmin, admin.ModelAdmin):
    list_display = ("battle", "stage", "choice", "created")
    list_filter = ("stage", "choice")
    raw_id_fields = ("battle",)


class EvaluationReplyInline(TypedTextAdmin, admin.TabularInline):
    model = EvaluationReply
    extra = 0
    fields = ("model", "part", "attempt", "turn", "try_number", "prompt", "reply", "rating", "reason")
    readonly_fields = fields
    can_delete = False


@admin.register(EvaluationRun)
class EvaluationRunAdmin(TypedTextAdmin, admin.ModelAdmin):
    list_display = ("pk", "task", "status", "progress", "total", "time_left", "created", "finished")
    list_filter = ("status", "task")
    readonly_fields = ("status", "progress", "total", "time_left", "error", "created", "started", "finished")
    inlines = [EvaluationReplyInline]
    actions = ["run_again", "cancel"]

    @admin.display(description="time left")
    def time_left(self, run: EvaluationRun) -> str:
        seconds = run.seconds_left(timezone.now())
        return "—" if seconds is None else f"about {round(seconds)} s"

    @admin.action(description="Cancel the selected waiting or running evaluations")
    def cancel(self, request: HttpRequest, queryset: QuerySet[EvaluationRun]) -> None:
        cancelled = sorted(run.pk for run in queryset if evaluation_services.cancel_evaluation(run))
        skipped = queryset.count() - len(cancelled)
        if cancelled:
            self.message_user(
                request, f"Cancelled: {', '.join(map(str, cancelled))}. Each stops within seconds and keeps nothing."
            )
        if skipped:
            self.message_user(request, f"{skipped} run(s) left alone: they had already ended.", messages.WARNING)

    @admin.action(description="Run the selected failed, interrupted or cancelled evaluations again")
    def run_again(self, request: HttpRequest, queryset: QuerySet[EvaluationRun]) -> None:
        restarted = sorted(run.pk for run in queryset if evaluation_services.restart_evaluation(run))
        skipped = queryset.count() - len(restarted)
        if restarted:
            self.message_user(request, f"Started again: {', '.join(map(str, restarted))}.")
        if skipped:
            self.message_user(
                request,
                f"{skipped} run(s) left alone: only failed, interrupted or cancelled runs start over.",
                messages.WARNING,
            )


@admin.register(ResearcherKey)
class ResearcherKeyAdmin(TypedTextAdmin, admin.ModelAdmin):
    """Keys are issued here: the token is shown once, on creation; revoke by ticking "revoked"."""

    list_display = ("name", "prefix", "revoked", "created", "last_used")
    list_filter = ("revoked",)
    search_fields = ("name", "prefix")
    fields = ("name", "revoked", "prefix", "created", "last_used")
    readonly_fields = ("prefix", "created", "last_used")

    def save_model(self, request: HttpRequest, obj: ResearcherKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        key, token = services.issue_researcher_key(obj.name)
        obj.pk, obj.prefix, obj.key_hash = key.pk, key.prefix, key.key_hash
        request._issued_token = token  # type: ignore[attr-defined]  # For response_add, this request only.

    def response_add(self, request: HttpRequest, obj: ResearcherKey, post_url_continue: str | None = None) -> Any:
        """The token on the response page itself, once: not in a message, which the messages
        framework would carry to the next page in a cookie (signed, not encrypted)."""
        token = getattr(request, "_issued_token", None)
        if token is None:
            return super().response_add(request, obj, post_url_continue)
        context = {**self.admin_site.each_context(request), "key": obj, "token": token, "title": "API key issued"}
        # The admin's views are never cached (never_cache): the page is not kept either.
        return TemplateResponse(request, "admin/votes/researcherkey/issued.html", context)


@admin.register(FixEpisode)
class FixEpisodeAdmin(TypedTextAdmin, admin.ModelAdmin):
    """Fix episodes, as the last leaderboard refresh recorded them; a live one can be promoted
    into a curated task (the dynamic benchmark: it grows from real mistakes)."""

    list_display = ("__str__", "model", "task", "source", "specificity", "fixed", "regression", "persisted")
    list_filter = ("fixed", "source", "specificity", "regression", "persisted", "model", "task")
    search_fields = ("battle__public_id", "correction")
    readonly_fields = [field.name for field in FixEpisode._meta.fields]
    actions = ["promote"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # Rebuilt from the battles at every refresh.

    @admin.action(description="Promote the selected episode to a curated task")
    def promote(self, request: HttpRequest, queryset: QuerySet[FixEpisode]) -> HttpResponse | None:
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one episode to promote.", messages.ERROR)
            return None
        return HttpResponseRedirect(reverse("admin:votes_fixepisode_promote", args=[queryset.get().pk]))

    def get_urls(self) -> list[Any]:
        return [
            path(
                "<int:episode_id>/promote/",
                self.admin_site.admin_view(self.promote_view),
                name="votes_fixepisode_promote",
            ),
            *super().get_urls(),
        ]

    def promote_view(self, request: HttpRequest, episode_id: int) -> HttpResponse:
        episode = get_object_or_404(FixEpisode.objects.select_related("battle__task", "model"), pk=episode_id)
        if not request.user.has_perm("votes.add_task"):  # It creates a task.
            return HttpResponse(status=403)
        source = episode.battle.task if episode.battle else None
        form = PromoteEpisodeForm(request.POST or None, initial=selectors.promotion_defaults(episode))
        if request.method == "POST" and form.is_valid():
            try:
                task = services.promote_fix_episode(episode, **form.cleaned_data)
            except ValidationError as error:
                for field, errors in getattr(error, "message_dict", {None: error.messages}).items():
                    form.add_error(field if field in form.fields else None, errors)
            else:
                self.message_user(request, f"Task {task.slug!r} created from the episode.")
                return HttpResponseRedirect(reverse("admin:votes_task_change", args=[task.pk]))
        context = {
            **self.admin_site.each_context(request),
            "form": form,
            "episode": episode,
            "history": selectors.episode_history(episode),
            "source_context": len(source.context) if source else 0,
            "title": "Promote a corrected turn to a task",
            "opts": FixEpisode._meta,
        }
        return render(request, "admin/votes/fixepisode/promote.html", context)
