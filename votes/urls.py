from django.urls import path

from votes import views

app_name = "votes"
urlpatterns = [
    path("", views.arena, name="arena"),
    path("battle/<str:public_id>/", views.battle, name="battle"),
    path("evaluations/", views.evaluations, name="evaluations"),
    path("evaluations/<int:run_id>/", views.evaluation, name="evaluation"),
]
