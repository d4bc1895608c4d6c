// Live pages: one WebSocket per page. The server sends rendered partials; we swap elements by
// id, add journal rows once, and remember the last event id so a reconnect resumes from it.
(function () {
  "use strict";
  const body = document.body;
  const topic = body.dataset.topic;
  if (!topic) return;
  const baseTitle = document.title.replace(/^\(\d+\) /, "");
  const state = (window.pippaLive = { last: Number(body.dataset.lastEvent || 0), messages: 0,
    recent: (body.dataset.seenEvents || "").split(",").filter(Boolean).map(Number) });
  const WINDOW = 256; // ids below `last` that may still commit late (PostgreSQL)
  // The server's refusals (loop/web/consumers.py): the page says why and stops reconnecting.
  const REFUSED = {
    4400: { text: "This page's address does not read (a number that is not one) — reload it.", link: "" },
    4401: { text: "Signed out — log in again to see live updates.", link: "Log in" },
    4403: { text: "You may no longer follow this page — ask for access.", link: "" },
    4404: { text: "This page's task does not exist (any more).", link: "Home" },
  };
  // The server is there but cannot serve live updates now (the database or Redis is down):
  // the page says so and tries again, waiting longer each time (loop/web/unavailable.py).
  const PAUSED = 4503;
  let delay = 250;
  let openedAt = 0;

  function paused(on) {
    const box = document.getElementById("live-paused");
    body.dataset.live = on ? "paused" : body.dataset.live;
    if (box) box.hidden = !on;
  }

  function refused(code) {
    const why = REFUSED[code];
    const box = document.getElementById("live-refused");
    state.refused = code;
    body.dataset.live = "refused";
    if (!box) return;
    box.textContent = why.text + " ";
    if (why.link) {
      const a = document.createElement("a");
      a.textContent = why.link;
      a.href = code === 4401 ? "/accounts/login/?next=" + encodeURIComponent(location.pathname) : "/";
      box.appendChild(a);
    }
    box.hidden = false;
  }

  function fragment(html) {
    const tpl = document.createElement("template");
    tpl.innerHTML = html;
    return tpl.content.firstElementChild;
  }

  // Keep what a person was typing (a note, a plan, an edited call; a field they emptied too)
  // and what they opened (a folded body) when the element around it is replaced — and the
  // field they are typing in, with its caret, so the next key lands where the last one did.
  function keepInputs(from, to) {
    from.querySelectorAll("input[id], textarea[id]").forEach(function (old) {
      const fresh = to.querySelector("#" + CSS.escape(old.id));
      if (!fresh || fresh.type === "hidden" || fresh.type !== old.type) return;
      if (old.type === "checkbox" || old.type === "radio") {
        if (old.checked !== old.defaultChecked) fresh.checked = old.checked;
      } else if (old.value !== old.defaultValue) {
        fresh.value = old.value;
      }
    });
    from.querySelectorAll("details[id][open]").forEach(function (old) {
      const fresh = to.querySelector("#" + CSS.escape(old.id));
      if (fresh) fresh.open = true;
    });
    // The field being typed in: its twin in the new element takes the focus once it is in place.
    const active = document.activeElement;
    const inside = active && active.id && from.contains(active);
    const twin = inside ? to.querySelector("#" + CSS.escape(active.id)) : null;
    if (!twin) return function () {};
    let caret = null;
    try {
      caret = [active.selectionStart, active.selectionEnd, active.selectionDirection];
    } catch (e) { /* a field without a caret */ }
    const scroll = active.scrollTop;
    return function () {
      twin.focus({ preventScroll: true });
      try {
        if (caret && caret[0] !== null) twin.setSelectionRange(caret[0], caret[1], caret[2]);
      } catch (e) { /* a field without a caret */ }
      twin.scrollTop = scroll;
    };
  }

  function activate(el) {
    if (window.htmx) window.htmx.process(el);
  }

  function apply(msg) {
    (msg.swaps || []).forEach(function (swap) {
      const old = document.getElementById(swap.id);
      const el = fragment(swap.html);
      if (!old || !el) return;
      const refocus = keepInputs(old, el);
      old.replaceWith(el);
      refocus();
      activate(el);
    });
    (msg.rows || []).forEach(function (row) {
      if (document.getElementById(row.id)) return;
      const box = document.getElementById(row.into);
      const el = fragment(row.html);
      if (box && el) box.prepend(el);
    });
    (msg.events || []).forEach(function (id) {
      if (id > state.last) state.last = id;
      state.recent.push(id);
    });
    state.recent = state.recent.filter(function (id) { return id > state.last - WINDOW; });
    if (typeof msg.count === "number") {
      document.title = (msg.count ? "(" + msg.count + ") " : "") + baseTitle;
    }
    state.messages += 1;
    document.dispatchEvent(new CustomEvent("pippa:live", { detail: msg })); // notify.js
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const url = scheme + location.host + "/ws/live?topic=" + encodeURIComponent(topic) + "&after=" + state.last +
      "&seen=" + state.recent.join(",");
    const ws = new WebSocket(url);
    state.socket = ws;
    ws.onopen = function () {
      openedAt = Date.now();
      body.dataset.live = "open";
      document.dispatchEvent(new CustomEvent("pippa:socket", { detail: "open" })); // notify.js
    };
    ws.onmessage = function (event) {
      const msg = JSON.parse(event.data);
      delay = 250; // it works: the next break is tried again at once
      paused(false);
      if (msg.reload) {
        // The last event this page saw was pruned: load the page afresh rather than patch it.
        state.reloading = true;
        ws.close();
        location.reload();
        return;
      }
      apply(msg);
    };
    state.attempts = (state.attempts || 0) + 1;
    ws.onclose = function (event) {
      body.dataset.live = "closed";
      document.dispatchEvent(new CustomEvent("pippa:socket", { detail: "closed" })); // notify.js
      if (state.reloading) return;
      if (REFUSED[event.code]) return refused(event.code);
      // A socket that stayed open a while broke by chance: try again soon. One closed at
      // once, or as paused, waits longer each time (up to 30 s, with some jitter).
      if (openedAt && Date.now() - openedAt > 10000 && event.code !== PAUSED) delay = 250;
      openedAt = 0;
      if (event.code === PAUSED) paused(true);
      state.closes = (state.closes || 0) + 1;
      setTimeout(connect, delay * (0.75 + Math.random() / 2));
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
