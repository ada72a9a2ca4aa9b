// The fleet dashboard: polls gateway/fleet once a second, fills the tiles and the replica table, and draws
// three small canvas charts from the kept points (traffic per replica, latency, desired vs ready replicas). No dependencies; served by the gateway itself.
"use strict";

const HISTORY_S = 120;
const COLORS = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#319795", "#975a16", "#4a5568"];
const points = [];
let since = null;
let frames = 0;

const $ = (id) => document.getElementById(id);
const esc = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const fmt = (v, digits = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));

function colorOf(urls, url) {
  return COLORS[urls.indexOf(url) % COLORS.length];
}

function niceCeiling(v) {
  if (!(v > 0)) return 1;
  const step = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= v) return m * step;
  return 10 * step;
}

// series: [{color, values: [[t, v], ...]}]; x spans the last HISTORY_S seconds up to tEnd.
function draw(canvas, series, tEnd) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 44, bottom = 18, top = 6, right = 8;
  ctx.clearRect(0, 0, w, h);
  let max = 0, drawn = 0;
  for (const s of series) for (const [, v] of s.values) if (v !== null && v > max) max = v;
  const yMax = niceCeiling(max);
  const x = (t) => left + (w - left - right) * (1 - (tEnd - t) / HISTORY_S);
  const y = (v) => top + (h - top - bottom) * (1 - v / yMax);
  ctx.font = "10px sans-serif";
  ctx.fillStyle = "#6b7480";
  ctx.strokeStyle = "#e6e9ee";
  ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4, yy = Math.round(y(v)) + 0.5;
    ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(w - right, yy); ctx.stroke();
    ctx.fillText(Number.isInteger(v) ? v.toFixed(0) : v.toFixed(v >= 10 ? 1 : 2), 4, yy + 3);
  }
  for (let s = 0; s <= HISTORY_S; s += 30) ctx.fillText(s ? `-${s}s` : "now", x(tEnd - s) - 10, h - 4);
  ctx.lineWidth = 1.5;
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.beginPath();
    let pen = false;
    for (const [t, v] of s.values) {
      if (v === null || tEnd - t > HISTORY_S) { pen = false; continue; }
      if (pen) ctx.lineTo(x(t), y(v)); else ctx.moveTo(x(t), y(v));
      pen = true;
      drawn++;
    }
    ctx.stroke();
  }
  canvas.dataset.points = String(drawn);
}

function row(r, urls) {
  const tr = document.createElement("tr");
  tr.dataset.url = r.url;
  const stale = r.report_age_s === null || r.report_age_s > 5 ? " stale" : "";
  const gpu = r.reported_gpu_utilization === null ? "–" : `${Math.round(100 * r.reported_gpu_utilization)}%`
    + (r.reported_gpu_throttled ? " (throttled)" : "");
  const ejected = r.ejected_remaining_s ? ` (out ${fmt(r.ejected_remaining_s, 0)} s)` : "";
  const cells = [
    `<span class="swatch" style="background:${colorOf(urls, r.url)}"></span>${esc(r.url)}`,
    `<span class="state-${esc(r.state)}">${esc(r.state)}</span>${r.slow_start ? " (slow start)" : ""}`,
    `<span class="bar" style="width:${Math.round(60 * r.share)}px;background:${colorOf(urls, r.url)}"></span>`
      + `${fmt(100 * r.share, 0)}%`,
    fmt(r.rps), fmt(r.p50_ms, 2), fmt(r.p99_ms, 2), fmt(r.error_rps), String(r.pending),
    `<span class="${stale}">${fmt(r.reported_queue_depth, 0)}</span>`,
    `<span class="${stale}">${fmt(r.reported_inflight, 0)}</span>`,
    `<span class="${stale}">${gpu}</span>`,
    `${fmt(r.ejections, 0)}${ejected}`,
  ];
  tr.innerHTML = cells.map((c) => `<td>${c}</td>`).join("");
  return tr;
}

function render(body) {
  const f = body.frame;
  for (const p of body.points) points.push(p);
  while (points.length && f.t - points[0].t > HISTORY_S) points.shift();
  if (points.length) since = points[points.length - 1].t;
  const fl = f.fleet;
  $("policy").textContent = `policy ${f.policy}`;
  $("panic").hidden = !f.panic;
  $("rps").textContent = fmt(fl.rps);
  $("p50").textContent = fl.p50_ms === null ? "–" : `${fmt(fl.p50_ms, 2)} ms`;
  $("p99").textContent = fl.p99_ms === null ? "–" : `${fmt(fl.p99_ms, 2)} ms`;
  $("errors").textContent = fmt(fl.error_rps);
  $("retries").textContent = fmt(fl.retries_ps);
  $("hedges").textContent = `${fmt(fl.hedges_won_ps)} / ${fmt(fl.hedges_lost_ps)}`;
  $("rejected").textContent = fmt(fl.rejected_ps);
  const a = f.autoscale;
  let scaling = a.mode === "off" ? `off / ${a.actual}` : `${a.desired ?? "–"} / ${a.actual ?? "–"}`;
  if (a.starting) scaling += ` (+${a.starting} starting)`;
  if (a.draining) scaling += ` (${a.draining} draining)`;
  if (a.held) scaling += ` · ${a.held} held`;
  $("autoscale").textContent = scaling;
  const urls = f.replicas.map((r) => r.url).sort();
  $("replicas").replaceChildren(...f.replicas.map((r) => row(r, urls)));
  draw($("traffic"), urls.map((u) => ({color: colorOf(urls, u), values: points.map((p) => [p.t, p.replicas[u] ?? null])})), f.t);
  draw($("latency"), [
    {color: "#2b6cb0", values: points.map((p) => [p.t, p.p50_ms])},
    {color: "#c05621", values: points.map((p) => [p.t, p.p99_ms])},
  ], f.t);
  draw($("scaling"), [
    {color: "#6b46c1", values: points.map((p) => [p.t, p.desired ?? null])},
    {color: "#2f855a", values: points.map((p) => [p.t, p.actual ?? null])},
  ], f.t);
  const when = new Date(f.t * 1000).toLocaleTimeString();
  $("status").textContent = `updated ${when} · rates and quantiles over ${fmt(f.window_s, 0)} s · gateway pid ${f.pid}`;
  $("note").textContent = `${f.active_requests} request(s) in flight at the gateway; queue, in-flight and GPU are `
    + "what each replica last reported (grey: older than 5 s).";
  frames++;
  document.body.dataset.frames = String(frames);
  if (frames === 1) document.body.dataset.renderedAt = String(Math.round(performance.now()));
}

async function poll() {
  try {
    const url = since === null ? "gateway/fleet" : `gateway/fleet?since=${since}`;
    const response = await fetch(url, {cache: "no-store"});
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
  } catch (err) {
    $("status").textContent = `gateway unreachable (${err.message}); retrying`;
  }
  setTimeout(poll, 1000);
}

poll();
