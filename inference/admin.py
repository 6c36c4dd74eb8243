from django.contrib import admin

from arena_site.admin_text import TypedTextAdmin
from inference.models import LLM


@admin.register(LLM)
class LLMAdmin(TypedTextAdmin, admin.ModelAdmin):
    list_display = ("name", "family", "base", "queue", "enabled", "sampling_weight", "preset")
    list_filter = ("family", "enabled")
    list_editable = ("enabled", "sampling_weight")
    search_fields = ("name", "preset", "queue")
