// Meridian's status page: log in with a token, or sign in through the identity provider
// (sso.js), the token kept in this tab's session storage and sent only in the Authorization
// header; then poll /v1/status and draw the fleet. Everything is built
// with DOM calls and textContent: nothing the fleet reports is ever parsed as HTML.
"use strict";

const POLL_MS = 2000;
const STALE_AFTER_MS = 10000;
const KEY = "meridian.token";
const VIA = "meridian.via"; // "sso" when the token is an ID token from the identity provider
const SVG = "http://www.w3.org/2000/svg";

let timer = null;
let lastOk = 0;
const history = []; // [time, {flowKey: count}] over the last minute, for rates

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function badge(state) { return el("span", { class: `badge ${state}` }, state.replace("_", " ")); }

function fixed(v, digits) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }

function ms(v) { return v ? `${Math.round(v)} ms` : "–"; }

function ago(iso) {
  if (!iso) return "never";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  return s < 90 ? `${Math.round(s)} s ago` : `${Math.round(s / 60)} min ago`;
}

// --- login -----------------------------------------------------------------------------

function showLogin(message) {
  stop();
  $("fleet").hidden = true;
  $("summary").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("token").focus();
}

async function login(event) {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  await start(token, "token");
}

async function start(token, via) {
  sessionStorage.setItem(KEY, token);
  sessionStorage.setItem(VIA, via);
  $("token").value = "";
  await poll();
  whoami(token);
}

async function whoami(token) {
  const answer = await fetch("/v1/auth/whoami", { headers: { Authorization: `Bearer ${token}` } })
    .catch(() => null);
  if (!answer || !answer.ok) return;
  const me = await answer.json();
  $("whoami").textContent = `${me.name.replace(/^oidc:/, "")} · ${me.role}`;
  $("whoami").dataset.role = me.role;
}

function logout() {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(VIA);
  $("whoami").textContent = "";
  showLogin("");
}

// The identity provider's button, when the control plane names one.
async function offerSso() {
  const config = await ssoConfig();
  if (!config) return;
  $("sso").hidden = false;
  $("sso").addEventListener("click", () => ssoBegin(config));
}

function stop() { if (timer !== null) { clearTimeout(timer); timer = null; } }

// --- polling ---------------------------------------------------------------------------

