from django.urls import path

from .notify import views as notify_views
from .web import views
from .web.pages import (
    clock_page,
    decide,
    home,
    recover,
    schedules_page,
    talk,
    task,
    tasks,
    tools_page,
)

app_name = "loop"
urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("", home.home, name="home"),
    path("tasks/", tasks.tasks_page, name="tasks"),
    path("tasks/new", home.new_task, name="new_task"),
    path("conversation", talk.conversation_page, name="conversation"),
    path(
        "conversation/<int:message_id>/schedule",
        talk.answer_schedule,
        name="answer_schedule",
    ),
    path("clock", clock_page.clock_page, name="clock"),
    path("schedules/", schedules_page.schedules_page, name="schedules"),
    path("schedules/<int:schedule_id>/switch", schedules_page.switch, name="schedule_switch"),
    path("schedules/<int:schedule_id>/edit", schedules_page.edit, name="schedule_edit"),
    path("schedules/<int:schedule_id>/run", schedules_page.run_now, name="schedule_run"),
    path("tasks/<int:task_id>", task.task_page, name="task"),
    path("tasks/<int:task_id>/steps", task.add_steps, name="add_steps"),
    path("tasks/<int:task_id>/supersede", task.supersede, name="supersede"),
    path("tasks/<int:task_id>/pause", decide.pause, name="pause"),
    path("tasks/<int:task_id>/resume", decide.resume, name="resume"),
    path("tasks/<int:task_id>/approve", decide.approve, name="approve"),
    path("tasks/<int:task_id>/decline", decide.decline, name="decline"),
    path("steps/<int:step_id>/decide", decide.decide, name="decide"),
    path("steps/<int:step_id>/retry", recover.retry, name="retry"),
    path("steps/<int:step_id>/skip", recover.skip, name="skip"),
    path("steps/<int:step_id>/transcript", task.step_transcript, name="transcript"),
    # Dad is told (loop/notify): Web Push's key and subscriptions, and its service worker.
    path("notify/push/key", notify_views.push_key, name="push_key"),
    path("notify/push/subscribe", notify_views.push_subscribe, name="push_subscribe"),
    path("sw.js", notify_views.service_worker, name="service_worker"),
    path("tools", tools_page.tools_page, name="tools"),
    path("tools/<str:name>/test", tools_page.test_connection, name="test_connection"),
]
