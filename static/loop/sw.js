// Pippa Loop's service worker (loop/notify): shows a Web Push message as a notification, even
// with no tab open, and opens the question when it is clicked. It asks nothing of its own.
"use strict";
self.addEventListener("push", function (event) {
  let data = {};
  try {
    data = event.data ? event.data.json() : {};
  } catch (e) {
    data = { title: event.data ? event.data.text() : "" };
  }
  const title = "Pippa Loop: " + (data.title || "something needs you");
  event.waitUntil(self.registration.showNotification(title, {
    body: data.text || "",
    tag: "pippa-loop",
    renotify: true,
    data: { url: data.url || "/" },
  }));
});

self.addEventListener("notificationclick", function (event) {
  event.notification.close();
  const url = (event.notification.data && event.notification.data.url) || "/";
  event.waitUntil(self.clients.matchAll({ type: "window", includeUncontrolled: true }).then(function (wins) {
    for (const win of wins) {
      if (win.url === url && "focus" in win) return win.focus();
    }
    return self.clients.openWindow(url);
  }));
});
