// The evo dashboard page: hash routes, one view per route, drawn from the server's JSON.
// Live: every poll asks the run for its version (generations done, status) and redraws the open
// view in place (Plotly.react, table bodies) when it changed; the page never reloads.
"use strict";

const TABS = [
  ["leaderboard", "Leaderboard"], ["fitness", "Fitness"], ["lineage", "Lineage"],
  ["schedule", "Hyperparameter schedule"], ["parallel", "Parallel coordinates"], ["mutations", "Mutation effects"],
];
const PLOT_CONFIG = { displaylogo: false, responsive: true };
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
  "#4f46e5", "#65a30d", "#0d9488", "#b91c1c", "#7c3aed", "#c2410c", "#0369a1", "#a16207"];
const KIND_COLOURS = { no_mutation: "#9ca3af", architecture: "#2563eb", parameters: "#ea580c", activation: "#9333ea",
  rl_hp: "#16a34a" };

const state = { config: { poll_ms: 1500 }, route: null, version: null, view: null, lb: { sort: null, dir: 1, filter: "", all: false } };

// ---- small helpers ------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
const main = () => document.getElementById("main");
const enc = encodeURIComponent;
const runUrl = (run, tail) => `/api/runs/${enc(run)}/${tail}`;
const memberHash = (run, m) => `#/run/${enc(run)}/member/${m}`;

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
  if (Array.isArray(v)) return "[" + v.map(fmt).join(",") + "]";
  return String(v);
}
function when(seconds) {
  if (!seconds) return "–";
  const d = new Date(seconds * 1000);
  return d.toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}
async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}
function memberLink(run, m) {
  return m === null || m === undefined ? "–" : el("a", { href: memberHash(run, m), "data-member": m }, String(m));
}
function statusBadge(s) { return el("span", { class: `status ${String(s).split(" ")[0]}` }, s); }
function plot(div, traces, layout) {
  return Plotly.react(div, traces, Object.assign({ margin: { l: 60, r: 20, t: 30, b: 45 }, hovermode: "closest",
    paper_bgcolor: "#fff", plot_bgcolor: "#fff", font: { size: 12 } }, layout), PLOT_CONFIG);
}
function onPointClick(div, fn) {
  if (div.dataset.clickBound) return;
  div.dataset.clickBound = "1";
  div.on("plotly_click", (ev) => { const p = ev.points && ev.points[0]; if (p && p.customdata !== undefined) fn(p.customdata); });
}
// a member's fitness (blue) and score (grey) over its evaluations, on one shared scale
function sparkline(fitness, scores) {
  const NS = "http://www.w3.org/2000/svg";
  const series = [[fitness.filter((v) => v !== null), "#2563eb"], [scores.filter((v) => v !== null), "#9ca3af"]];
  const all = series.flatMap(([ys]) => ys);
  const w = 90, h = 22, n = Math.max(...series.map(([ys]) => ys.length), 1);
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "spark"); svg.setAttribute("width", w); svg.setAttribute("height", h);
  const lo = Math.min(...all), hi = Math.max(...all), span = hi - lo || 1;
  const xy = (y, i) => [n === 1 ? w / 2 : (i / (n - 1)) * (w - 6) + 3, h - 3 - ((y - lo) / span) * (h - 6)];
  for (const [ys, colour] of series.reverse()) {
    if (ys.length === 1) {
      const dot = document.createElementNS(NS, "circle");
      const [x, y] = xy(ys[0], 0);
      dot.setAttribute("cx", x); dot.setAttribute("cy", y); dot.setAttribute("r", 2.5); dot.setAttribute("fill", colour);
      svg.append(dot);
    } else if (ys.length > 1) {
      const line = document.createElementNS(NS, "polyline");
      line.setAttribute("points", ys.map((y, i) => xy(y, i).join(",")).join(" "));
      line.setAttribute("fill", "none"); line.setAttribute("stroke", colour); line.setAttribute("stroke-width", "1.5");
      svg.append(line);
    }
  }
  const title = document.createElementNS(NS, "title");
  title.textContent = `fitness: ${fitness.map(fmt).join(" → ")}\nscore by generation: ${scores.map(fmt).join(" → ")}`;
  svg.append(title);
  return svg;
}
function downloadButton(run, member) {
  const q = member === undefined ? "" : `?member=${member}`;
  const label = member === undefined ? "Download elite export" : `Download member ${member} export`;
  return el("a", { class: "button", id: member === undefined ? "export-elite" : "export-member", href: runUrl(run, `export${q}`),
    download: "", title: "the same files `evo export` writes, as a zip" }, label);
}