async function poll() {
  stop();
  const token = sessionStorage.getItem(KEY);
  if (!token) { showLogin(""); return; }
  let answer;
  try {
    answer = await fetch("/v1/status", {
      headers: { Authorization: `Bearer ${token}`, Accept: "application/json" },
      cache: "no-store",
    });
  } catch (error) {
    stale(`the control plane cannot be reached: ${error.message}`);
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  if (answer.status === 401 || answer.status === 403) {
    const sso = sessionStorage.getItem(VIA) === "sso";
    logout();
    const problem = await answer.json().catch(() => ({}));
    const who = sso ? "You are signed in, but" : "That token";
    showLogin(answer.status === 401
      ? (sso ? `The sign-in has ended: ${problem.detail || "sign in again"}.` : "That token is not valid.")
      : `${who} may not view the fleet: ${problem.detail || "it needs viewer or above"}.`);
    return;
  }
  if (!answer.ok) {
    const problem = await answer.json().catch(() => ({}));
    stale(`the control plane answered ${answer.status}: ${problem.detail || answer.statusText}`);
  } else {
    lastOk = Date.now();
    render(await answer.json());
  }
  timer = setTimeout(poll, POLL_MS);
}

function stale(message) {
  if (lastOk && Date.now() - lastOk > STALE_AFTER_MS) {
    $("stale").hidden = false;
    $("stale").textContent = `Not current: ${message}. Showing what was seen ${ago(new Date(lastOk).toISOString())}.`;
    $("live").classList.add("stale");
  }
}

// --- drawing ---------------------------------------------------------------------------

function render(doc) {
  $("login").hidden = true;
  $("fleet").hidden = false;
  $("summary").hidden = false;
  $("stale").hidden = true;
  $("live").classList.remove("stale");
  $("revision").textContent = doc.revision;
  $("updated").textContent = `updated ${new Date(doc.generated_at).toLocaleTimeString()}`;
  rollout(doc.rollouts);
  planner(doc.planner || { decisions: [] });
  quotas(doc.quotas || []);
  spend(doc.spend || []);
  quality(doc.quality || { models: {}, events: [] });
  tiers(doc.tiers || []);
  classes(doc.classes || []);
  adapters(doc.adapters || []);
  batches(doc.batches || []);
  $("regions").replaceChildren(...doc.regions.map((r) => region(r, doc.revision)));
  flows(doc.regions, doc.flows);
  receipts(doc.receipts);
}

function rollout(doc) {
  // declared and in force, side by side; the newest rollout's waves and its checks' figures
  const force = doc.in_force;
  $("in-force").textContent = `declared intent ${doc.declared_intent ?? "–"} · in force ` +
    `${force.intent ?? "–"}: ${force.why}`;
  const r = doc.rollout;
  if (!r) { $("rollout-body").replaceChildren(el("p", { class: "hint" }, "no change has rolled out yet")); return; }
  const holds = {};
  for (const t of doc.targets) {
    holds[`region:${t.region}`] = t.holds;
    for (const n of t.nodes) holds[`node:${n.name}`] = n.holds;
  }
  const waves = r.waves.map((w, i) => el("li", { class: `wave ${w.status.replace(" ", "_")}`,
    "data-wave": i, "data-status": w.status },
    el("b", {}, w.name), ` · bake ${w.bake_s} s · `, badge(w.status),
    el("span", { class: "hint" }, " holds " +
      w.targets.map((t) => `${t.split(":")[1]} ${holds[t] ?? "–"}`).join(", "))));
  const checks = (r.checks || []).map((c) => el("tr", { "data-check": c.check, "data-verdict": c.verdict },
    el("td", {}, c.check), el("td", {}, c.model || ""),
    el("td", {}, el("span", { class: `badge verdict ${c.verdict}` }, c.verdict)),
    el("td", { class: "why" }, c.figure)));
  // replaceChildren writes a null as the text "null": the parts left out are dropped first
  $("rollout-body").replaceChildren(...[
    el("div", { class: "rollout-head", "data-state": r.state },
      el("b", {}, `revision ${r.revision}`), ` from ${r.base} by ${r.actor} · `, badge(r.state),
      r.reason ? el("span", { class: "why" }, ` ${r.reason}`) : null),
    waves.length ? el("ol", { class: "waves" }, waves) : null,
    checks.length ? el("table", { class: "checks" }, el("tbody", {}, checks)) : null,
    doc.recent.length ? el("p", { class: "hint" }, "before: " + doc.recent.map((x) =>
      `${x.revision} ${x.state}`).join(" · ")) : null].filter((part) => part !== null));
}

function planner(doc) {
  // engines now and planned per deployment, the demand behind them and why
  $("planner-state").textContent = doc.last_run_at
    ? `Last planned ${ago(doc.last_run_at)}${doc.paused ? "; paused: its plans are advice" : ""}.`
    : "It has not planned yet.";
  const rows = doc.decisions.map((d) => el("tr", { "data-deployment": d.deployment,
    "data-engines": d.engines, "data-planned": d.target,
    class: d.target !== d.engines && !d.taken ? "alert" : "" },
    el("td", {}, d.deployment), el("td", {}, d.region),
    el("td", {}, d.rate_rps == null ? "–" : fixed(d.rate_rps, 1)),
    el("td", {}, fixed(d.forecast_rps, 1)), el("td", {}, d.engines),
    el("td", {}, d.taken || d.target === d.engines ? `${d.target}` : `${d.target} (held)`),
    el("td", {}, fixed(d.cost_per_hour ?? 0, 2)),
    el("td", { class: "why" }, d.reason)));
  $("planner").querySelector("tbody").replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 8, class: "hint" }, "no deployment has autoscale"))]));
}

