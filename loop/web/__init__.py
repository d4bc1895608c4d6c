"""The web edge: what serves people's browsers. `pages/` are the dashboard's views and the
context their templates render; `live` tails the journal and pushes the partials those events
touch to `consumers` (the WebSocket, routed by `routing`); `forms` read what the pages post;
`timeline` draws a task's steps over time; `views` is the health check. Everything here calls
down into `loop` (actions, questions, models); nothing in `loop` outside `web/` imports it,
except the admin's login form and the URL and ASGI wiring."""
