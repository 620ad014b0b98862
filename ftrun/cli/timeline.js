/* ftrun inspect --html: draws a job's timeline as SVG from the JSON in #timeline-data
   (ftrun/jobview/timeline.py makes it; ftrun/cli/timeline_html.py writes the page).
   Every text that came from the journal is set with textContent or as an attribute value;
   nothing is ever parsed as HTML. When done, #timeline gets data-rendered="ok"; an error is
   written into #timeline-error (and data-rendered="error") instead of failing silently. */
(() => {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const root = document.getElementById("timeline");
  const PHASE_COLOURS = { // by goodput's labels (ftrun/jobview/phases.py)
    detection: "#e4572e", teardown: "#f3a712", "waiting for hosts": "#8e5ad6",
    relaunch: "#2a9d8f", restore: "#d6408f",
  };
  const JOINED_PHASE = "#8a94a3";
  const MARKS = { // kind → [colour, shape]
    host_added: ["#2e8540", "up"], host_joined: ["#2e8540", "up"],
    host_removed: ["#c0392b", "down"], host_lost: ["#c0392b", "cross"],
    host_unreachable: ["#b7791f", "down"], plan_changed: ["#1b7fc4", "diamond"],
  };
  const GEN_FILL = ["#d8e6f6", "#c2d6ef"], GEN_EDGE = "#7d9fc9";
  const RATE = "#1b5e9e", COMMIT = "#3d4a5c", GRID = "#eef1f5", AXIS = "#8a94a3";
  const STATES = ["running", "succeeded", "failed", "stopped"];
  const tips = new WeakMap(); // element → the lines of its tooltip

  function fail(err) {
    let box = document.getElementById("timeline-error");
    if (!box) {
      box = document.createElement("div");
      box.id = "timeline-error";
      root.insertBefore(box, root.firstChild);
    }
    box.textContent = "The timeline could not be drawn: " + (err && err.stack ? err.stack : err);
    root.setAttribute("data-rendered", "error");
  }

  function el(tag, attrs, parent, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  const label = (parent, x, y, text, cls, anchor) =>
    el("text", { x, y, class: cls || "", "text-anchor": anchor || "start" }, parent, text);

  function html(tag, cls, text, parent) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function dur(s) {
    if (s === null || s === undefined) return "?";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 120) return s.toFixed(s < 10 ? 2 : 1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    return Math.floor(s / 3600) + " h " + String(Math.round((s % 3600) / 60)).padStart(2, "0") + " min";
  }
  const at = (t) => "+" + dur(t);
  const plural = (n, word) => n + " " + word + (n === 1 ? "" : "s");
  const given = (v) => v !== null && v !== undefined;

  function fit(s, px) {
    const max = Math.floor(px / 6.8);
    if (max < 2) return "";
    return s.length <= max ? s : s.slice(0, max - 1) + "\u2026";
  }

  function tip(node, lines) {
    tips.set(node, lines.filter((l) => given(l) && l !== ""));
    node.classList.add("hot");
    return node;
  }

  /* ---- header and legend ---- */

  function header(d) {
    const h1 = document.getElementById("title");
    h1.textContent = "ftrun job " + d.job_id;
    if (d.name) html("span", "name", d.name, h1);
    html("span", "state state-" + (STATES.includes(d.state) ? d.state : "other"), d.state, h1);
    const box = document.getElementById("summary");
    const facts = [];
    if (d.started_wall) facts.push("started " + new Date(d.started_wall * 1000).toLocaleString());
    facts.push((d.live ? "running for " : "lasted ") + dur(d.span));
    facts.push(plural(d.generations.length, "generation"), plural(d.incidents.length, "incident"));
    let commits = plural(d.commits_total, "checkpoint commit");
    if (d.commits.length < d.commits_total) commits += " (" + d.commits.length + " drawn)";
    facts.push(commits);
    const hosts = {}; // state → how many hosts are in it at the end
    for (const state of Object.values(d.hosts)) hosts[state] = (hosts[state] || 0) + 1;
    const counts = Object.entries(hosts).map(([state, n]) => n + " " + state);
    if (counts.length) facts.push(plural(Object.keys(d.hosts).length, "host") + " (" + counts.join(", ") + ")");
    html("div", "line", facts.join(" \u00b7 "), box);
    if (d.reason) html("div", "line", d.state + ": " + d.reason, box);
    if (d.goodput) {
      const g = d.goodput, line = html("div", "line goodput", null, box);
      const known = given(g.ratio); // unknown without a progress signal: `g.unknown` says why
      html("b", null, "goodput " + (known ? (100 * g.ratio).toFixed(1) + "%" : "\u2014"), line);
      let rest = known ? ": " + dur(g.productive_s) + " productive of " + dur(g.wall_s)
        : " (" + g.unknown + "): " + dur(g.unknown_s) + " ran without a step, of " + dur(g.wall_s);
      if (g.lost.length) rest += "; lost to " + g.lost.map((b) => b[0] + " " + dur(b[1])).join(", ");
      line.appendChild(document.createTextNode(rest));
    }
    if (d.live) html("div", "line", "drawn while the job runs: run `ftrun inspect --html` again for more", box);
  }

  function legend(d) {
    const box = document.getElementById("legend");
    const item = (text, draw) => {
      const it = html("span", "item", null, box);
      draw(el("svg", { width: 22, height: 14, viewBox: "0 0 22 14" }, it));
      html("span", null, text, it);
    };
    item("generation", (s) => el("rect", { x: 1, y: 2, width: 20, height: 10, fill: GEN_FILL[1], stroke: GEN_EDGE }, s));
    if (d.generations.some((gen) => given(gen.starting_end))) {
      item("starting (to its first step)", (s) => el("rect", { x: 1, y: 2, width: 20, height: 10, fill: "#e8eff9", stroke: GEN_EDGE }, s));
    }
    for (const p of d.phases) {
      item("incident: " + p, (s) => el("rect", { x: 1, y: 2, width: 20, height: 10, fill: PHASE_COLOURS[p] }, s));
    }
    item("steps/s", (s) => {
      el("line", { x1: 1, y1: 7, x2: 21, y2: 7, stroke: RATE, "stroke-width": 2 }, s);
      el("circle", { cx: 11, cy: 7, r: 2.8, fill: RATE }, s);
    });
    item("checkpoint committed", (s) => el("line", { x1: 11, y1: 1, x2: 11, y2: 13, stroke: COMMIT, "stroke-width": 2 }, s));
    const kinds = new Set(d.markers.map((m) => m.kind));
    for (const [k, text] of Object.entries(d.markers_legend)) {
      if (kinds.has(k)) item(text, (s) => mark(s, k, 11, 7));
    }
  }

  function mark(parent, kind, x, y) {
    const [colour, shape] = MARKS[kind] || ["#555", "diamond"], r = 6;
    const path = {
      up: [[x, y - r], [x + r, y + r], [x - r, y + r]],
      down: [[x, y + r], [x + r, y - r], [x - r, y - r]],
      diamond: [[x, y - r], [x + r, y], [x, y + r], [x - r, y]],
    }[shape];
    const d = path ? "M" + path.map((p) => p.join(",")).join("L") + "Z"
      : `M${x - r},${y - r}L${x + r},${y + r}M${x + r},${y - r}L${x - r},${y + r}`; // a cross
    return el("path", { d, fill: path ? colour : "none", stroke: colour, "stroke-width": path ? 1 : 3 }, parent);
  }

  /* ---- the chart ---- */

  const STEPS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800,
    3600, 7200, 10800, 21600, 43200, 86400];

  function ticks(span, px) {
    const want = Math.max(2, Math.floor(px / 90));
    const step = STEPS.find((s) => span / s <= want) || STEPS[STEPS.length - 1];
    const [unit, scale] = span <= 180 ? ["s", 1] : span <= 3 * 3600 ? ["min", 60] : ["h", 3600];
    const out = [];
    for (let t = 0; t <= span + 1e-9; t += step) out.push([t, Math.round(t / scale * 100) / 100 + " " + unit]);
    return out;
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const e = Math.pow(10, Math.floor(Math.log10(v))), f = v / e;
    return [1, 1.2, 1.6, 2, 2.4, 3, 4, 5, 6, 8, 10].find((n) => f <= n) * e; // quarters stay round
  }

  function draw(d) {
    const chart = document.getElementById("chart");
    chart.replaceChildren();
    const W = Math.max(720, chart.clientWidth || window.innerWidth - 48);
    const L = 140, R = 28, plotW = W - L - R, span = d.span > 0 ? d.span : 1;
    const x = (t) => L + Math.max(0, Math.min(span, t)) / span * plotW;
    const lanes = { gen: [8, 38], inc: [56, 28], mark: [94, 24], ckpt: [128, 20] };
    const rateTop = 166, chartTop = chart.getBoundingClientRect().top + window.scrollY;
    // the rate chart takes the rest of the window's height, within reason
    const rateH = Math.max(260, Math.min(480, window.innerHeight - chartTop - rateTop - 56));
    const axisY = rateTop + rateH, H = axisY + 44;
    const svg = el("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img" }, chart);
    const grid = el("g", { class: "grid" }, svg), tks = ticks(span, plotW);
    for (const [t] of tks) el("line", { x1: x(t), y1: 4, x2: x(t), y2: axisY, stroke: GRID }, grid);
    for (const inc of d.incidents) {
      const x0 = x(inc.start), x1 = Math.max(x(inc.end), x0 + 2);
      el("rect", { class: "incident-shade", x: x0, y: 4, width: x1 - x0, height: axisY - 4,
        fill: "#e4572e", opacity: 0.08 }, grid);
    }
    const names = { gen: "generations", inc: "incidents", mark: "hosts \u00b7 plans", ckpt: "checkpoints" };
    for (const [k, [y, h]] of Object.entries(lanes)) label(svg, L - 10, y + h / 2 + 4, names[k], "lane-label", "end");
    drawGenerations(svg, d, x, lanes.gen);
    drawIncidents(svg, d, x, lanes.inc);
    drawMarkers(svg, d, x, lanes.mark);
    drawCommits(svg, d, x, lanes.ckpt);
    drawRate(svg, d, x, rateTop, rateH, L, W - R);
    const axis = el("g", { class: "axis" }, svg);
    el("line", { x1: L, y1: axisY, x2: W - R, y2: axisY, stroke: AXIS }, axis);
    for (const [t, text] of tks) {
      el("line", { x1: x(t), y1: axisY, x2: x(t), y2: axisY + 5, stroke: AXIS }, axis);
      label(axis, x(t), axisY + 18, text, "", "middle");
    }
    label(axis, L + plotW / 2, axisY + 37, "time since the job started", "", "middle");
    hover(svg);
  }

  const none = (g, x, lane, text) => label(g, x(0) + 6, lane[0] + lane[1] / 2 + 4, text, "none");

  function drawGenerations(svg, d, x, lane) {
    const g = el("g", { class: "generations" }, svg);
    if (!d.generations.length) none(g, x, lane, "no generation launched");
    d.generations.forEach((gen, i) => {
      const grp = el("g", { class: "gen", "data-gen": gen.number, "data-open": gen.open }, g);
      const x0 = x(gen.start), w = Math.max(x(gen.end) - x0, 2), r = gen.restored;
      const rect = el("rect", { x: x0, y: lane[0], width: w, height: lane[1], rx: 3,
        fill: GEN_FILL[i % 2], stroke: GEN_EDGE }, grp);
      if (gen.open) rect.setAttribute("stroke-dasharray", "4 3");
      if (given(gen.starting_end)) { // paler: starting, to its first step (none: no steps at all)
        el("rect", { class: "gen-starting", x: x0 + 1, y: lane[0] + 1,
          width: Math.max(Math.min(x(gen.starting_end), x0 + w) - x0 - 1, 0),
          height: lane[1] - 2, fill: "#ffffff", opacity: 0.55 }, grp);
      }
      const text = ["g" + gen.number, gen.hosts.join(", "), plural(gen.world_size, "rank"), gen.plan]
        .filter(given).join(" \u00b7 ");
      label(grp, x0 + 6, lane[0] + lane[1] / 2 + 4, fit(text, w - 10));
      tip(grp, [
        "generation " + gen.number + (gen.open ? " (running)" : gen.outcome ? " (" + gen.outcome + ")" : ""),
        "hosts: " + gen.hosts.join(", ") + " \u2014 " + plural(gen.world_size, "rank"),
        gen.plan ? "plan: " + gen.plan + (gen.plan_why ? " (" + gen.plan_why + ")" : "") : null,
        "launched " + at(gen.start) + (gen.open ? ", running" : ", ended " + at(gen.end)) +
          " (" + dur(gen.end - gen.start) + ")",
        given(gen.first_step_t) ? "first step (" + gen.first_step + ") at " + at(gen.first_step_t) +
          ", " + dur(gen.first_step_t - gen.start) + " after launch"
          : given(gen.starting_end) ? "no step reported" : "ran without reporting steps (no progress signal)",
        given(gen.last_step) ? "last step: " + gen.last_step : null,
        r ? "restored: " + (r.tier === "none" ? "nothing (no checkpoint)" : "step " + r.step + " from " + r.tier) +
          (given(r.restore_s) ? " in " + dur(r.restore_s) : "") : null,
        gen.measured_step_s ? "measured " + gen.measured_step_s.toPrecision(3) + " s/step" +
          (gen.predicted_step_s ? ", predicted " + gen.predicted_step_s.toPrecision(3) : "") : null,
        given(gen.goodput) ? "goodput " + (100 * gen.goodput).toFixed(1) + "%"
          : given(gen.starting_end) ? null : "goodput unknown: no progress signal",
      ]);
    });
  }

  function drawIncidents(svg, d, x, lane) {
    const g = el("g", { class: "incidents" }, svg), mid = lane[0] + lane[1] / 2 + 4;
    if (!d.incidents.length) none(g, x, lane, "no incidents");
    let labelEnd = -1;
    for (const inc of d.incidents) {
      const grp = el("g", { class: "incident", "data-incident": inc.id }, g);
      const title = "incident " + inc.id + ": " + inc.kind + " (generation " + inc.generation + ")";
      const about = [
        [given(inc.host) ? "host " + inc.host : null, given(inc.rank) ? "rank " + inc.rank : null]
          .filter(given).join(", "),
        inc.tier ? "decision: " + inc.tier : null,
        inc.reason,
        inc.exception ? "exception: " + inc.exception : null,
        given(inc.step_at_fault) ? "at step " + inc.step_at_fault +
          (given(inc.lost_steps) ? ", steps lost: " + inc.lost_steps : "") : null,
        inc.injected ? "injected: " + inc.injected : null,
      ];
      const phases = inc.segments.map((s) => s.phase + ": " + dur(s.end - s.start) +
        (s.open ? " so far" : "") + " (" + at(s.start) + " \u2192 " + at(s.end) + ")");
      if (!inc.segments.length) {
        tip(el("rect", { class: "phase", "data-phase": "detected", x: x(inc.start) - 1, y: lane[0],
          width: 3, height: lane[1], fill: JOINED_PHASE }, grp), [title, "detected at " + at(inc.start), ...about]);
      }
      for (const s of inc.segments) {
        const x0 = x(s.start), w = Math.max(x(s.end) - x0, 2);
        const seg = el("rect", { class: "phase", "data-phase": s.phase, x: x0, y: lane[0], width: w,
          height: lane[1], fill: PHASE_COLOURS[s.phase] || JOINED_PHASE }, grp);
        if (s.open) seg.setAttribute("opacity", 0.55);
        tip(seg, [title + " \u2014 " + s.phase, dur(s.end - s.start) + (s.open ? " so far" : "") + ": " +
          at(s.start) + " \u2192 " + at(s.end), ...about, "phases:", ...phases]);
      }
      const lx = x(inc.end) + 5, text = "#" + inc.id + " " + inc.kind;
      if (lx > labelEnd && lx + text.length * 6.8 < x(d.span) + 20) {
        label(grp, lx, mid, text, "incident-label");
        labelEnd = lx + text.length * 6.8 + 6;
      }
    }
  }

  function drawMarkers(svg, d, x, lane) {
    const g = el("g", { class: "markers" }, svg);
    if (!d.markers.length) none(g, x, lane, "no hosts joined or left, no plan changed");
    for (const m of d.markers) {
      const p = mark(g, m.kind, x(m.t), lane[0] + lane[1] / 2);
      p.setAttribute("class", "marker");
      p.setAttribute("data-kind", m.kind);
      tip(p, [(d.markers_legend[m.kind] || m.kind) + (m.host ? ": " + m.host : ""), "at " + at(m.t), m.detail]);
    }
  }

  function drawCommits(svg, d, x, lane) {
    const g = el("g", { class: "commits" }, svg), y1 = lane[0], y2 = lane[0] + lane[1];
    if (!d.commits.length) none(g, x, lane, "no checkpoint committed");
    for (const c of d.commits) {
      const grp = el("g", { class: "commit-hit" }, g), cx = x(c.t);
      el("line", { class: "commit", "data-step": c.step, x1: cx, y1, x2: cx, y2, stroke: COMMIT,
        "stroke-width": 1.5 }, grp);
      el("line", { x1: cx, y1, x2: cx, y2, stroke: "transparent", "stroke-width": 7 }, grp); // to hover
      tip(grp, ["checkpoint committed: step " + c.step, "generation " + c.gen + ", at " + at(c.t)]);
    }
  }

  function drawRate(svg, d, x, top, h, x0, x1) {
    const g = el("g", { class: "rate" }, svg), ymax = niceMax(d.max_rate * 1.1);
    const y = (r) => top + h - (r / ymax) * (h - 8);
    for (let i = 0; i <= 4; i++) {
      const v = ymax * i / 4;
      el("line", { x1: x0, y1: y(v), x2: x1, y2: y(v), stroke: i ? GRID : AXIS }, g);
      label(g, x0 - 8, y(v) + 4, String(Math.round(v * 1000) / 1000), "lane-label", "end");
    }
    label(g, x0 - 70, top + h / 2 - 4, "steps/s", "lane-label", "middle");
    for (const gen of d.generations) {
      el("line", { x1: x(gen.start), y1: top, x2: x(gen.start), y2: top + h, stroke: GEN_EDGE,
        "stroke-dasharray": "3 4" }, g);
    }
    for (const gen of d.generations.filter((gen) => gen.points.length)) {
      const pts = gen.points.map((p) => [x((p.t0 + p.t1) / 2), y(p.rate)]);
      el("polyline", { class: "rate-line", "data-gen": gen.number, fill: "none", stroke: RATE,
        "stroke-width": 2, "stroke-linejoin": "round",
        points: pts.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ") }, g);
      gen.points.forEach((p, k) => {
        tip(el("circle", { class: "rate-point", "data-gen": gen.number, cx: pts[k][0], cy: pts[k][1],
          r: gen.points.length > 150 ? 1.6 : 3, fill: RATE }, g), [
          "generation " + gen.number + ": " + p.rate.toPrecision(3) + " steps/s",
          "steps " + p.step0 + " \u2192 " + p.step1 + " over " + at(p.t0) + " \u2192 " + at(p.t1),
          p.rate > 0 ? (1 / p.rate).toPrecision(3) + " s/step" : "no step in this interval",
        ]);
      });
    }
    if (!d.generations.some((gen) => gen.points.length)) {
      const some = d.generations.some((gen) => given(gen.first_step));
      label(g, (x0 + x1) / 2, top + h / 2, some ? "too few steps reported to measure a rate"
        : "no steps reported", "none", "middle");
    }
  }

  /* ---- the tooltip ---- */

  function hover(svg) {
    const box = document.getElementById("tip");
    const find = (node) => {
      for (; node && node !== svg; node = node.parentNode) if (tips.has(node)) return node;
      return null;
    };
    svg.addEventListener("mousemove", (ev) => {
      const target = find(ev.target);
      if (!target) { box.style.display = "none"; return; }
      box.replaceChildren();
      tips.get(target).forEach((line, i) => html("div", i ? null : "title", line, box));
      box.style.display = "block";
      let px = ev.clientX + 14, py = ev.clientY + 14;
      if (px + box.offsetWidth > window.innerWidth - 4) px = ev.clientX - box.offsetWidth - 14;
      if (py + box.offsetHeight > window.innerHeight - 4) py = ev.clientY - box.offsetHeight - 14;
      box.style.left = Math.max(4, px) + "px";
      box.style.top = Math.max(4, py) + "px";
    });
    svg.addEventListener("mouseleave", () => { box.style.display = "none"; });
  }

  /* #probe (tests, headless): hover the first element of each kind, as a mouse would, and
     write what its tooltip showed into #probe; the last tooltip stays up for a screenshot. */
  function probe() {
    const out = html("pre", null, null, root), box = document.getElementById("tip");
    out.id = "probe";
    for (const sel of [".gen", ".phase", ".marker", ".commit-hit", ".rate-point"]) {
      const node = document.querySelector(sel);
      if (!node) continue;
      const r = node.getBoundingClientRect();
      node.dispatchEvent(new MouseEvent("mousemove", { bubbles: true,
        clientX: r.left + r.width / 2, clientY: r.top + r.height / 2 }));
      const shown = box.style.display === "block"
        ? Array.from(box.childNodes, (n) => n.textContent).join(" | ") : "(no tooltip)";
      out.appendChild(document.createTextNode(sel + " => " + shown + "\n"));
    }
  }

  try {
    const data = JSON.parse(document.getElementById("timeline-data").textContent);
    header(data);
    legend(data);
    draw(data);
    let pending = null;
    window.addEventListener("resize", () => {
      clearTimeout(pending);
      pending = setTimeout(() => { try { draw(data); } catch (e) { fail(e); } }, 150);
    });
    if (window.location.hash === "#probe") probe();
    root.setAttribute("data-rendered", "ok");
  } catch (e) {
    fail(e);
  }
})();