function quotas(items) {
  // requests and tokens side by side: "600 req · 30000 tok"
  const pair = (x) => [x.requests_per_minute == null ? null : `${fixed(x.requests_per_minute, 0)} req`,
    x.tokens_per_minute == null ? null : `${fixed(x.tokens_per_minute, 0)} tok`]
    .filter((v) => v !== null).join(" · ") || "–";
  const rows = items.map((q) => el("tr", { "data-tenant": q.tenant },
    el("td", {}, q.tenant),
    el("td", {}, pair(q.quota)),
    el("td", {}, pair(q.admitted)),
    el("td", { class: "why" }, Object.entries(q.admitted.regions).map(([r, x]) => `${r} ${pair(x)}`).join("; ") || "–"),
    el("td", { class: "why" }, q.leases.map((l) => `${l.node} ${pair(l)}`).join("; ") || "static shares"),
    el("td", { class: "why" }, Object.entries(q.refused_per_minute.by_reason)
      .map(([why, n]) => `${why} ${fixed(n, 1)}`).join("; ") || "none")));
  $("quotas").querySelector("tbody").replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 6, class: "hint" }, "no tenant has a quota"))]));
}

function spend(items) {
  // a budget: "daily 2026-11-28: 7.50 of 10.00 (75%, past its soft threshold)"
  const budget = (b) => `${b.name} ${b.window}: ${fixed(b.used, 2)} of ${fixed(b.limit, 2)}`
    + ` (${fixed(100 * b.used / b.limit, 0)}%${b.soft ? ", past its soft threshold" : ""})`;
  const rows = items.map((s) => el("tr", { "data-tenant": s.tenant },
    el("td", {}, s.tenant),
    el("td", {}, fixed(s.today, 2)),
    el("td", {}, fixed(s.month, 2)),
    el("td", { class: "why" }, s.budgets.map(budget).join("; ") || "none")));
  $("spend").querySelector("tbody").replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 4, class: "hint" }, "nothing spent this month"))]));
}

function quality(doc) {
  // one row per model and region; what put a worker out of rotation, with its figure
  const rows = [];
  for (const [name, m] of Object.entries(doc.models)) {
    for (const [region, r] of Object.entries(m.regions)) {
      const findings = m.flagged.filter((f) => f.region === region);
      const flagged = Object.entries(r.flagged_share).filter(([, v]) => v > 0)
        .map(([check, v]) => `${check} ${fixed(v * 100, 1)}%`).join(", ") || "none";
      rows.push(el("tr", { "data-model": name, "data-quality-region": region,
        "data-flagged": findings.length ? "1" : "0", class: findings.length ? "alert" : "" },
        el("td", {}, name), el("td", {}, region), el("td", {}, r.answers),
        el("td", { class: "why" }, flagged),
        el("td", { class: "why" }, r.canaries.map((c) => `${c.name} ${fixed(c.score, 3)}`).join(", ") || "–"),
        el("td", { class: "why" }, r.held.map((h) => `${h.worker} ${h.kind}: ${h.check} ` +
          `${fixed(h.figure, 3)} vs ${fixed(h.peers_figure, 3)}`).join("; ") || "none"),
        el("td", { class: "why" }, findings.map((f) => f.figure === null ? `${f.check}: differs`
          : `${f.check} ${fixed(f.figure, 3)} vs ${fixed(f.peers_figure, 3)}`).join("; ") || "–")));
    }
  }
  $("quality").querySelector("tbody").replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 7, class: "hint" }, "no answers judged yet"))]));
  $("quality-events").replaceChildren(...doc.events.map((e) => el("li", { "data-kind": e.kind },
    `${new Date(e.logged_at).toLocaleTimeString()} · ${e.node} · ${e.worker} ${e.kind} (${e.model}): ` +
    `${e.check} ${fixed(e.figure, 3)} vs ${fixed(e.peers_figure, 3)}` +
    ((e.examples || []).length ? ` · e.g. ${e.examples.join(", ")}` : ""))));
}

