from django.urls import path

from .web import views
from .web.pages import decide, home, talk, task, tools_page

app_name = "loop"
urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("", home.home, name="home"),
    path("tasks/new", home.new_task, name="new_task"),
    path("conversation", talk.conversation_page, name="conversation"),
    path("tasks/<int:task_id>", task.task_page, name="task"),
    path("tasks/<int:task_id>/steps", task.add_steps, name="add_steps"),
    path("tasks/<int:task_id>/supersede", task.supersede, name="supersede"),
    path("tasks/<int:task_id>/pause", decide.pause, name="pause"),
    path("tasks/<int:task_id>/resume", decide.resume, name="resume"),
    path("tasks/<int:task_id>/approve", decide.approve, name="approve"),
    path("tasks/<int:task_id>/decline", decide.decline, name="decline"),
    path("steps/<int:step_id>/decide", decide.decide, name="decide"),
    path("steps/<int:step_id>/transcript", task.step_transcript, name="transcript"),
    path("tools", tools_page.tools_page, name="tools"),
    path("tools/<str:name>/test", tools_page.test_connection, name="test_connection"),
]