// ---- routing --------------------------------------------------------------------------------------
function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] !== "run" || !parts[1]) return { view: "runs" };
  if (parts[2] === "member" && /^\d+$/.test(parts[3] || "")) return { view: "member", run: parts[1], member: Number(parts[3]) };
  const tab = TABS.some(([t]) => t === parts[2]) ? parts[2] : "leaderboard";
  return { view: tab, run: parts[1] };
}

function crumbs(route, summary) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren();
  nav.append(el("a", { href: "#/" }, "runs"));
  if (route.run) {
    nav.append(" / ", el("a", { href: `#/run/${enc(route.run)}` }, route.run));
    if (route.view === "member") nav.append(` / member ${route.member}`);
  }
  const live = document.getElementById("live");
  if (summary) {
    live.className = summary.status === "running" ? "live on" : "live";
    live.textContent = `${summary.status} · generation ${summary.generations_done}/${summary.generations ?? "?"} · checked ${new Date().toLocaleTimeString()}`;
  } else {
    live.className = "live on";
    live.textContent = `checked ${new Date().toLocaleTimeString()}`;
  }
}

async function show() {
  const route = parseRoute();
  state.route = route;
  state.version = null;
  const root = main();
  root.replaceChildren();
  if (route.view === "runs") {
    state.view = RunsView;
  } else {
    state.view = route.view === "member" ? MemberView : VIEWS[route.view];
    root.append(el("div", { id: "run-header" }), el("div", { id: "view" }));
  }
  await refresh(true);
}

async function refresh(first) {
  // the route and its view are read together: a poll still in flight when the user navigates must not
  // ask the new view to load the old route (that once requested members/undefined)
  const route = state.route;
  const view = state.view;
  try {
    if (route.view === "runs") {
      const runs = await getJSON("/api/runs");
      if (route !== state.route) return;
      RunsView.render(main(), runs, first);
      crumbs(route, null);
      return;
    }
    const version = await getJSON(runUrl(route.run, "version"));
    const key = JSON.stringify(version);
    if (!first && key === state.version) { crumbs(route, state.summary); return; }
    if (route !== state.route) return;
    const [summary, data] = await Promise.all([getJSON(runUrl(route.run, "summary")), view.load(route)]);
    if (route !== state.route) return;
    state.version = key;
    state.summary = summary;
    renderRunHeader(route, summary);
    view.render(document.getElementById("view"), data, route, first);
    crumbs(route, summary);
    document.body.dataset.generations = summary.generations_done;
  } catch (err) {
    if (route !== state.route) return;
    const view = document.getElementById("view") || main();
    view.replaceChildren(el("p", { class: "error" }, `could not load: ${err.message}`));
  }
}

function renderRunHeader(route, s) {
  const head = document.getElementById("run-header");
  head.replaceChildren(...[
    el("h1", {}, s.name, " ", statusBadge(s.status)),
    el("div", { class: "facts" },
      el("div", {}, el("span", {}, "generations"), el("b", { id: "fact-generations" }, `${s.generations_done} / ${s.generations ?? "?"}`)),
      el("div", {}, el("span", {}, "best score"), el("b", { id: "fact-best" }, fmt(s.best_score))),
      el("div", {}, el("span", {}, "population"), el("b", {}, fmt(s.population))),
      el("div", {}, el("span", {}, "agent"), el("b", {}, s.agent ?? "–")),
      el("div", {}, el("span", {}, "backend"), el("b", {}, s.backend ?? "–")),
      el("div", {}, el("span", {}, "started"), el("b", {}, when(s.created_at))),
      s.diversity ? el("div", {}, el("span", {}, "distinct members"), el("b", {}, `${s.diversity.distinct} / ${s.diversity.members}`)) : null,
      s.generations_done > 0 ? el("div", {}, downloadButton(route.run)) : null),
    s.error ? el("p", { class: "error" }, s.error) : null,
    el("nav", { class: "tabs" }, TABS.map(([t, label]) =>
      el("a", { href: `#/run/${enc(route.run)}/${t}`, class: route.view === t ? "active" : null, id: `tab-${t}` }, label))),
  ].filter(Boolean));
}

