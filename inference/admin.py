from django.contrib import admin, messages
from django.forms import ModelForm
from django.http import HttpRequest

from arena_site.admin_text import TypedTextAdmin
from inference.models import CONTEXT_NOTE, GREEDY_NOTE, LLM


@admin.register(LLM)
class LLMAdmin(TypedTextAdmin, admin.ModelAdmin):
    list_display = ("name", "family", "base", "served_by", "queue", "enabled", "sampling_weight", "anonymous_battles")
    list_filter = ("family", "enabled")
    list_editable = ("enabled", "sampling_weight")
    search_fields = ("name", "preset", "queue", "endpoint_url", "served_model")
    fieldsets = (
        (None, {"fields": ("name", "family", "base", "enabled", "sampling_weight", "queue")}),
        ("Hosted by the arena (keras-hub)", {"fields": ("preset", "dtype", "mesh_shape")}),
        (
            "Served elsewhere (an OpenAI-compatible endpoint)",
            {"fields": ("endpoint_url", "served_model", "api_key_env", "server_applies_template")},
        ),
        (
            "Replies",
            {"fields": ("temperature", "top_k", "top_p", "max_new_tokens", "max_reply_seconds", "context_tokens")},
        ),
    )

    @admin.display(description="served by")
    def served_by(self, llm: LLM) -> str:
        return llm.endpoint_url or f"keras-hub: {llm.preset}"

    @admin.display(boolean=True, description="in anonymous battles")
    def anonymous_battles(self, llm: LLM) -> bool:
        """Whether anonymous battles may draw it: enabled, weighted, sampling, and with the context."""
        return llm.enabled and llm.sampling_weight > 0 and llm.samples and llm.fits_arena

    def save_model(self, request: HttpRequest, obj: LLM, form: ModelForm, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if not obj.samples:
            messages.warning(request, f"{obj.name} decodes greedily. {GREEDY_NOTE}")
        if not obj.fits_arena:
            context = "an unknown context" if obj.context_tokens is None else f"a {obj.context_tokens:,}-token context"
            messages.warning(request, f"{obj.name} has {context}. {CONTEXT_NOTE}")
