// Dad is told, and every failure says what to do (issue 27, DESIGN.md §17):
// - a browser notification for a new question while this tab is in the background, and Web
//   Push for when no tab is open (asked for once, from a click on "Notify me");
// - a screen reader hears each new question (an ARIA live region); `a` / `d` answer the
//   question that has the focus (Allow / Deny, or the card's first and its danger button);
// - every question shows its age, kept fresh;
// - a lost live connection is a bar ("Reconnecting…", then "Offline — answers won't reach
//   Pippa"); a button whose request fails says why, where it was clicked.
// live.js tells this file what happens through two events: "pippa:live" (a message applied)
// and "pippa:socket" (open / closed).
(function () {
  "use strict";
  const body = document.body;

  // ---- the live region and the bar ---------------------------------------------------------
  const announcer = document.createElement("div");
  announcer.id = "announcer";
  announcer.className = "visually-hidden";
  announcer.setAttribute("aria-live", "polite");
  announcer.setAttribute("role", "status");
  body.appendChild(announcer);
  function announce(text) {
    announcer.textContent = "";
    setTimeout(function () { announcer.textContent = text; }, 50);
  }

  const bar = document.createElement("div");
  bar.id = "offline-bar";
  bar.className = "offline-bar";
  bar.setAttribute("role", "status");
  bar.setAttribute("aria-live", "assertive");
  bar.hidden = true;
  body.prepend(bar);
  let closedAt = 0;
  let barTimer = 0;
  function showBar() {
    const gone = Date.now() - closedAt;
    bar.hidden = false;
    if (gone > 6000) {
      bar.dataset.state = "offline";
      bar.textContent = "Offline — answers won't reach Pippa. Still trying; if this stays, the " +
        "server is down: run bin/up again (or restart its service).";
    } else {
      bar.dataset.state = "reconnecting";
      bar.textContent = "Reconnecting…";
    }
  }
  document.addEventListener("pippa:socket", function (event) {
    if (event.detail === "open") {
      closedAt = 0;
      clearInterval(barTimer);
      barTimer = 0;
      if (!bar.hidden) {
        bar.dataset.state = "back";
        bar.textContent = "Connected again.";
        setTimeout(function () { if (!closedAt) bar.hidden = true; }, 2000);
      }
      return;
    }
    if (!closedAt) closedAt = Date.now();
    if (!barTimer) {
      barTimer = setInterval(showBar, 1000);
      setTimeout(showBar, 1500);
    }
  });
  window.addEventListener("offline", function () {
    document.dispatchEvent(new CustomEvent("pippa:socket", { detail: "closed" }));
  });

  // ---- failures where Dad clicked ----------------------------------------------------------
  function said(xhr) {
    const tpl = document.createElement("template");
    tpl.innerHTML = xhr.responseText || "";
    const text = (tpl.content.textContent || "").trim().replace(/\s+/g, " ");
    return text.length > 300 ? "" : text;
  }
  function failure(xhr) {
    const status = xhr ? xhr.status : 0;
    if (!status) {
      return "Not sent: the server cannot be reached, so nothing was decided. " +
        "Click again once the bar at the top is gone.";
    }
    const why = said(xhr);
    if (status === 403) {
      return "Refused: you may not do this (signed out, or no permission). Reload the page and sign in again." +
        (why ? " (" + why + ")" : "");
    }
    if (status === 409) {
      return "Already decided elsewhere, or no longer possible: " + (why || "reload to see it as it is now.");
    }
    if (status >= 500) {
      return "The server failed (HTTP " + status + "): nothing was decided. Try again in a moment; " +
        "if it keeps failing, look at the banner or /healthz.";
    }
    return "Refused (HTTP " + status + "): " + (why || "reload the page and try again.");
  }
  function mark(elt, text) {
    const form = elt.closest("form") || elt;
    let box = form.querySelector(":scope > .click-error");
    if (!text) {
      if (box) box.remove();
      return;
    }
    if (!box) {
      box = document.createElement("p");
      box.className = "click-error";
      box.setAttribute("role", "alert");
      form.appendChild(box);
    }
    box.textContent = text;
  }
  body.addEventListener("htmx:beforeRequest", function (event) { mark(event.detail.elt, ""); });
  body.addEventListener("htmx:afterRequest", function (event) {
    const xhr = event.detail.xhr;
    if (event.detail.failed || !xhr || xhr.status === 0 || xhr.status >= 400) {
      mark(event.detail.elt, failure(xhr));
    }
  });

  // A plain form (no htmx: writing to Pippa, adding steps) sent while the live connection is
  // down would leave the page for the browser's error page, and what was typed with it: it is
  // refused here instead, and says so.
  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (!closedAt || !body.dataset.topic || form.hasAttribute("hx-post")) return;
    if (form.getAttribute("action") === "/accounts/logout/") return;
    event.preventDefault();
    mark(form, "Not sent: the server cannot be reached. What you wrote is still here; send it " +
      "again once the bar at the top is gone.");
  });

  // ---- new questions: announced, notified in the background --------------------------------
  function cards() {
    return Array.prototype.slice.call(document.querySelectorAll("article.question"));
  }
  function focusable() {
    cards().forEach(function (card) {
      if (!card.hasAttribute("tabindex")) card.tabIndex = 0;
      card.querySelectorAll("button[value=allow], button[value=happened], button[value=approve]")
        .forEach(function (b) { b.setAttribute("aria-keyshortcuts", "a"); });
      card.querySelectorAll("button.danger").forEach(function (b) { b.setAttribute("aria-keyshortcuts", "d"); });
    });
  }
  function describe(card) {
    const head = card.querySelector("h3");
    const link = card.querySelector("header a");
    return [(head && head.textContent.trim()) || "A question", link ? link.textContent.trim() : ""]
      .filter(Boolean).join(" — ");
  }
  let known = new Set(cards().map(function (c) { return c.id; }));
  const needs = document.getElementById("needs-you");
  let lastCount = Number((needs && needs.dataset.count) || 0);
  function notify(title, text, tag) {
    if (!("Notification" in window) || Notification.permission !== "granted") return;
    if (!document.hidden && document.hasFocus()) return;
    try {
      const n = new Notification(title, { body: text, tag: tag });
      n.onclick = function () { window.focus(); n.close(); };
    } catch (e) {
      // Some browsers allow notifications only from the service worker.
      if (navigator.serviceWorker) {
        navigator.serviceWorker.ready.then(function (reg) { reg.showNotification(title, { body: text, tag: tag }); });
      }
    }
  }
  document.addEventListener("pippa:live", function (event) {
    const msg = event.detail || {};
    focusable();
    refreshAges();
    const now = cards();
    const fresh = now.filter(function (c) { return !known.has(c.id); });
    known = new Set(now.map(function (c) { return c.id; }));
    if (fresh.length) {
      announce((fresh.length === 1 ? "New question: " : fresh.length + " new questions: ") +
        fresh.map(describe).join("; "));
      notify(fresh.length === 1 ? "Pippa asks: " + describe(fresh[0]) : "Pippa asks " + fresh.length + " questions",
        fresh.map(describe).join("\n"), fresh.length === 1 ? fresh[0].id : "pippa-questions");
    } else if (typeof msg.count === "number" && msg.count > lastCount) {
      notify("Pippa Loop: " + msg.count + " waiting for you", "Open the dashboard to answer.", "pippa-count");
    }
    if (typeof msg.count === "number") lastCount = msg.count;
  });

  // ---- a / d answer the focused question ----------------------------------------------------
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
    const key = event.key;
    if (key !== "a" && key !== "d") return;
    const target = event.target;
    if (target.closest && target.closest("input, textarea, select, [contenteditable]")) return;
    const card = target.closest && target.closest("article.question");
    if (!card) return;
    const button = key === "a"
      ? card.querySelector("button[value=allow], button[value=happened], button[value=approve]")
      : card.querySelector("button.danger");
    if (!button || button.disabled) return;
    event.preventDefault();
    button.click();
  });

  // ---- ages ---------------------------------------------------------------------------------
  function ago(seconds) {
    if (seconds < 60) return "just now";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min ago";
    if (seconds < 2 * 86400) return Math.floor(seconds / 3600) + " h ago";
    return Math.floor(seconds / 86400) + " days ago";
  }
  function refreshAges() {
    document.querySelectorAll("time.age[datetime]").forEach(function (t) {
      const at = Date.parse(t.getAttribute("datetime"));
      if (!isNaN(at)) t.textContent = ago(Math.max(0, (Date.now() - at) / 1000));
    });
  }
  setInterval(refreshAges, 30000);

  // ---- asking to be told: the Notification API and Web Push ---------------------------------
  function subscribe() {
    if (!("serviceWorker" in navigator) || !("PushManager" in window)) return Promise.resolve(false);
    return navigator.serviceWorker.register("/sw.js", { scope: "/" }).then(function (reg) {
      return fetch("/notify/push/key", { credentials: "same-origin" }).then(function (r) { return r.json(); })
        .then(function (data) {
          const raw = atob(data.key.replace(/-/g, "+").replace(/_/g, "/"));
          const key = new Uint8Array(raw.length);
          for (let i = 0; i < raw.length; i++) key[i] = raw.charCodeAt(i);
          return reg.pushManager.getSubscription().then(function (sub) {
            return sub || reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key });
          });
        })
        .then(function (sub) {
          // Sent once per browser and person (again if the browser's subscription changed).
          const who = document.querySelector("header.bar form.inline button");
          const sent = sub.endpoint + " " + (who ? who.textContent.trim() : "");
          try {
            if (localStorage.getItem("pippa-push") === sent) return true;
          } catch (e) { /* storage off: send it */ }
          const csrf = JSON.parse(body.getAttribute("hx-headers") || "{}")["X-CSRFToken"];
          return fetch("/notify/push/subscribe", {
            method: "POST", credentials: "same-origin",
            headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
            body: JSON.stringify(sub.toJSON()),
          }).then(function (r) {
            try {
              if (r.ok) localStorage.setItem("pippa-push", sent);
            } catch (e) { /* storage off */ }
            return r.ok;
          });
        });
    }).catch(function () { return false; });
  }
  const nav = document.querySelector("header.bar nav");
  if (nav && "Notification" in window && body.dataset.topic) {
    const ask = document.createElement("button");
    ask.type = "button";
    ask.className = "link notify-ask";
    ask.id = "notify-ask";
    function label() {
      const p = Notification.permission;
      ask.textContent = p === "granted" ? "Notifications on" : p === "denied" ? "Notifications blocked" : "Notify me";
      ask.title = p === "denied" ? "This browser blocks notifications from this site: allow them in its site settings." :
        "Tell me on this device when Pippa asks something";
      ask.disabled = p !== "default";
    }
    label();
    ask.addEventListener("click", function () {
      Notification.requestPermission().then(function (p) {
        label();
        if (p === "granted") subscribe();
      });
    });
    nav.insertBefore(ask, nav.firstChild);
    if (Notification.permission === "granted") subscribe();
  }
  focusable();
})();
