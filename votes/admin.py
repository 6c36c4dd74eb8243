from django.contrib import admin

from votes.models import Battle, Message, Vote


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("turn", "side", "role", "status", "content", "token_count", "time_to_first_token_ms", "duration_ms")
    readonly_fields = fields
    can_delete = False


@admin.register(Battle)
class BattleAdmin(admin.ModelAdmin):
    list_display = ("public_id", "model_a", "model_b", "state", "created")
    list_filter = ("state", "model_a", "model_b")
    search_fields = ("public_id",)
    readonly_fields = ("public_id", "voter_key", "created")
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("battle", "turn", "side", "role", "status", "token_count", "duration_ms")
    list_filter = ("role", "status", "side")
    search_fields = ("battle__public_id", "content")
    raw_id_fields = ("battle",)


@admin.register(Vote)
class VoteAdmin(admin.ModelAdmin):
    list_display = ("battle", "choice", "created")
    list_filter = ("choice",)
    raw_id_fields = ("battle",)