// ---- runs ---------------------------------------------------------------------------------------------
const RunsView = {
  render(root, runs, first) {
    if (first || !document.getElementById("runs")) {
      root.replaceChildren(el("h1", {}, "Runs"), el("p", { class: "note", id: "runs-dir" }, ""),
        el("div", { class: "scroll" }, el("table", { class: "grid", id: "runs" })));
    }
    document.getElementById("runs-dir").textContent = `${state.config.runs_dir} — ${runs.length} run(s); the list updates by itself`;
    const table = document.getElementById("runs");
    const head = el("tr", {}, ["run", "status", "generations", "best score", "population", "agent", "backend", "started", "updated"]
      .map((h) => el("th", {}, h)));
    const rows = runs.map((r) => {
      const pct = r.generations ? Math.min(100, (100 * r.generations_done) / r.generations) : 0;
      return el("tr", { "data-run": r.name },
        el("td", {}, el("a", { href: `#/run/${enc(r.name)}` }, r.name)),
        el("td", {}, statusBadge(r.status)),
        el("td", {}, `${r.generations_done ?? "–"} / ${r.generations ?? "?"}`, el("span", { class: "bar" }, el("i", { style: `width:${pct}%` }))),
        el("td", { class: "num" }, fmt(r.best_score)),
        el("td", { class: "num" }, fmt(r.population)),
        el("td", { class: "mono" }, r.agent ?? "–"),
        el("td", {}, r.backend ?? "–"),
        el("td", {}, when(r.created_at)),
        el("td", {}, when(r.updated_at)));
    });
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 9 }, "no runs yet"))));
  },
};

// ---- leaderboard --------------------------------------------------------------------------------------
function lbColumns(data) {
  const hp = state.lb.all ? Object.keys(data.rows[0]?.hparams || {}) : data.varying_hparams;
  const cols = [
    { key: "rank", label: "rank", num: true }, { key: "member", label: "member", num: true },
    { key: "score", label: "score", num: true }, { key: "score_std", label: "±", num: true },
    { key: "fitness", label: "fitness", num: true }, { key: "fitness_history", label: "history", sort: false },
    { key: "age", label: "age", num: true }, { key: "parent", label: "parent", num: true },
    { key: "last_mutation", label: "last mutation" },
  ];
  if (data.has_failures) cols.push({ key: "failures", label: "failures", num: true });
  for (const k of hp) cols.push({ key: `hp.${k}`, label: k, num: true, hp: k });
  cols.push({ key: "arch", label: state.lb.all ? "architecture" : "architecture (what differs)" });
  return cols;
}
function lbValue(r, key, data) {
  if (key.startsWith("hp.")) return r.hparams[key.slice(3)];
  if (key === "arch") {
    const keys = state.lb.all ? Object.keys(r.arch) : data.varying_arch;
    return keys.map((k) => `${k}=${fmt(r.arch[k])}`).join(" ") || "same for all";
  }
  return r[key];
}
function lbFilter(rows, data, text) {
  const tokens = text.trim().split(/\s+/).filter(Boolean);
  return rows.filter((r) => tokens.every((t) => {
    const m = t.match(/^([\w.]+)(>=|<=|>|<|=)(.+)$/);
    if (m) {
      const key = ["rank", "member", "score", "fitness", "age", "parent", "failures"].includes(m[1]) ? m[1] : `hp.${m[1]}`;
      const v = lbValue(r, key, data), want = Number(m[3]);
      if (typeof v !== "number" || Number.isNaN(want)) return String(v) === m[3];
      return { ">": v > want, "<": v < want, ">=": v >= want, "<=": v <= want, "=": v === want }[m[2]];
    }
    const text = [r.member, r.last_mutation, lbValue(r, "arch", data), ...Object.entries(r.hparams).map(([k, v]) => `${k}=${fmt(v)}`)]
      .join(" ").toLowerCase();
    return text.includes(t.toLowerCase());
  }));
}
const LeaderboardView = {
  load: (route) => getJSON(runUrl(route.run, "leaderboard")),
  render(root, data, route, first) {
    if (first) {
      root.replaceChildren(
        el("div", { class: "toolbar" },
          el("input", { type: "search", id: "lb-filter", placeholder: "filter: text, or lr>0.001 score>-0.3", value: state.lb.filter,
            oninput: (e) => { state.lb.filter = e.target.value; this.draw(route); } }),
          el("label", {}, el("input", { type: "checkbox", id: "lb-all", checked: state.lb.all,
            onchange: (e) => { state.lb.all = e.target.checked; this.draw(route); } }), " every hyperparameter"),
          el("a", { class: "button secondary", id: "lb-csv", href: runUrl(route.run, "leaderboard.csv"), download: "" }, "CSV"),
          el("span", { class: "note", id: "lb-count" })),
        el("p", { class: "note" }, "Generation's members, elite first. score: mean of the last evaluations (what selection ranks by); ",
          "fitness: the latest one. By default only the hyperparameters and architecture keys that differ between members are shown. ",
          "Click a header to sort."),
        el("div", { class: "scroll" }, el("table", { class: "grid", id: "leaderboard" })));
    }
    this.data = data;
    this.draw(route);
  },
  draw(route) {
    const data = this.data;
    const table = document.getElementById("leaderboard");
    if (!data.rows.length) { table.replaceChildren(el("tr", {}, el("td", {}, "no completed generation yet"))); return; }
    const cols = lbColumns(data);
    let rows = lbFilter(data.rows, data, state.lb.filter);
    if (state.lb.sort) {
      const col = cols.find((c) => c.key === state.lb.sort);
      if (col) {
        rows = [...rows].sort((a, b) => {
          const x = lbValue(a, col.key, data), y = lbValue(b, col.key, data);
          if (x === y) return 0;
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * state.lb.dir;
        });
      }
    }
    const head = el("tr", {}, cols.map((c) => el("th", {
      class: [c.sort === false ? "" : "sortable", state.lb.sort === c.key ? (state.lb.dir > 0 ? "sorted-asc" : "sorted-desc") : ""].join(" "),
      "data-key": c.key,
      onclick: c.sort === false ? null : () => {
        state.lb.dir = state.lb.sort === c.key ? -state.lb.dir : (c.num ? -1 : 1);
        state.lb.sort = c.key;
        this.draw(route);
      },
    }, c.label)));
    const body = rows.map((r) => el("tr", { class: r.rank === 1 ? "elite" : null, "data-member": r.member }, cols.map((c) => {
      const v = lbValue(r, c.key, data);
      if (c.key === "member") return el("td", { class: "num" }, memberLink(route.run, v));
      if (c.key === "parent") return el("td", { class: "num" }, memberLink(route.run, v));
      if (c.key === "fitness_history") return el("td", {}, sparkline(r.fitness_history, r.score_history.map((p) => p[1])));
      if (c.key === "arch" || c.key === "last_mutation") return el("td", { class: "wrap mono" }, v);
      return el("td", { class: c.num ? "num" : null, "data-key": c.key }, fmt(v));
    })));
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, body));
    document.getElementById("lb-count").textContent = `${rows.length} of ${data.rows.length} members · generation ${data.generation + 1}`;
  },
};