function tiers(items) {
  // each tier's share of the route's requests, and why; moves under load; cascades
  const share = (n, of) => `${fixed(100 * n / Math.max(1, of), 0)}%`;
  const rows = items.map((t) => {
    const by = {};
    for (const a of t.answered) (by[a.model] ??= []).push(a);
    const answered = Object.entries(by).map(([model, list]) => {
      const n = list.reduce((s, a) => s + a.count, 0);
      return `${model} ${share(n, t.requests)} (` + list.map((a) => `${a.why} ${a.count}`).join(", ") + ")";
    }).join("; ");
    const moved = t.moved.filter((m) => m.why === "capacity");
    const cascades = Object.entries(t.cascades);
    return el("tr", { "data-route": t.route, "data-tier-region": t.region },
      el("td", {}, t.route), el("td", {}, t.region), el("td", {}, t.requests),
      el("td", { class: "why" }, answered || "–"),
      el("td", { class: "why" }, moved.map((m) => `${m.from} → ${m.to} ${m.count}`).join("; ") || "none"),
      el("td", { class: "why" }, cascades.map(([signal, n]) => `${signal} ${n}`).join("; ") || "none"));
  });
  $("tiers").querySelector("tbody").replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 6, class: "hint" }, "no tiered route has answered yet"))]));
}

function classes(items) {
  // per region, model and class: what became of its requests, and the admitted ones' wait
  const rows = items.map((c) => el("tr", { "data-class": c.class, "data-class-region": c.region },
    el("td", {}, c.region), el("td", {}, c.model), el("td", {}, c.class),
    el("td", {}, c.admitted), el("td", {}, c.shed), el("td", {}, c.preempted),
    el("td", {}, c.requeued), el("td", {}, c.escalated), el("td", {}, c.refused),
    el("td", {}, c.past_slo ?? 0),
    el("td", {}, c.wait_p99_s === null ? "–" : `${fixed(1000 * c.wait_p99_s, 0)} ms`)));
  $("classes").querySelector("tbody").replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 11, class: "hint" }, "no request answered yet"))]));
}

function adapters(items) {
  // per adapter and region: where it is held, its demand, its cold loads and their time
  const rows = items.map((a) => el("tr", { "data-adapter": a.adapter, "data-adapter-region": a.region },
    el("td", {}, a.adapter), el("td", {}, a.region),
    el("td", { class: "why" }, a.engines.length ? `${a.engines.length}: ${a.engines.join(", ")}` : "none"),
    el("td", {}, fixed(a.requests_per_second, 2)), el("td", {}, a.requests),
    el("td", {}, a.cold_loads),
    el("td", {}, a.cold_load_ms === null ? "–" : `${a.cold_load_ms} ms`), el("td", {}, a.failures)));
  $("adapters").querySelector("tbody").replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 8, class: "hint" }, "no adapter registered"))]));
}

function batches(items) {
  const rows = items.map((b) => el("tr", { "data-batch": b.id },
    el("td", {}, b.id), el("td", {}, b.tenant), el("td", {}, b.status), el("td", {}, b.total),
    el("td", {}, b.completed), el("td", {}, b.failed), el("td", {}, b.pending),
    el("td", { class: "why" }, Object.entries(b.running).map(([r, n]) => `${r} ${n}`).join(", ") || "–")));
  $("batches").querySelector("tbody").replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: 8, class: "hint" }, "no batch yet"))]));
}

function region(r, declared) {
  const load = r.load || {};
  const ttft = load.ttft_ms || {};
  const stat = (value, label) => el("div", { class: "stat" }, el("b", {}, value), el("span", {}, label));
  let acked = r.revision === null ? "no agent has been sent a revision yet"
    : `in force: revision ${r.revision}, acked by ${r.acked} of ${r.agents} agent(s)`;
  if (r.revision !== null && r.revision < declared) {
    // a region's snapshot is replaced only when what it runs changes
    acked += ` · revisions after ${r.revision} (to ${declared}) changed nothing it runs`;
  }
  return el("article", { class: "card region", "data-region": r.name, "data-health": r.health },
    el("div", { class: "region-head" }, el("h3", {}, r.name), badge(r.health)),
    el("div", { class: "meta" },
      `${r.cloud} (${r.provider}) · ${r.geography} · jurisdiction ${r.jurisdiction}` +
      (r.state !== "active" ? ` · ${r.state}` : "")),
    el("div", { class: "acks", "data-acked": `${r.acked}/${r.agents}` }, acked),
    r.nacks.length ? el("ul", { class: "nacks" },
      r.nacks.map((n) => el("li", {}, `${n.node} refused ${n.reason}`))) : null,
    el("div", { class: "stats" },
      stat(fixed(load.answers_per_second, 1), "answers/s, refusals too"),
      stat(fixed(load.requests_per_second, 1), "served by engines/s"),
      stat(load.inflight_requests ?? "–", "in flight"),
      stat(load.queued_requests ?? "–", "queued"),
      stat(ms(ttft.p50), "TTFT p50"),
      stat(ms(ttft.p99), "TTFT p99"),
      stat(load.prefix_cache_hit_rate === undefined ? "–"
        : `${Math.round(load.prefix_cache_hit_rate * 100)}%`, "prefix-cache hits")),
    (load.models || []).length ? el("ul", { class: "models" }, load.models.map(model)) : null,
    r.nodes.length ? r.nodes.map(node) : el("p", { class: "hint" }, "no nodes registered"));
}

