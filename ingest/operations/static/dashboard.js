// The Gristmill dashboard: asks for an admin key, keeps it in sessionStorage (this tab
// only), and polls /dashboard/data with it once a second. Plain DOM and SVG; every
// value is written with textContent, never as HTML.
"use strict";

const POLL_MS = 1000;      // the page's step: the processes publish once a second
const HISTORY = 120;       // points kept for the throughput chart (two minutes)
const KEY = "gristmill.adminKey";
const history = [];
let timer = null;

const $ = (id) => document.getElementById(id);
const rate = (v) => (v == null ? "-" : v >= 100 ? v.toFixed(0) : v.toFixed(1));
const count = (v) => (v == null ? "-" : String(Math.round(v)));
const ms = (s) => (s == null ? "-" : (s * 1000 >= 100 ? (s * 1000).toFixed(0) : (s * 1000).toFixed(1)));
const sum = (o) => Object.values(o || {}).reduce((a, b) => a + b, 0);

function showLogin(message) {
  if (timer) { clearTimeout(timer); timer = null; }
  $("board").hidden = true;
  $("forget").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("status").textContent = "not connected";
  $("key").focus();
}

function row(tbody, cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = c;
    tr.appendChild(td);
  }
  tbody.appendChild(tr);
  return tr;
}

function bar(fraction) {
  const d = document.createElement("div");
  d.className = "bar";
  d.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
  return d;
}

function fill(id, rows) {
  const tbody = $(id).tBodies[0];
  tbody.replaceChildren();
  for (const cells of rows) row(tbody, cells);
}

const SVG = "http://www.w3.org/2000/svg";
function chart() {
  const svg = $("spark");
  svg.replaceChildren();
  const w = 600, h = 90;
  const series = ["answered", "finished", "refused"];
  const top = Math.max(1, ...history.flatMap((p) => series.map((s) => p[s])));
  for (const s of series) {
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("class", s);
    const pts = history.map((p, i) => {
      const x = (w * (HISTORY - history.length + i)) / (HISTORY - 1);
      return `${x.toFixed(1)},${(h - 4 - ((h - 14) * p[s]) / top).toFixed(1)}`;
    });
    line.setAttribute("points", pts.join(" "));
    svg.appendChild(line);
  }
  $("spark-top").textContent = `top of the chart: ${rate(top)}/s`;
}

function render(d) {
  const t = d.throughput;
  const refusedRate = d.refusals.reduce((a, r) => a + r.per_s, 0);
  const refusedTotal = d.refusals.reduce((a, r) => a + r.total, 0);
  $("window").textContent = `(rates over the last ${d.window_s.toFixed(0)} s)`;
  $("answered-rate").textContent = rate(t.answered_per_s);
  $("finished-rate").textContent = rate(sum(t.finished_per_s));
  $("admitted-rate").textContent = rate(t.admitted_per_s);
  $("refused-rate").textContent = rate(refusedRate);
  $("answered-total").textContent = count(t.answered);
  $("finished-total").textContent = count(sum(t.finished));
  $("refused-total").textContent = count(refusedTotal);
  $("inflight").textContent = count(d.inflight);

  history.push({ answered: t.answered_per_s, finished: sum(t.finished_per_s), refused: refusedRate });
  while (history.length > HISTORY) history.shift();
  chart();

  const worst = Math.max(1e-3, ...d.latency.map((l) => l.p95 || 0));
  fill("latency", d.latency.map((l) => [l.stage, rate(l.per_s), ms(l.p50), ms(l.p95), ms(l.p99), bar((l.p95 || 0) / worst)]));
  for (const [i, l] of d.latency.entries()) $("latency").tBodies[0].rows[i].dataset.stage = l.stage;

  fill("queues", d.queues.map((q) => [q.class, count(q.queued), count(q.lag), q.oldest_s.toFixed(2), q.paused ? "yes" : "no"]));

  fill("refusals", d.refusals.map((r) => [r.tier, r.code, r.reason || "-", rate(r.per_s), count(r.total)]));
  $("no-refusals").hidden = d.refusals.length > 0;

  $("worker-count").textContent = `(${count(d.workers_ready)} ready, ${count(d.workers_warming)} warming)`;
  fill("workers", d.workers.map((w) => [w.worker, `${(w.busy * 100).toFixed(0)}%`, bar(w.busy), count(w.in_flight),
    w.gpu_utilization == null ? "-" : `${(w.gpu_utilization * 100).toFixed(0)}%`]));

  fill("latency-jobs", d.latency_jobs.map((l) => [l.stage, rate(l.per_s), ms(l.p50), ms(l.p95), ms(l.p99)]));

  const j = d.jobs || { jobs: {}, items: {} };
  $("jobs-running").textContent = count(j.jobs.running);
  $("jobs-queued").textContent = count(j.jobs.queued);
  $("items-queued").textContent = count(j.items.queued);
  $("items-done").textContent = count(sum(j.items) - (j.items.queued || 0));
  fill("coverage", (d.coverage || []).map((c) => [`${c.model}@${c.version}`, `${(c.coverage * 100).toFixed(1)}%`, bar(c.coverage)]));

  const p = d.processes;
  $("status").textContent = `${p.schedulers} scheduler(s), ${p.api} API process(es) · updated ${new Date(d.at * 1000).toLocaleTimeString()}`;
  document.body.dataset.updated = String(d.at);
}

async function poll() {
  timer = null;
  const key = sessionStorage.getItem(KEY);
  if (!key) { showLogin(); return; }
  try {
    const r = await fetch("/dashboard/data", { headers: { Authorization: `Bearer ${key}` }, cache: "no-store" });
    if (r.status === 401 || r.status === 403) {
      sessionStorage.removeItem(KEY);
      const body = await r.json().catch(() => ({}));
      showLogin(`${r.status}: ${(body.error && body.error.message) || body.detail || "refused"}`);
      return;
    }
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
    $("login").hidden = true;
    $("board").hidden = false;
    $("forget").hidden = false;
  } catch (e) {
    $("status").textContent = `retrying: ${e.message}`;
  }
  timer = setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = $("key").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY, key);
    $("key").value = "";
    poll();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    showLogin();
  });
  poll();
});