// ---- fitness over generations ------------------------------------------------------------------------------
const FitnessView = {
  load: (route) => getJSON(runUrl(route.run, "fitness")),
  render(root, data, route, first) {
    if (first) {
      root.replaceChildren(el("p", { class: "note" }, "Every evaluation as a point (coloured by the founder its lineage descends from), ",
        "the best score and the median fitness of each generation. Click a point to open the member."),
        el("div", { class: "card" }, el("div", { id: "fitness-chart", class: "chart" })),
        el("div", { class: "card", id: "diversity-card" }, el("div", { id: "diversity-chart", class: "chart" })));
    }
    const byLineage = {};
    for (const p of data.points) (byLineage[p.lineage] ||= []).push(p);
    const traces = Object.entries(byLineage).map(([root, pts], i) => ({
      type: "scatter", mode: "markers", name: `lineage of founder ${root}`,
      x: pts.map((p) => p.generation + (((p.member * 37) % 11) - 5) * 0.02), y: pts.map((p) => p.fitness),
      customdata: pts.map((p) => p.member), text: pts.map((p) => `member ${p.member}<br>generation ${p.generation}<br>score ${fmt(p.score)}`),
      hovertemplate: "%{text}<br>fitness %{y:.4g}<extra></extra>", marker: { size: 8, opacity: 0.8, color: PALETTE[i % PALETTE.length] },
    }));
    const g = data.generations;
    traces.push({ type: "scatter", mode: "lines+markers", name: "best score", x: g.map((r) => r.generation), y: g.map((r) => r.best_score),
      line: { color: "#111827", width: 2.5 }, customdata: g.map((r) => r.best_member),
      hovertemplate: "generation %{x}: best score %{y:.4g} (member %{customdata})<extra></extra>" });
    traces.push({ type: "scatter", mode: "lines", name: "median fitness", x: g.map((r) => r.generation), y: g.map((r) => r.median_fitness),
      line: { color: "#6b7280", dash: "dash", width: 2 }, hovertemplate: "generation %{x}: median fitness %{y:.4g}<extra></extra>" });
    const div = document.getElementById("fitness-chart");
    plot(div, traces, { title: { text: "Fitness over generations" }, xaxis: { title: { text: "generation" }, dtick: 1 },
      yaxis: { title: { text: "fitness / score" } }, height: 460, legend: { orientation: "h", y: -0.18 } });
    onPointClick(div, (m) => { location.hash = memberHash(route.run, m); });
    const card = document.getElementById("diversity-card");
    if (!data.diversity.length) { card.style.display = "none"; return; }
    card.style.display = "";
    const d = data.diversity;
    plot(document.getElementById("diversity-chart"), [
      { type: "bar", name: "distinct networks", x: d.map((r) => r.generation), y: d.map((r) => r.distinct), marker: { color: "#93c5fd" },
        hovertemplate: "generation %{x}: %{y} distinct<extra></extra>" },
      { type: "scatter", mode: "lines+markers", name: "mean pairwise distance", x: d.map((r) => r.generation), y: d.map((r) => r.mean_distance),
        yaxis: "y2", line: { color: "#9333ea" } },
    ], { title: { text: "Population diversity" }, height: 300, xaxis: { title: { text: "generation" }, dtick: 1 },
      yaxis: { title: { text: "distinct members" }, rangemode: "tozero" },
      yaxis2: { title: { text: "relative distance" }, overlaying: "y", side: "right", rangemode: "tozero" }, legend: { orientation: "h", y: -0.3 } });
  },
};

