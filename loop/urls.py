from django.urls import path, re_path

from .api import agent as api_agent
from .api import talk as api_talk
from .api import views as api
from .api.core import not_found, route
from .web import views
from .web.pages import decide, home, talk, task

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
    path("steps/<int:step_id>/decide", decide.decide, name="decide"),
    # The HTTP API (loop/api/): token auth, JSON, no trailing slashes.
    path("api/openapi.json", route(get=api.openapi), name="api_openapi"),
    path("api/tasks", route(get=api.list_tasks, post=api.create_task), name="api_tasks"),
    path("api/tasks/<int:task_id>", route(get=api.show_task), name="api_task"),
    path("api/tasks/<int:task_id>/steps", route(post=api.add_steps), name="api_add_steps"),
    path("api/tasks/<int:task_id>/pause", route(post=api.pause), name="api_pause"),
    path("api/tasks/<int:task_id>/resume", route(post=api.resume), name="api_resume"),
    path("api/tasks/<int:task_id>/supersede", route(post=api.supersede), name="api_supersede"),
    path("api/tasks/<int:task_id>/next", route(post=api_agent.next_step), name="api_next"),
    path("api/tasks/<int:task_id>/release", route(post=api_agent.release), name="api_release"),
    path("api/steps/<int:step_id>/commit", route(post=api_agent.commit), name="api_commit"),
    path("api/steps/<int:step_id>/renew", route(post=api_agent.renew), name="api_renew"),
    path("api/steps/<int:step_id>/unblock", route(post=api.unblock), name="api_unblock"),
    path("api/effects", route(post=api_agent.effect), name="api_effects"),
    path("api/events", route(get=api.events), name="api_events"),
    path(
        "api/messages",
        route(get=api_talk.list_messages, post=api_talk.post_message),
        name="api_messages",
    ),
    path(
        "api/schedules",
        route(get=api_talk.list_schedules, post=api_talk.create_schedule),
        name="api_schedules",
    ),
    re_path(r"^api(?:/|$)", not_found),  # any other /api/ path: a JSON 404, not Django's HTML
]