function model(m) {
  // what the gateways answered for the model lately: refusals and errors by their code
  const codes = Object.entries(m.by_code || {}).filter(([code]) => code !== "ok")
    .map(([code, rate]) => `${code} ${fixed(rate, 1)}/s`);
  const share = `${Math.round((m.failed_share || 0) * 100)}% refused or failed`;
  return el("li", { class: m.alert ? "model alert" : "model", "data-model": m.model || "",
    "data-alert": m.alert ? "1" : "0" },
    el("b", {}, m.model || "(no model named)"),
    ` · ${fixed(m.answers_per_second, 1)} answers/s · ${share}`,
    codes.length ? ` (${codes.join(", ")})` : "",
    ` · ${m.engines_ready} engine(s) ready`,
    m.alert ? el("span", { class: "badge down", title: m.alert }, "refusing") : null);
}

function node(n) {
  const gpus = n.gpus.map((g) => {
    const share = g.used_gb && g.memory_gb ? Math.min(100, (100 * g.used_gb) / g.memory_gb) : 0;
    const bar = el("i");
    bar.style.width = `${share}%`;
    return el("span", { class: "gpu", title: `${g.model}: ${fixed(g.used_gb, 1)} of ${g.memory_gb} GB` },
      `GPU ${g.index} · ${g.memory_gb ?? "?"} GB`, bar);
  });
  const rows = n.engines.map((e) =>
    el("tr", { "data-engine": e.id, "data-state": e.state },
      el("td", {}, e.id),
      el("td", {}, e.state === "draining"  // taking no new request: what it runs is left
        ? el("span", { class: "badge draining" }, `draining · ${e.inflight + e.queued} left`)
        : badge(e.state),
        // the gateway no longer sends it requests: it failed them (the engine may look well)
        e.breaker && e.breaker !== "closed"
          ? el("span", { class: `badge breaker ${e.breaker}`, title: "the gateway's circuit breaker" },
            `breaker ${e.breaker.replace("_", " ")}`) : null),
      el("td", {}, `${e.inflight} running, ${e.queued} queued`),
      el("td", { class: "why" }, [
        e.restarts ? `restarted ${e.restarts} time${e.restarts > 1 ? "s" : ""}` : "",
        e.reason || ""].filter(Boolean).join(" · "))));
  return el("div", { class: "node", "data-node": n.name },
    el("div", { class: "node-head" }, el("b", {}, n.name), badge(n.health),
      el("span", { class: "hint" },
        `applied revision ${n.applied_revision ?? "–"} · heartbeat ${ago(n.heartbeat_at)}`)),
    n.nack ? el("div", { class: "error" }, `refused ${n.nack}`) : null,
    el("div", { class: "gpus" }, gpus),
    rows.length ? el("table", { class: "engines" }, el("tbody", {}, rows))
      : el("p", { class: "hint" }, "no engines"));
}