// ---- lineage tree --------------------------------------------------------------------------------------------------
const LineageView = {
  load: (route) => getJSON(runUrl(route.run, "lineage")),
  render(root, data, route, first) {
    if (first) {
      root.replaceChildren(el("p", { class: "note" }, "Who cloned whom. A dot is a member at the generation it was born, its line how long ",
        "it lived; an edge is a clone, its diamond the mutation (hover for what changed). Click a dot or a diamond to open that member. ",
        "★ marks the elite; larger dots are alive in the last generation; open circles are not evaluated yet (training now, or next)."),
        el("div", { class: "card" }, el("div", { id: "lineage-chart", class: "chart" })));
    }
    const row = Object.fromEntries(data.nodes.map((n) => [n.member, n.row]));
    const lifeX = [], lifeY = [];
    for (const n of data.nodes) {
      if (n.last_generation !== null && n.last_generation > n.born) { lifeX.push(n.born, n.last_generation, null); lifeY.push(n.row, n.row, null); }
    }
    const traces = [{ type: "scatter", mode: "lines", x: lifeX, y: lifeY, line: { color: "#d1d5db", width: 3 }, hoverinfo: "skip", showlegend: false }];
    const kinds = [...new Set(data.edges.map((e) => e.kind))].sort();
    const labelled = data.edges.length <= 40;  // past that, labels overlap: hover says what changed
    for (const kind of kinds) {
      const edges = data.edges.filter((e) => e.kind === kind);
      const colour = KIND_COLOURS[kind] || "#6b7280";
      const ex = [], ey = [];
      for (const e of edges) { ex.push(e.generation - 1, e.generation, null); ey.push(row[e.parent], row[e.child], null); }
      traces.push({ type: "scatter", mode: "lines", x: ex, y: ey, line: { color: colour, width: 1.5 }, hoverinfo: "skip",
        legendgroup: kind, showlegend: false });
      traces.push({ type: "scatter", mode: labelled ? "markers+text" : "markers", name: kind, legendgroup: kind,
        x: edges.map((e) => e.generation - 0.5), y: edges.map((e) => (row[e.parent] + row[e.child]) / 2),
        text: edges.map((e) => (e.op === "none" || e.op === e.kind || e.op === "hparams" ? "" : e.op)), textposition: "top center",
        textfont: { size: 9, color: colour }, customdata: edges.map((e) => e.child),
        hovertext: edges.map((e) => `${e.parent} → ${e.child} (generation ${e.generation})<br>${e.summary}`),
        hovertemplate: "%{hovertext}<extra></extra>", marker: { symbol: "diamond", size: 10, color: colour, line: { color: "#fff", width: 1 } },
        meta: "edge" });
    }
    const lineages = [...new Set(data.nodes.map((n) => n.lineage))];
    traces.push({ type: "scatter", mode: "markers+text", name: "members", showlegend: false,
      x: data.nodes.map((n) => n.born), y: data.nodes.map((n) => n.row),
      text: data.nodes.map((n) => String(n.member)), textposition: "middle left", textfont: { size: 10, color: "#374151" },
      customdata: data.nodes.map((n) => n.member),
      hovertext: data.nodes.map((n) => `member ${n.member} · born generation ${n.born}<br>` +
        (n.last_generation === null ? "not evaluated yet" : `best score ${fmt(n.best_score)}`) + `<br>${n.mutation}`),
      hovertemplate: "%{hovertext}<extra></extra>",
      marker: { size: data.nodes.map((n) => (n.alive ? 14 : 9)),
        symbol: data.nodes.map((n) => (n.member === data.elite ? "star" : n.last_generation === null ? "circle-open" : "circle")),
        color: data.nodes.map((n) => PALETTE[lineages.indexOf(n.lineage) % PALETTE.length]), line: { color: "#111827", width: 1 } },
      meta: "node" });
    const div = document.getElementById("lineage-chart");
    const rows = Math.max(1, data.nodes.length);
    plot(div, traces, { title: { text: `Lineage of ${data.nodes.length} members over ${data.generations_done} generations` },
      height: Math.max(420, Math.min(2400, 60 + rows * 22)),
      xaxis: { title: { text: "generation" }, dtick: 1, range: [-0.8, Math.max(...data.nodes.map((n) => n.born), 1) + 0.4] },
      yaxis: { autorange: "reversed", showticklabels: false, zeroline: false, showgrid: false, title: { text: "" } },
      legend: { title: { text: "mutation" }, orientation: "h", y: -0.08 } });
    onPointClick(div, (m) => { location.hash = memberHash(route.run, m); });
  },
};

