from django.urls import path

from votes import views

app_name = "votes"
urlpatterns = [
    path("", views.arena, name="arena"),
    path("named/", views.named, name="named"),
    path("direct/", views.direct, name="direct"),
    path("roster/", views.roster, name="roster"),
    path("battle/<str:public_id>/", views.battle, name="battle"),
    path("share/<str:share_id>/", views.share, name="share"),
    path("evaluations/", views.evaluations, name="evaluations"),
    path("evaluations/<int:run_id>/", views.evaluation, name="evaluation"),
    path("evaluations/<int:run_id>/progress/", views.evaluation_progress, name="evaluation_progress"),
    path("evaluations/<int:run_id>/cancel/", views.cancel_evaluation, name="cancel_evaluation"),
]
