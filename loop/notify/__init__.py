"""Dad is told (DESIGN.md §17): a notifier follows the journal, as the live pages' tailer does,
and tells each person who may answer questions by email, Web Push and a webhook, grouped and
reminded; the dashboard's own tab adds browser notifications (static/loop/notify.js).

A notification is no side effect of a task: it never asks, it changes nothing a step depends
on, and it is not journaled. Each channel keeps its own cursor row (`NotifyCursor`): what it
sent is at least once, across restarts of the worker that runs it (`loop.worker`)."""
