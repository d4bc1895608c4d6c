from django.urls import path

from .notify import views as notify_views
from .web import views
from .web.pages import decide, home, talk, task

app_name = "loop"
urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("", home.home, name="home"),
    path("tasks/new", home.new_task, name="new_task"),
    path("conversation", talk.conversation_page, name="conversation"),
    path(
        "conversation/<int:message_id>/schedule",
        talk.answer_schedule,
        name="answer_schedule",
    ),
    path("tasks/<int:task_id>", task.task_page, name="task"),
    path("tasks/<int:task_id>/steps", task.add_steps, name="add_steps"),
    path("tasks/<int:task_id>/supersede", task.supersede, name="supersede"),
    path("tasks/<int:task_id>/pause", decide.pause, name="pause"),
    path("tasks/<int:task_id>/resume", decide.resume, name="resume"),
    path("tasks/<int:task_id>/approve", decide.approve, name="approve"),
    path("tasks/<int:task_id>/decline", decide.decline, name="decline"),
    path("steps/<int:step_id>/decide", decide.decide, name="decide"),
    path("steps/<int:step_id>/transcript", task.step_transcript, name="transcript"),
    # Dad is told (loop/notify): Web Push's key and subscriptions, and its service worker.
    path("notify/push/key", notify_views.push_key, name="push_key"),
    path("notify/push/subscribe", notify_views.push_subscribe, name="push_subscribe"),
    path("sw.js", notify_views.service_worker, name="service_worker"),
]