// ---- hyperparameter schedule ----------------------------------------------------------------------------------------
const ScheduleView = {
  load: (route) => getJSON(runUrl(route.run, "schedule")),
  render(root, data, route, first) {
    if (first) {
      root.replaceChildren(el("p", { class: "note", id: "schedule-chain" }),
        el("div", { class: "card" }, el("div", { id: "schedule-chart", class: "chart" })));
    }
    const chain = document.getElementById("schedule-chain");
    if (data.elite === null) { chain.textContent = "no completed generation yet"; return; }
    chain.replaceChildren("The elite (member ", memberLink(route.run, data.elite), ") and its ancestry: for each generation, the ancestor ",
      "that was training then and its hyperparameters (PBT-style). Markers: a mutation handed over to a child. Ancestry: ",
      ...data.chain.flatMap((m, i) => (i ? [" → ", memberLink(route.run, m)] : [memberLink(route.run, m)])));
    const names = Object.keys(data.hparams);
    const n = names.length + 1;
    const gap = 0.04, h = (1 - gap * (n - 1)) / n;
    const layout = { height: Math.max(360, 170 * n), showlegend: false, title: { text: `Hyperparameter schedule of member ${data.elite}'s ancestry` },
      xaxis: { title: { text: "generation" }, dtick: 1, anchor: `y${n === 1 ? "" : n}` } };
    const traces = [];
    const axes = ["score", ...names];
    axes.forEach((name, i) => {
      const ax = i === 0 ? "y" : `y${i + 1}`;
      const key = i === 0 ? "yaxis" : `yaxis${i + 1}`;
      const top = 1 - i * (h + gap);
      layout[key] = { domain: [Math.max(0, top - h), top], title: { text: name, font: { size: 11 } },
        type: data.log_scale.includes(name) ? "log" : "linear" };
      const y = i === 0 ? data.scores : data.hparams[name];
      traces.push({ type: "scatter", mode: "lines", x: data.generations, y, yaxis: ax, name, line: { shape: "hv", width: 2.5, color: PALETTE[i % PALETTE.length] },
        customdata: data.members, hovertemplate: `${name} %{y:.4g}<br>generation %{x}, member %{customdata}<extra></extra>` });
      const sw = data.switches.filter((s) => data.generations.includes(s.generation));
      traces.push({ type: "scatter", mode: "markers", x: sw.map((s) => s.generation), yaxis: ax,
        y: sw.map((s) => y[data.generations.indexOf(s.generation)]), customdata: sw.map((s) => s.member),
        hovertext: sw.map((s) => `member ${s.parent} → ${s.member}<br>${s.mutation}`), hovertemplate: "%{hovertext}<extra></extra>",
        marker: { size: 10, symbol: "diamond", color: "#111827" } });
    });
    const div = document.getElementById("schedule-chart");
    plot(div, traces, layout);
    onPointClick(div, (m) => { location.hash = memberHash(route.run, m); });
  },
};

