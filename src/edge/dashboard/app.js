// sluice dashboard: the one script. It only reads (/ui/live.json, same origin) and redraws
// the live view's numbers and bars every two seconds; every page reads the same without it.
"use strict";

// The classes of a second's stacked parts, bottom to top (as html.rs draws them).
const PARTS = ["allowed", "limited", "failure"];
// The live view's counts, as its cells' data-field names end (as pages.rs writes them).
const FIELDS = ["allowed", "limited", "failure_admitted", "failure_refused", "shadow"];

function bars(seconds) {
  const top = Math.max(1, ...seconds.map((s) => s.reduce((a, b) => a + b, 0)));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "bars");
  svg.setAttribute("viewBox", "0 0 " + Math.max(1, seconds.length) + " 30");
  svg.setAttribute("preserveAspectRatio", "none");
  seconds.forEach((s, x) => {
    let bottom = 30;
    PARTS.forEach((cls, i) => {
      if (!(s[i] > 0)) return;
      const h = Math.max(1, (s[i] * 30) / top);
      bottom -= h;
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("class", cls);
      r.setAttribute("x", x); r.setAttribute("y", bottom);
      r.setAttribute("width", 1); r.setAttribute("height", h);
      svg.appendChild(r);
    });
  });
  return svg;
}

function said(text) {
  const updated = document.getElementById("updated");
  if (updated) updated.textContent = text;
}

async function refreshLive() {
  const table = document.getElementById("live");
  if (!table) return;
  const response = await fetch("/ui/live.json", { credentials: "same-origin", cache: "no-store" });
  if (!response.ok) {
    said(response.status === 401 ? "signed out: sign in again at /ui/login" : "not refreshed (" + response.status + ")");
    return;
  }
  const live = await response.json();
  let unseen = 0;
  for (const series of live.series) {
    const row = table.querySelector('tr[data-series="' + CSS.escape(series.route + "/" + series.limit) + '"]');
    if (!row) { unseen += 1; continue; }
    for (const field of FIELDS) {
      row.querySelector('[data-field="minute_' + field + '"]').textContent = series.last_minute[field];
      row.querySelector('[data-field="total_' + field + '"]').textContent = series.totals[field];
    }
    row.querySelector('[data-field="bars"]').replaceChildren(bars(series.seconds));
  }
  const more = unseen > 0 ? "; a reload added limits: reload the page to see them" : "";
  said("updated " + new Date().toLocaleTimeString() + " (sample " + live.samples + ")" + more);
}

function refresh() {
  refreshLive().catch((error) => {
    console.error("sluice dashboard: the live view was not refreshed", error);
    said("not refreshed: " + error);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  if (document.getElementById("live")) {
    refresh();
    setInterval(refresh, 2000);
  }
});
