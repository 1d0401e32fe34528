// The console's only script (served from /static, so the CSP needs no inline script).
// - [data-poll]: refresh states from the JSON API every 2 s, without a reload;
// - form.action: POST the action bar's forms to the API (or `data-method`: DELETE a target)
//   with the page's CSRF token, and
//   follow a capture to its session's page once the session exists, or reload the page
//   (`data-reload`: pinning a run's baseline);
// - button.share / button.revoke: create and revoke share links;
// - time.when: a UTC time (its text, without scripts) shown in the browser's local time
//   with its age ("3 min ago"), the UTC time in its tooltip; ages refresh every 30 s.
"use strict";
(function () {
  const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  function text(el, value) { if (el) el.textContent = value == null ? "" : String(value); }

  // A message from the API, its `code` spans drawn as <code> (built as DOM nodes, never
  // parsed as HTML), so no Markdown backtick shows.
  function message(el, value) {
    if (!el) return;
    el.textContent = "";
    String(value == null ? "" : value).split("`").forEach((part, i) => {
      if (i % 2) {
        const code = document.createElement("code");
        code.textContent = part;
        el.appendChild(code);
      } else if (part) {
        el.appendChild(document.createTextNode(part));
      }
    });
  }

  function badge(cell, cls, value) {
    if (!cell) return;
    cell.textContent = "";
    if (!value) return;
    const span = document.createElement("span");
    span.className = cls + value;
    span.textContent = value;
    cell.appendChild(span);
  }

  async function api(url, method, body) {
    const headers = {"Accept": "application/json", "X-CSRF-Token": csrf()};
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const r = await fetch(url, {method: method, headers: headers, credentials: "same-origin",
                                body: body === undefined ? undefined : JSON.stringify(body)});
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) throw new Error((data && data.detail) || (r.status + " " + r.statusText));
    return data;
  }

  function updateRow(row, s) {
    badge(row.querySelector('[data-field="state"]'), "st st-", s.state);
    badge(row.querySelector('[data-field="verdict"]'), "badge b-", s.verdict);
    text(row.querySelector('[data-field="top_finding"]'), s.top_finding);
    text(row.querySelector('[data-field="duration_s"]'),
         s.duration_s == null ? "" : s.duration_s.toFixed(1) + " s");
  }

  const relative = new Intl.RelativeTimeFormat(undefined, {numeric: "auto"});
  const localTime = new Intl.DateTimeFormat(undefined, {dateStyle: "medium",
                                                        timeStyle: "medium"});
  const UNITS = [["year", 31536000], ["month", 2592000], ["week", 604800], ["day", 86400],
                 ["hour", 3600], ["minute", 60], ["second", 1]];

  function age(seconds) {
    for (const [unit, size] of UNITS) {
      if (Math.abs(seconds) >= size || unit === "second") {
        return relative.format(-Math.round(seconds / size), unit);
      }
    }
    return "";
  }

  function localTimes() {
    const now = Date.now();
    for (const el of document.querySelectorAll("time.when[datetime]")) {
      const at = new Date(el.getAttribute("datetime"));
      if (isNaN(at)) continue;
      if (!el.dataset.utc) el.dataset.utc = el.textContent;
      el.textContent = localTime.format(at) + " (" + age((now - at) / 1000) + ")";
      el.title = el.dataset.utc;
    }
  }

  function poll(el) {
    const url = el.dataset.poll;
    const tick = async () => {
      try {
        const data = await api(url, "GET");
        if (el.matches("table.sessions")) {
          // Keyed by run and session: the list of every run's sessions has both.
          const rows = new Map([...el.querySelectorAll("tr[data-session]")]
            .map(r => [r.dataset.run + "/" + r.dataset.session, r]));
          let unknown = false;
          for (const s of data) {
            const row = rows.get(s.run + "/" + s.session);
            if (row) updateRow(row, s); else unknown = true;
          }
          if (unknown) { window.location.reload(); return; }
        } else if (el.matches("table.runs")) {
          for (const r of data) {
            const row = el.querySelector('tr[data-run="' + CSS.escape(r.name) + '"]');
            if (!row) { window.location.reload(); return; }
          }
        } else if (el.dataset.state !== undefined) {
          badge(document.querySelector('h1 [data-field="state"]'), "st st-", null);
          const h = document.querySelector('h1 [data-field="state"]');
          if (h) { h.className = "st st-" + data.state; h.textContent = data.state; }
          badge(document.querySelector('h1 [data-field="verdict"]'), "badge b-", data.verdict);
          text(document.querySelector('[data-field="duration_s"]'), data.duration_s);
          const done = (el.dataset.reloadOn || "").split(",");
          if (data.state !== el.dataset.state && done.includes(data.state)) {
            window.location.reload(); return;
          }
          if (done.includes(data.state)) return;  // final: stop polling
        }
      } catch (e) { /* keep the page as it is; try again */ }
      setTimeout(tick, 2000);
    };
    setTimeout(tick, 2000);
  }

  function formBody(form) {
    const out = {};
    for (const [k, v] of new FormData(form).entries()) {
      if (k === "csrf_token" || v === "") continue;
      out[k] = /(_s|_level)$/.test(k) ? Number(v) : v;
    }
    if (out.targets) out.targets = String(out.targets).split(",").map(s => s.trim()).filter(Boolean);
    return out;
  }

  // A capture is accepted before the pipeline creates its session: wait (up to 60 s) until
  // the session exists, so that following it opens its page and not a 404.
  async function appears(url) {
    const deadline = Date.now() + 60000;
    while (Date.now() < deadline) {
      const r = await fetch(url, {headers: {"Accept": "application/json"},
                                  credentials: "same-origin"});
      if (r.status !== 404) return;
      await new Promise(done => setTimeout(done, 500));
    }
  }

  function actions() {
    const status = document.querySelector("#actions .status");
    for (const form of document.querySelectorAll("form.action")) {
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const body = formBody(form);
        text(status, "sending…"); if (status) status.classList.remove("err");
        try {
          const out = await api(form.dataset.api, form.dataset.method || "POST", body);
          message(status, out.message || "done");
          if (form.dataset.reload) { window.location.reload(); return; }
          if (form.dataset.follow && body.session) {
            const name = encodeURIComponent(body.session);
            if (form.dataset.followApi) await appears(form.dataset.followApi + name);
            window.location.href = form.dataset.follow + name;
          }
        } catch (e) {
          message(status, e.message); if (status) status.classList.add("err");
        }
      });
    }
  }

  function sharing() {
    const out = document.querySelector("output.share-url");
    for (const b of document.querySelectorAll("button.share")) {
      b.addEventListener("click", async () => {
        const anyone = document.querySelector("input.share-anyone");
        try {
          const link = await api(b.dataset.api, "POST", {anyone: !!(anyone && anyone.checked)});
          text(out, link.url);
          if (out) out.dataset.url = link.url;
        } catch (e) { message(out, e.message); }
      });
    }
    for (const b of document.querySelectorAll("button.revoke")) {
      b.addEventListener("click", async () => {
        try { await api(b.dataset.api, "DELETE"); window.location.reload(); }
        catch (e) { b.textContent = e.message; }
      });
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    localTimes();
    setInterval(localTimes, 30000);
    for (const el of document.querySelectorAll("[data-poll]")) poll(el);
    actions();
    sharing();
  });
})();