// ---- parallel coordinates -----------------------------------------------------------------------------------------------
const ParallelView = {
  load: (route) => getJSON(runUrl(route.run, "parallel")),
  render(root, data, route, first) {
    if (first) {
      root.replaceChildren(el("p", { class: "note" }, "Hyperparameters against score: one line per member at its latest evaluation, ",
        "coloured by score. Drag along an axis to select a range."),
        el("div", { class: "card" }, el("div", { id: "parallel-chart", class: "chart" })));
    }
    const chart = document.getElementById("parallel-chart");
    if (!data.members.length) { chart.replaceChildren(el("p", { class: "muted" }, "no evaluated member yet")); return; }
    const dims = data.dimensions.map((d) => Object.assign({ label: d.label, values: d.values }, d.ticktext ? { ticktext: d.ticktext, tickvals: d.tickvals } : {}));
    dims.push({ label: "score", values: data.score });
    if (!chart.classList.contains("js-plotly-plot")) chart.replaceChildren();
    plot(chart, [{
      type: "parcoords", dimensions: dims,
      line: { color: data.score, colorscale: "Viridis", showscale: true, colorbar: { title: { text: "score" } } },
    }], { title: { text: `Parallel coordinates: ${data.members.length} members` }, height: 460, margin: { l: 70, r: 70, t: 80, b: 30 } });
  },
};

// ---- mutation effects ------------------------------------------------------------------------------------------------------
const MutationsView = {
  load: (route) => getJSON(runUrl(route.run, "mutations")),
  render(root, data, route, first) {
    if (first) {
      root.replaceChildren(el("p", { class: "note" }, "Each child's first fitness minus its parent's fitness in the generation it was cloned from. ",
        "no_mutation is the control: its change is what one more generation of training gives. Does architecture growth help? ",
        "Compare the architecture boxes with it. Click a point to open the child."),
        el("div", { class: "card" }, el("div", { id: "mutations-chart", class: "chart" })),
        el("div", { class: "scroll" }, el("table", { class: "grid", id: "mutations-table" })));
    }
    const groups = data.groups.map((g) => g.group);
    const traces = groups.map((g) => {
      const es = data.effects.filter((e) => e.group === g && e.delta !== null);
      const kind = es[0] ? es[0].kind : g;
      return { type: "box", name: g, y: es.map((e) => e.delta), boxpoints: "all", jitter: 0.4, pointpos: 0,
        customdata: es.map((e) => e.child), text: es.map((e) => `member ${e.parent} → ${e.child} (generation ${e.generation})<br>${e.summary}`),
        hovertemplate: "%{text}<br>Δ fitness %{y:.4g}<extra></extra>", marker: { color: KIND_COLOURS[kind] || "#6b7280", size: 7 } };
    });
    const div = document.getElementById("mutations-chart");
    plot(div, traces, { title: { text: "Fitness change of children vs parents, by mutation" }, height: 460, showlegend: false,
      xaxis: { automargin: true, tickangle: -25 },
      yaxis: { title: { text: "Δ fitness (child − parent)" }, zeroline: true, zerolinecolor: "#111827" } });
    onPointClick(div, (m) => { location.hash = memberHash(route.run, m); });
    const table = document.getElementById("mutations-table");
    table.replaceChildren(el("thead", {}, el("tr", {}, ["mutation", "children", "mean Δ", "median Δ", "improved"].map((h) => el("th", {}, h)))),
      el("tbody", {}, data.groups.map((g) => el("tr", {}, el("td", {}, g.group), el("td", { class: "num" }, g.count),
        el("td", { class: "num" }, fmt(g.mean)), el("td", { class: "num" }, fmt(g.median)),
        el("td", { class: "num" }, `${Math.round(g.improved * 100)}%`)))));
  },
};

