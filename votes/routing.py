from django.urls import path

from votes.consumers import BattleConsumer

websocket_urlpatterns = [
    path("ws/battle/", BattleConsumer.as_asgi()),
    path("ws/battle/<str:public_id>/", BattleConsumer.as_asgi()),
]