function flows(regions, list) {
  const now = Date.now();
  const totals = {};
  for (const f of list) {
    const key = `${f.from}→${f.to}`;
    totals[key] = (totals[key] || 0) + f.count;
  }
  history.push([now, totals]);
  while (history.length > 1 && now - history[0][0] > 60000) history.shift();
  const [then, before] = history[0];
  const minutes = Math.max((now - then) / 60000, 1 / 60);

  const box = $("flows");
  box.replaceChildren();
  const defs = svg("defs");
  const marker = svg("marker", { id: "head", viewBox: "0 0 10 10", refX: "9", refY: "5",
    markerWidth: "6", markerHeight: "6", orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M0 0L10 5L0 10z", fill: "#2f6fdf" }));
  defs.append(marker);
  box.append(defs);
  const W = 640, H = 300, R = 34;
  const at = {};
  regions.forEach((r, i) => {
    const angle = (2 * Math.PI * i) / regions.length - Math.PI / 2;
    at[r.name] = [W / 2 + 190 * Math.cos(angle) * (regions.length > 2 ? 1 : 1.2),
      H / 2 + 105 * Math.sin(angle)];
  });
  for (const [key, count] of Object.entries(totals)) {
    const [from, to] = key.split("→");
    if (!at[from] || !at[to]) continue;
    const [x1, y1] = at[from], [x2, y2] = at[to];
    const dx = x2 - x1, dy = y2 - y1, d = Math.hypot(dx, dy) || 1;
    const nx = -dy / d, ny = dx / d; // bend to the side, so that A→B and B→A both show
    const sx = x1 + (dx * R) / d, sy = y1 + (dy * R) / d;
    const ex = x2 - (dx * (R + 4)) / d, ey = y2 - (dy * (R + 4)) / d;
    const cx = (x1 + x2) / 2 + nx * 40, cy = (y1 + y2) / 2 + ny * 40;
    const width = 1.5 + Math.min(8, Math.log10(1 + count) * 3);
    const path = svg("path", { class: "arrow", d: `M${sx} ${sy}Q${cx} ${cy} ${ex} ${ey}`,
      "stroke-width": width, "marker-end": "url(#head)", "data-flow": key });
    path.append(svg("title", {}, `${key}: ${count} request(s)`));
    box.append(path);
    const rate = (count - (before[key] || 0)) / minutes;
    // the label sits beside the curve's midpoint, on its outer side
    const mx = (sx + 2 * cx + ex) / 4 + nx * 14, my = (sy + 2 * cy + ey) / 4 + ny * 14 + 4;
    box.append(svg("text", { class: "label", x: mx, y: my, "text-anchor": "middle" },
      `${count} sent · ${rate.toFixed(0)} a minute now`));
  }
  for (const r of regions) {
    const [x, y] = at[r.name];
    box.append(svg("circle", { class: `place ${r.health}`, cx: x, cy: y, r: R }));
    box.append(svg("text", { x, y: y + 4, "text-anchor": "middle" }, r.name));
  }
  $("flow-list").replaceChildren(...(list.length ? list.map((f) =>
    el("li", {}, `${f.from} → ${f.to}: ${f.count} on ${f.reason}`))
    : [el("li", { class: "hint" }, "no request has escalated")]));
}

function receipts(list) {
  const rows = list.map((r) => el("tr", { class: r.status >= 400 ? "err" : "" },
    el("td", {}, new Date(r.at).toLocaleTimeString()),
    el("td", {}, r.came_from ? `${r.region} (from ${r.came_from})` : r.region),
    el("td", {}, r.tenant), el("td", {}, r.model),
    el("td", { class: "status" }, r.status),
    el("td", {}, r.served_by || "–"), el("td", {}, r.policy || "–"),
    el("td", { class: "why" }, r.reason || ""),
    el("td", {}, ms(r.ttft_ms)), el("td", {}, ms(r.duration_ms))));
  $("receipts").tBodies[0].replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colSpan: 10, class: "hint" }, "no requests yet"))]));
}

document.addEventListener("DOMContentLoaded", async () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  await offerSso();
  let token = null;
  try {
    token = await ssoFinish();
  } catch (error) {
    showLogin(`The sign-in failed: ${error.message}.`);
    return;
  }
  if (token) { await start(token, "sso"); return; }
  const kept = sessionStorage.getItem(KEY);
  await poll();
  if (kept) whoami(kept);
});