// ---- member detail ----------------------------------------------------------------------------------------------------------
function metricTraces(evals, field) {
  const names = [...new Set(evals.flatMap((e) => Object.keys(e[field])))].sort();
  return names.map((k, i) => ({ type: "scatter", mode: "lines+markers", name: k, x: evals.map((e) => e.generation),
    y: evals.map((e) => e[field][k] ?? null), line: { color: PALETTE[i % PALETTE.length] } }));
}
function kvTable(obj) {
  return el("table", { class: "grid" }, el("tbody", {}, Object.entries(obj).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { class: "mono" }, fmt(v))))));
}
const MemberView = {
  load: (route) => getJSON(runUrl(route.run, `members/${route.member}`)),
  render(root, m, route) {
    const last = m.evaluations[m.evaluations.length - 1];
    root.replaceChildren(
      el("h2", { id: "member-title" }, `Member ${m.member}`, " ", el("span", { class: "muted" },
        m.parent === null ? "· founder" : `· born in generation ${m.born} from member ${m.parent}: ${m.mutation_summary}`)),
      el("div", { class: "toolbar" }, m.exportable ? downloadButton(route.run, m.member) : el("span", { class: "note" },
        "no kept checkpoint (only each generation's best and the last generation are kept)")),
      el("div", { class: "grid2" },
        el("div", { class: "card" }, el("div", { id: "member-fitness", class: "chart" })),
        el("div", { class: "card" }, el("div", { id: "member-metrics", class: "chart" })),
        el("div", { class: "card" }, el("div", { id: "member-train", class: "chart" })),
        el("div", { class: "card" }, el("h2", {}, "Ancestry"), el("table", { class: "grid", id: "member-ancestry" },
          el("thead", {}, el("tr", {}, ["member", "born", "best score", "made by"].map((h) => el("th", {}, h)))),
          el("tbody", {}, m.ancestry.map((a) => el("tr", {}, el("td", {}, memberLink(route.run, a.member)), el("td", { class: "num" }, a.born),
            el("td", { class: "num" }, fmt(a.best_score)), el("td", { class: "wrap mono" }, a.mutation))))),
          el("h2", {}, "Children"), m.children.length ? el("ul", {}, m.children.map((c) => el("li", {}, memberLink(route.run, c.member),
            ` (generation ${c.born}): `, el("span", { class: "mono" }, c.mutation)))) : el("p", { class: "muted" }, "none"))),
      el("h2", {}, "Per generation"),
      el("div", { class: "scroll" }, el("table", { class: "grid", id: "member-evaluations" },
        el("thead", {}, el("tr", {}, ["generation", "fitness", "score", "wall s", "checkpoint", "digest (sha-256)"].map((h) => el("th", {}, h)))),
        el("tbody", {}, m.evaluations.map((e) => el("tr", {}, el("td", { class: "num" }, e.generation), el("td", { class: "num" }, fmt(e.fitness)),
          el("td", { class: "num" }, fmt(e.score)), el("td", { class: "num" }, fmt(e.wall_s)), el("td", { class: "mono" }, e.checkpoint ?? "pruned"),
          el("td", { class: "mono digest", title: e.digest ?? "" }, e.digest ? e.digest.slice(0, 16) + "…" : "–")))))),
      last ? el("div", { class: "grid2" }, el("div", {}, el("h2", {}, "Hyperparameters"), kvTable(last.hparams)),
        el("div", {}, el("h2", {}, "Architecture"), kvTable(last.arch))) : null,
      m.mutation ? el("div", {}, el("h2", {}, "Mutation record"), el("pre", {}, JSON.stringify(m.mutation, null, 2))) : null);
    const ev = m.evaluations;
    const xaxis = { title: { text: "generation" }, dtick: 1 };
    plot(document.getElementById("member-fitness"), [
      { type: "scatter", mode: "lines+markers", name: "fitness", x: ev.map((e) => e.generation), y: ev.map((e) => e.fitness) },
      { type: "scatter", mode: "lines+markers", name: "score", x: ev.map((e) => e.generation), y: ev.map((e) => e.score), line: { dash: "dash" } },
    ], { title: { text: "Fitness and score" }, height: 320, xaxis });
    plot(document.getElementById("member-metrics"), metricTraces(ev, "metrics"), { title: { text: "Evaluation metrics" }, height: 320, xaxis,
      showlegend: true });
    plot(document.getElementById("member-train"), metricTraces(ev, "train_metrics"), { title: { text: "Training metrics" }, height: 320, xaxis,
      showlegend: true });
  },
};

const VIEWS = { leaderboard: LeaderboardView, fitness: FitnessView, lineage: LineageView, schedule: ScheduleView,
  parallel: ParallelView, mutations: MutationsView };

// ---- start ---------------------------------------------------------------------------------------------------------------------
async function start() {
  try { state.config = await getJSON("/api/config"); } catch (err) { /* defaults */ }
  if (!location.hash && state.config.default_run) history.replaceState(null, "", `#/run/${enc(state.config.default_run)}`);
  window.addEventListener("hashchange", show);
  await show();
  let busy = false;
  setInterval(async () => {
    if (busy) return;  // a slow answer must not pile up requests
    busy = true;
    try { await refresh(false); } finally { busy = false; }
  }, state.config.poll_ms || 1500);
}
start();
