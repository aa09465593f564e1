// The tokenlake explorer's one script: reads the URL, asks the server's JSON endpoints, draws.
// Every value from the lake enters the page as text (textContent, attribute values, Vega
// data), never as HTML. Each page's state is in its URL, so a reload or a shared link shows
// the same page. When drawn, <html data-rendered="done"> (or "failed"), for the browser tests.
(function () {
  "use strict";
  const main = document.getElementById("main");
  const WINDOWS = { "256": 256, "1k": 1024, "4k": 4096, "all": Infinity };
  const CLIP_PERCENTILE = 99;
  // Colour ramps as stops (the bundle exposes vegaEmbed only, not Vega's schemes).
  const DIVERGING = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];
  const SEQUENTIAL = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function ramp(stops) {
    return (t) => {
      const x = Math.max(0, Math.min(1, t)) * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
      const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * f));
      return "rgb(" + c.join(",") + ")";
    };
  }
  const explorer = (window.explorer = { charts: {}, colours: {} });

  // --- small helpers --------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => {
      if (v === undefined || v === null || v === false) return;
      if (k === "class") node.className = v;
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k === "style") Object.assign(node.style, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    });
    children.flat().forEach((c) => {
      if (c === undefined || c === null || c === false) return;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    });
    return node;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "NULL";
    if (typeof v === "number") {
      if (Number.isInteger(v)) return v.toLocaleString("en-US");
      return Math.abs(v) >= 1e5 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3)
        : String(Number(v.toPrecision(4)));
    }
    if (typeof v === "boolean") return v ? "true" : "false";
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }
  function seg(text) { return encodeURIComponent(text); }
  function runPath(run) { return "/runs/" + seg(run); }
  function stepPath(run, step, evaluation) {
    return runPath(run) + "/steps/" + step + (evaluation ? "?eval=1" : "");
  }
  function samplePath(run, step, position, evaluation) {
    return runPath(run) + "/steps/" + step + "/samples/" + position + (evaluation ? "?eval=1" : "");
  }
  function params() { return new URLSearchParams(location.search); }
  function setParam(name, value) {
    const p = params();
    if (value === null || value === undefined || value === "") p.delete(name); else p.set(name, value);
    replaceQuery(p);
  }
  // Runs travel as one `run=` each: a run's name may hold a comma.
  function setRuns(runs) {
    const p = params();
    p.delete("run");
    for (const run of runs) p.append("run", run);
    replaceQuery(p);
  }
  function runsQuery(runs) { return new URLSearchParams(runs.map((run) => ["run", run])); }
  // The runs the URL names; a link of the earlier form `?runs=a,b` (one parameter, names
  // joined by commas, so no name in it holds one) still opens.
  function urlRuns() {
    const p = params();
    const runs = p.getAll("run").filter(Boolean);
    if (runs.length === 0 && p.has("runs")) return p.get("runs").split(",").filter(Boolean);
    return runs;
  }
  function replaceQuery(p) {
    const query = p.toString();
    history.replaceState(null, "", location.pathname + (query ? "?" + query : ""));
  }
  async function api(path, query) {
    const url = path + "?" + new URLSearchParams(query || {}).toString();
    const answer = await fetch(url, { credentials: "same-origin" });
    let body;
    try { body = await answer.json(); } catch (e) { throw new Error("The server answered " + answer.status + "."); }
    if (!answer.ok || body.error) throw new Error(body.error || "The server answered " + answer.status + ".");
    return body;
  }
  function crumbs(parts) {
    const nav = document.getElementById("crumbs");
    nav.replaceChildren();
    parts.forEach(([text, href], i) => {
      if (i) nav.appendChild(document.createTextNode(" › "));
      nav.appendChild(href ? el("a", { href }, text) : el("span", {}, text));
    });
  }
  // Each run's colour comes from the server (tokenlake.serve.run_colours, the report's too).
  function colourOf(run) { return explorer.colours[run] || "#7f7f7f"; }
  function swatch(run) {
    return el("span", { class: "swatch", style: { background: colourOf(run) }, "aria-hidden": "true" });
  }
  function table(columns, rows, options) {
    options = options || {};
    const head = el("tr", {}, columns.map((c) => el("th", {
      class: options.onSort ? "sortable" : undefined, scope: "col",
      onclick: options.onSort ? () => options.onSort(c) : undefined,
    }, c + (options.sorted && options.sorted.column === c ? (options.sorted.desc ? " ▼" : " ▲") : ""))));
    const body = rows.map((row) => {
      const tr = el("tr", { class: options.rowClass ? options.rowClass(row) : undefined });
      columns.forEach((c) => {
        const cell = options.cell ? options.cell(c, row) : fmt(row[c]);
        tr.appendChild(el("td", { class: typeof row[c] === "number" ? "num" : undefined,
          title: typeof row[c] === "string" ? row[c] : undefined }, cell));
      });
      return tr;
    });
    return el("div", { class: "scroll" }, el("table", {}, el("thead", {}, head), el("tbody", {}, body)));
  }
  function chartWidth() { return Math.max(220, Math.min(640, main.clientWidth - 60)); }

  // --- charts (Vega-Lite from the bundle; one colour per run on every chart) -------------
  function runScale(runs) {
    return { domain: runs, range: runs.map(colourOf) };
  }
  async function draw(id, spec, onClick) {
    const holder = el("div", { class: "chart", id });
    const slot = document.getElementById(id + "-slot");
    (slot || main).appendChild(holder);
    const options = { actions: false, renderer: "svg",
      config: { background: null, legend: { orient: "bottom", labelLimit: 400, columns: 4, symbolLimit: 0 } } };
    const result = await vegaEmbed(holder, Object.assign({ width: chartWidth(), height: 180 }, spec), options);
    explorer.charts[id] = result.view;
    if (onClick) result.view.addEventListener("click", (event, item) => { if (item && item.datum) onClick(item.datum); });
    return result.view;
  }
  function perStepSpec(title, rows, field, runs, threshold) {
    const layers = [{
      mark: { type: "line", point: true, tooltip: true },
      params: [{ name: "zoom", select: "interval", bind: "scales" }],
      encoding: {
        x: { field: "rollout_id", type: "quantitative", title: "step", axis: { tickMinStep: 1 } },
        y: { field, type: "quantitative", title: field, scale: { zero: false } },
        color: { field: "run", type: "nominal", scale: runScale(runs), title: "run" },
      },
    }];
    if (threshold !== undefined && threshold !== null) {
      layers.push({ data: { values: [{ t: threshold }] }, mark: { type: "rule", strokeDash: [4, 4], color: "#b3261e" },
        encoding: { y: { field: "t", type: "quantitative" } } });
      layers.push({ data: { values: [{ t: threshold, label: "alarm " + fmt(threshold) }] },
        mark: { type: "text", align: "left", dx: 3, dy: -5, color: "#b3261e" },
        encoding: { y: { field: "t", type: "quantitative" }, x: { value: 0 }, text: { field: "label" } } });
    }
    return { title, data: { values: rows.filter((r) => r[field] !== null && r[field] !== undefined) }, layer: layers };
  }

  // --- pages ----------------------------------------------------------------------------
  // What the runs page says of its audits while they run (the server runs them once per
  // catalog, in the background) or when they failed.
  const AUDITS_COMPUTING = "audits: computing (this catalog's audits run once, in the background)";
  const AUDIT_POLL_MS = 1000;

  async function runsPage() {
    crumbs([["runs", null]]);
    const data = await api("/api/runs");
    Object.assign(explorer.colours, data.colours);
    const allRuns = data.runs.map((r) => r.run);
    main.replaceChildren(el("h1", {}, "Runs"), el("p", { class: "note" },
      data.runs.length + " run(s). Tick runs and compare them, or open one."));
    const chosen = new Set(urlRuns());
    const compare = el("a", { id: "compare", href: "/compare" }, "Compare the ticked runs");
    function updateCompare() {
      const list = allRuns.filter((r) => chosen.has(r));
      compare.href = "/compare?" + runsQuery(list).toString();
      setRuns(list);
    }
    const columns = ["", "run", "framework", "dump_format", "steps", "eval_steps", "samples", "tokens",
      "reward_mean", "mean_abs_lp_diff", "k3_kl", "ess_min", "audits", "tags"];
    const rows = data.runs.map((r) => Object.assign({}, r, { "": r.run }));
    main.appendChild(table(columns, rows, {
      cell: (c, row) => {
        if (c === "") return el("input", { type: "checkbox", "aria-label": "compare " + row.run,
          checked: chosen.has(row.run), onchange: (e) => { e.target.checked ? chosen.add(row.run) : chosen.delete(row.run); updateCompare(); } });
        if (c === "run") return el("span", {}, swatch(row.run), el("a", { href: runPath(row.run), class: "run-link" }, row.run));
        if (c === "audits") return el("span", { class: "audits", "data-run": row.run }, auditBadges(row.audits, data.audits.state));
        if (c === "tags") return Object.entries(row.tags).map(([k, v]) => k + "=" + v).join(", ");
        return fmt(row[c]);
      },
    }));
    main.appendChild(el("p", {}, compare));
    main.appendChild(el("p", { class: "note" }, "mean_abs_lp_diff and k3_kl: over every drift token of the run (drift_steps, weighted by tokens); reward_mean: raw_reward over its training samples; audits: those with offending rows for the run."));
    const state = el("p", { class: "note", id: "audits-state" });
    main.appendChild(state);
    showAudits(state, data.audits);
    updateCompare();
    if (data.audits.state === "computing") followAudits(state);
  }

  // A run's failing audits as badges; null while they are computed (or when they failed).
  function auditBadges(audits, state) {
    if (audits === null) return el("span", { class: "audits-pending" }, state);
    return audits.length ? audits.map((a) => el("span", { class: "badge " + a.severity, title: a.rows + " row(s)" }, a.name)) : "none";
  }

  function showAudits(state, audits) {
    document.documentElement.dataset.audits = audits.state;
    if (audits.state === "computing") state.textContent = AUDITS_COMPUTING;
    else if (audits.state === "failed") state.textContent = "audits: " + audits.error;
    else state.textContent = "";
    state.hidden = audits.state === "ready";
  }

  // Asks again until the audits are done, then fills the audits column in place (the rest of
  // the page stays as the user left it: ticked runs, scroll).
  async function followAudits(state) {
    while (state.isConnected) {
      await new Promise((done) => setTimeout(done, AUDIT_POLL_MS));
      let data;
      try { data = await api("/api/runs"); } catch (e) { continue; }
      if (data.audits.state === "computing") continue;
      for (const row of data.runs) {
        const cell = [...document.querySelectorAll("span.audits")].find((c) => c.dataset.run === row.run);
        if (!cell) continue;
        cell.replaceChildren(...[].concat(auditBadges(row.audits, data.audits.state)));
      }
      showAudits(state, data.audits);
      return;
    }
  }

  async function stepsPage(runs, title) {
    const data = await api("/api/steps", runsQuery(runs));
    const shown = data.runs;  // the legends list these; their colours are the lake's
    Object.assign(explorer.colours, data.colours);
    crumbs([["runs", "/"], [title, null]]);
    main.replaceChildren(el("h1", {}, title), el("p", {}, data.runs.map((r) => el("span", { class: "badge" }, swatch(r), el("a", { href: runPath(r) }, r)))),
      el("p", { class: "note" }, "Click a point to open its step; drag to pan, scroll to zoom. Dashed red: the alarm thresholds of drift_settings."),
      el("div", { class: "charts", id: "charts-slot" }));
    const s = data.settings;
    const open = (d) => { if (d.run !== undefined && d.rollout_id !== undefined) location.href = stepPath(d.run, d.rollout_id, false); };
    const charts = [
      ["reward-mean", "reward_mean per step (step_stats)", data.step_stats, "reward_mean"],
      ["zero-std", "zero_std_group_frac", data.step_stats, "zero_std_group_frac"],
      ["truncated", "truncated_frac", data.step_stats, "truncated_frac"],
      ["eval-reward", "eval reward", data.eval_reward, "eval_reward_mean"],
      ["mean-abs", "mean |lp_diff| (sample-mean, token-mean)", data.drift_steps, "mean_abs_lp_diff_smtm", s.alarm_mean_abs_lp_diff_smtm],
      ["k3", "k3 KL", data.drift_steps, "k3_kl", s.alarm_k3_kl],
      ["ess", "ESS", data.drift_steps, "ess", s.alarm_ess_min],
    ];
    for (const [id, t, rows, field, threshold] of charts) {
      if (!rows.some((r) => r[field] !== null && r[field] !== undefined)) continue;
      await draw(id, perStepSpec(t, rows, field, shown, threshold), open);
    }
    main.appendChild(el("details", { class: "card", id: "step-list" }, el("summary", {}, "Every step"),
      data.runs.map((r) => el("p", {}, swatch(r), r + ": ",
        [...new Set(data.step_stats.filter((x) => x.run === r).map((x) => x.rollout_id))].map((st) =>
          el("a", { href: stepPath(r, st, false), class: "badge step-link" }, String(st)))))));
    const metricNames = [...new Set(data.metrics.map((m) => m.metric))].sort();
    if (metricNames.length) {
      const picked = params().get("metric") || metricNames[0];
      main.appendChild(el("h2", {}, "Logged metrics (metrics)"));
      const select = el("select", { "aria-label": "metric", onchange: (e) => { setParam("metric", e.target.value); drawMetric(e.target.value); } },
        metricNames.map((m) => el("option", { value: m, selected: m === picked }, m)));
      main.appendChild(el("div", { class: "controls" }, select));
      main.appendChild(el("div", { id: "metric-slot" }));
      async function drawMetric(name) {
        document.getElementById("metric-slot").replaceChildren();
        const rows = data.metrics.filter((m) => m.metric === name).map((m) => ({ run: m.run, rollout_id: m.step, value: m.value }));
        await draw("metric", perStepSpec(name, rows, "value", shown), open);
      }
      await drawMetric(metricNames.includes(picked) ? picked : metricNames[0]);
    }
  }

  async function stepPage(run, step) {
    const evaluation = params().get("eval") === "1";
    const data = await api("/api/step", { run, step, eval: evaluation ? 1 : 0 });
    crumbs([["runs", "/"], [run, runPath(run)], ["step " + step + (evaluation ? " (eval)" : ""), null]]);
    main.replaceChildren(el("h1", {}, run + " · step " + step + (evaluation ? " · eval" : "")));
    const steps = data.steps.map((s) => el("a", { href: stepPath(run, s.rollout_id, s.evaluation), class: "badge" },
      s.rollout_id + (s.evaluation ? " eval" : "")));
    main.appendChild(el("p", {}, "Steps: ", steps));
    if (data.numbers || data.drift) {
      const n = data.numbers || {}, d = data.drift || {};
      const facts = { samples: n.n_samples, reward_mean: n.reward_mean, reward_std: n.reward_std,
        truncated_frac: n.truncated_frac, zero_std_group_frac: n.zero_std_group_frac,
        mixed_version_frac: n.mixed_version_frac, drift_tokens: d.tokens, mean_abs_lp_diff_smtm: d.mean_abs_lp_diff_smtm,
        k3_kl: d.k3_kl, ess: d.ess, veto_seq_frac: d.veto_seq_frac, outlier_seq_frac: d.outlier_seq_frac,
        geo_reject_seq_frac: d.geo_reject_seq_frac, seq_ratio_reject_seq_frac: d.seq_ratio_reject_seq_frac,
        icepop_seq_frac: d.icepop_seq_frac };
      main.appendChild(el("div", { class: "card", id: "step-numbers" }, table(Object.keys(facts), [facts])));
    }
    main.appendChild(el("h2", {}, "Samples"));
    // Every column of sample_stats and drift_samples the server sends (the step's run and
    // rollout_id are in the heading): the ones read most first.
    const first = ["batch_position", "sample_index", "group_index", "raw_reward", "reward", "response_length",
      "truncated", "remove_sample", "evaluation", "staleness", "mixed_version", "turns", "mean_abs_lp_diff",
      "max_abs_lp_diff", "k3_kl_clamped", "mean_entropy", "vetoed"];
    const sent = data.samples.length ? Object.keys(data.samples[0]).filter((c) => c !== "run" && c !== "rollout_id") : first;
    const columns = first.filter((c) => sent.includes(c)).concat(sent.filter((c) => !first.includes(c)));
    const controls = el("div", { class: "controls" });
    const slot = el("div", { id: "samples" });
    main.appendChild(controls); main.appendChild(slot);
    const state = { sort: params().get("sort") || "batch_position", desc: params().get("desc") === "1",
      filter: params().get("filter") || "", page: Number(params().get("page") || 0) };
    const perPage = 50;
    const filter = el("input", { type: "search", placeholder: "filter rows", value: state.filter, "aria-label": "filter samples",
      oninput: (e) => { state.filter = e.target.value; state.page = 0; render(); } });
    controls.appendChild(filter);
    function render() {
      setParam("sort", state.sort === "batch_position" ? null : state.sort);
      setParam("desc", state.desc ? "1" : null); setParam("filter", state.filter || null);
      setParam("page", state.page ? String(state.page) : null);
      const needle = state.filter.toLowerCase();
      let rows = data.samples.filter((r) => !needle || columns.some((c) => fmt(r[c]).toLowerCase().includes(needle)));
      rows = rows.slice().sort((a, b) => {
        const x = a[state.sort], y = b[state.sort];
        if (x === y) return a.batch_position - b.batch_position;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * (state.desc ? -1 : 1);
      });
      const pages = Math.max(1, Math.ceil(rows.length / perPage));
      state.page = Math.min(state.page, pages - 1);
      const shown = rows.slice(state.page * perPage, (state.page + 1) * perPage);
      const pager = el("div", { class: "controls" },
        el("button", { disabled: state.page === 0, onclick: () => { state.page--; render(); } }, "previous"),
        "page " + (state.page + 1) + " of " + pages + " · " + rows.length + " sample(s)",
        el("button", { disabled: state.page >= pages - 1, onclick: () => { state.page++; render(); } }, "next"));
      slot.replaceChildren(pager, table(columns, shown, {
        sorted: { column: state.sort, desc: state.desc },
        onSort: (c) => { state.desc = state.sort === c ? !state.desc : false; state.sort = c; render(); },
        rowClass: (r) => [r.remove_sample ? "removed" : "", r.evaluation ? "eval" : ""].join(" ").trim() || undefined,
        cell: (c, r) => c === "batch_position"
          ? el("a", { href: samplePath(run, step, r.batch_position, evaluation), class: "sample-link" }, String(r.batch_position))
          : c === "remove_sample" && r.remove_sample ? el("span", { class: "badge warning" }, "removed")
          : c === "evaluation" && r.evaluation ? el("span", { class: "badge" }, "eval") : fmt(r[c]),
      }));
    }
    render();
    main.appendChild(el("p", { class: "note" }, "Every column of sample_stats and drift_samples. Struck-through rows are removed samples (remove_sample), eval samples say eval; a column's header sorts by it, the box keeps the rows holding its text, 50 a page."));
    main.appendChild(el("h2", {}, "Reward against length"));
    main.appendChild(el("div", { id: "scatter-slot" }));
    const reward = data.samples.some((r) => r.raw_reward !== null) && !evaluation ? "raw_reward" : "reward";
    await draw("scatter", {
      data: { values: data.samples.filter((r) => r[reward] !== null) },
      mark: { type: "point", filled: true, tooltip: true, cursor: "pointer" },
      encoding: { x: { field: "response_length", type: "quantitative" }, y: { field: reward, type: "quantitative" },
        color: { field: "remove_sample", type: "nominal", title: "removed" },
        tooltip: [{ field: "batch_position" }, { field: "sample_index" }, { field: reward }, { field: "response_length" }, { field: "mean_abs_lp_diff" }] },
    }, (d) => { location.href = samplePath(run, step, d.batch_position, evaluation); });
    main.appendChild(el("h2", {}, "Groups (group_stats)"));
    main.appendChild(table(["group_index", "n", "reward_mean", "reward_std", "response_length_mean", "zero_std"], data.groups));
    const b = data.breakdowns;
    const names = { position: "By response position (drift_by_position)", turn: "By turn (drift_by_turn)",
      prob: "By probability and entropy (drift_by_prob)", weight_version: "By weight version (drift_by_weight_version)",
      token: "Tokens with the largest share of k3 (drift_by_token)" };
    Object.keys(names).forEach((k) => {
      if (!b[k] || !b[k].length) return;
      main.appendChild(el("details", { class: "card" }, el("summary", {}, names[k]),
        table(Object.keys(b[k][0]), b[k])));
    });
  }

  function tokenValue(v) { return typeof v === "number" ? v : null; }
  function reasonOf(mask, v) {
    if (!(mask > 0)) return "masked (loss_mask = 0): no value, drawn blank";
    if (v === null || v === undefined) return "no value: NULL in the lake (the dump holds none for this token)";
    if (typeof v === "string") return "no value: " + v + " in the dump";
    return null;
  }
  function percentile(sorted, p) {
    if (!sorted.length) return null;
    const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p / 100 * sorted.length) - 1));
    return sorted[i];
  }
  // The colour scale of one statistic over the sample's covered tokens with a value.
  function scaleOf(stat, spec, tokens) {
    const values = [];
    tokens[stat].forEach((v, i) => { if (tokens.loss_mask[i] > 0 && tokenValue(v) !== null) values.push(v); });
    if (spec.signed) {
      const c = spec.centre;
      const spread = values.map((v) => Math.abs(v - c)).sort((a, b) => a - b);
      const clip = percentile(spread, CLIP_PERCENTILE) || 1e-12;
      const colours = ramp(DIVERGING);
      return { covered: values.length, low: c - clip, high: c + clip, clip,
        beyond: spread.filter((x) => x > clip).length,
        colour: (v) => colours(Math.max(0, Math.min(1, (v - c) / clip / 2 + 0.5))),
        ramp: "linear-gradient(90deg," + [0, .25, .5, .75, 1].map((t) => colours(t)).join(",") + ")",
        text: "symmetric around " + c + ", clipped at ±" + fmt(clip) + " = the " + CLIP_PERCENTILE + "th percentile of |" + stat + (c ? " − " + c : "") + "|" };
    }
    const sorted = values.slice().sort((a, b) => a - b);
    const low = percentile(sorted, 100 - CLIP_PERCENTILE), high = percentile(sorted, CLIP_PERCENTILE);
    const colours = ramp(SEQUENTIAL);
    const span = high - low || 1e-12;
    return { covered: values.length, low, high, beyond: values.filter((v) => v < low || v > high).length,
      colour: (v) => colours(Math.max(0, Math.min(1, (v - low) / span))),
      ramp: "linear-gradient(90deg," + [0, .25, .5, .75, 1].map((t) => colours(t)).join(",") + ")",
      text: "clipped to [" + fmt(low) + ", " + fmt(high) + "] = its " + (100 - CLIP_PERCENTILE) + "th to " + CLIP_PERCENTILE + "th percentiles" };
  }

  async function samplePage(run, step, position) {
    const evaluation = params().get("eval") === "1";
    const data = await api("/api/sample", { run, step, position, eval: evaluation ? 1 : 0 });
    const s = data.sample, tokens = data.tokens;
    crumbs([["runs", "/"], [run, runPath(run)], ["step " + step + (evaluation ? " (eval)" : ""), stepPath(run, step, evaluation)], ["sample " + position, null]]);
    main.replaceChildren(el("h1", {}, run + " · step " + step + " · sample " + position + (evaluation ? " · eval" : "")));
    const n = data.neighbours;
    main.appendChild(el("p", { class: "controls" },
      n.previous !== null ? el("a", { href: samplePath(run, step, n.previous, evaluation), id: "previous" }, "← sample " + n.previous) : null,
      n.next !== null ? el("a", { href: samplePath(run, step, n.next, evaluation), id: "next" }, "sample " + n.next + " →") : null,
      data.other_runs.length ? el("span", { id: "other-runs" }, "same sample_index in: ", data.other_runs.map((o) =>
        el("a", { href: samplePath(o.run, step, o.batch_position, evaluation), class: "badge" }, o.run))) : null));
    const facts = ["sample_index", "group_index", "raw_reward", "reward", "response_length", "prompt_length", "truncated",
      "remove_sample", "status", "staleness", "mixed_version", "turns", "tool_calls", "mean_abs_lp_diff", "max_abs_lp_diff", "mean_entropy"];
    main.appendChild(el("div", { class: "card", id: "sample-facts" }, table(facts, [s])));

    // The token strip.
    const present = Object.keys(data.stats).filter((k) => tokens[k].some((v) => v !== null));
    let stat = params().get("stat");
    if (!present.includes(stat)) stat = present.includes("lp_diff") ? "lp_diff" : present[0];
    let windowName = WINDOWS[params().get("window")] ? params().get("window") : "1k";
    let from = Number(params().get("from") || 0) || 0;
    main.appendChild(el("h2", {}, "Tokens"));
    const controls = el("div", { class: "controls" });
    const legend = el("div", { class: "legend", id: "legend" });
    const strip = el("div", { class: "strip", id: "strip" });
    main.append(controls, legend, strip);
    function renderStrip() {
      setParam("stat", stat); setParam("window", windowName); setParam("from", from ? String(from) : null);
      const total = tokens.position.length, size = Math.min(WINDOWS[windowName], total);
      from = Math.max(0, Math.min(from, Math.max(0, total - size)));
      const to = Math.min(total, from + size);
      controls.replaceChildren(
        el("label", {}, "colour by ", el("select", { id: "stat", onchange: (e) => { stat = e.target.value; renderStrip(); drawProfile(); } },
          present.map((k) => el("option", { value: k, selected: k === stat }, k)))),
        el("label", {}, "window ", el("select", { id: "window", onchange: (e) => { windowName = e.target.value; from = 0; renderStrip(); } },
          Object.keys(WINDOWS).map((k) => el("option", { value: k, selected: k === windowName }, k)))),
        el("button", { disabled: from === 0, onclick: () => { from = Math.max(0, from - size); renderStrip(); } }, "← earlier"),
        "tokens " + (total ? from : 0) + "–" + Math.max(0, to - 1) + " of " + total,
        el("button", { disabled: to >= total, onclick: () => { from = to; renderStrip(); } }, "later →"));
      if (!stat) { legend.replaceChildren("No statistic of this sample has a value."); strip.replaceChildren(); return; }
      const scale = scaleOf(stat, data.stats[stat], tokens);
      legend.replaceChildren(
        el("span", {}, fmt(scale.low)), el("span", { class: "ramp", style: { background: scale.ramp } }), el("span", {}, fmt(scale.high)),
        el("span", { id: "legend-text" }, stat + ": colour " + scale.text + " over the " + scale.covered + " covered tokens with a value (the whole sample); "
          + scale.beyond + " beyond it take the end colour."),
        el("span", {}, el("span", { class: "hatch" }), " no value (masked, NULL or not finite): never a colour of 0"));
      const cells = [];
      let blank = 0;
      for (let i = from; i < to; i++) {
        const v = tokens[stat][i], mask = tokens.loss_mask[i];
        const reason = reasonOf(mask, v);
        const text = tokens.text[i] === null ? "#" + tokens.token_id[i] : tokens.text[i];
        const title = "position " + tokens.position[i] + " · token " + JSON.stringify(text) + " (id " + tokens.token_id[i] + ")"
          + " · loss_mask " + mask + (tokens.turn_index[i] !== null ? " · turn " + tokens.turn_index[i] : "")
          + "\n" + (reason ? stat + ": " + reason : Object.keys(data.stats).filter((k) => tokens[k][i] !== null).map((k) => k + " = " + fmt(tokens[k][i])).join("\n"));
        const cell = el("span", { class: reason ? "tok novalue" : "tok", title, dataset: { position: tokens.position[i], state: reason ? "none" : "value" } }, text);
        if (reason) blank++; else cell.style.background = scale.colour(v);
        cells.push(cell);
      }
      strip.replaceChildren(...cells);
      strip.dataset.cells = String(cells.length); strip.dataset.blank = String(blank);
    }
    renderStrip();
    main.appendChild(el("div", { id: "profile-slot" }));
    async function drawProfile() {
      document.getElementById("profile-slot").replaceChildren();
      if (!stat) return;
      const points = [], spans = [];
      let open = null;
      tokens.position.forEach((p, i) => {
        const masked = !(tokens.loss_mask[i] > 0);
        if (masked && open === null) open = p;
        if (!masked && open !== null) { spans.push({ from: open, to: p }); open = null; }
        const v = tokenValue(tokens[stat][i]);
        if (!masked && v !== null) points.push({ position: p, value: v });
      });
      if (open !== null) spans.push({ from: open, to: tokens.position[tokens.position.length - 1] + 1 });
      // The prompt precedes response position 0: its tokens have no statistic, so it is a span.
      const prompt = s.prompt_length > 0 ? [{ from: -s.prompt_length, to: 0 }] : [];
      await draw("profile", {
        title: stat + " against position (blue: the prompt, grey: masked spans; neither has a value)",
        layer: [
          { data: { values: prompt }, mark: { type: "rect", color: "#4c78a8", opacity: 0.2 },
            encoding: { x: { field: "from", type: "quantitative", title: "response position (the prompt below 0)" }, x2: { field: "to" } } },
          { data: { values: spans }, mark: { type: "rect", color: "#999", opacity: 0.25 },
            encoding: { x: { field: "from", type: "quantitative" }, x2: { field: "to" } } },
          { data: { values: points }, mark: { type: "line", strokeWidth: 1, tooltip: true },
            encoding: { x: { field: "position", type: "quantitative" }, y: { field: "value", type: "quantitative", title: stat } } },
        ],
      });
    }
    await drawProfile();

    main.appendChild(el("h2", {}, "Conversation"));
    main.appendChild(conversation(data.messages));
    main.appendChild(el("details", { class: "card" }, el("summary", {}, "Prompt text"), el("pre", {}, s.prompt_text === null ? "NULL" : s.prompt_text)));
    main.appendChild(el("details", { class: "card", open: true }, el("summary", {}, "Response text"), el("pre", {}, s.response_text === null ? "NULL" : s.response_text)));
    if (data.siblings.length) {
      main.appendChild(el("h2", {}, "Its group (group_index " + s.group_index + ")"));
      main.appendChild(el("div", { id: "siblings" }, table(Object.keys(data.siblings[0]), data.siblings, {
        cell: (c, r) => c === "batch_position" ? el("a", { href: samplePath(run, step, r.batch_position, evaluation) }, String(r.batch_position)) : fmt(r[c]) })));
    }
  }

  function withThinking(text) {
    const parts = String(text).split(/(<think>[\s\S]*?<\/think>)/);
    return parts.filter((p) => p).map((p) => p.startsWith("<think>") ? thinking(p.slice(7, -8)) : el("pre", {}, p));
  }
  function thinking(text) {
    return el("details", { class: "think" }, el("summary", {}, "thinking"), el("pre", {}, text));
  }
  function conversation(messages) {
    if (messages === null || messages === undefined) return el("p", { class: "note" }, "This sample holds no messages (messages_json is NULL).");
    if (!Array.isArray(messages)) return el("pre", {}, typeof messages === "string" ? messages : JSON.stringify(messages, null, 2));
    return el("div", { id: "conversation" }, messages.map((m) => {
      const role = m && typeof m === "object" ? String(m.role || "?") : "?";
      const content = m && typeof m === "object" ? m.content : m;
      const body = typeof content === "string" ? withThinking(content) : el("pre", {}, JSON.stringify(content, null, 2));
      // The reasoning some chat formats keep beside the content (`reasoning_content`) is the
      // same thinking a `<think>` block holds, folded the same way.
      const reasoning = m && typeof m === "object" && typeof m.reasoning_content === "string"
        ? thinking(m.reasoning_content) : null;
      const calls = m && m.tool_calls ? el("pre", { class: "tool-calls" }, "tool calls: " + JSON.stringify(m.tool_calls, null, 2)) : null;
      return el("div", { class: "message" }, el("div", { class: "role" }, role), reasoning, body, calls);
    }));
  }

  async function sqlPage() {
    crumbs([["runs", "/"], ["SQL", null]]);
    const q = params().get("q") || "SELECT run, rollout_id, reward_mean, mean_abs_lp_diff FROM step_stats ORDER BY ALL";
    const box = el("textarea", { id: "query", "aria-label": "SQL" }, q);
    const form = el("form", { method: "get", action: "/sql" });
    box.name = "q";
    form.append(box, el("div", { class: "controls" }, el("button", { type: "submit", id: "run-query" }, "Run")));
    main.replaceChildren(el("h1", {}, "SQL console"), el("p", { class: "note" },
      "One read-only SELECT over the lake's views (the rules of user views: no files, ATTACH, settings or extensions), with a row and a time limit."), form);
    const out = el("div", { id: "result" });
    main.appendChild(out);
    if (!params().get("q")) return;
    try {
      const result = await api("/api/sql", { q });
      const names = result.columns.map((c) => c.name);
      const rows = result.rows.map((r) => Object.fromEntries(names.map((n, i) => [n, r[i]])));
      out.append(el("p", { class: "controls" }, result.rows.length + " row(s)" + (result.truncated ? ", cut at the limit of " + result.limit : ""),
        el("a", { href: "/api/sql?" + new URLSearchParams({ q, format: "csv" }), download: downloadName("csv", result) }, "CSV"),
        el("a", { href: "/api/sql?" + new URLSearchParams({ q, format: "parquet" }), download: downloadName("parquet", result) }, "Parquet")),
        table(names, rows));
    } catch (e) {
      out.append(el("p", { class: "error", id: "sql-error" }, e.message));
    }
  }

  // The server's name for a console download (server.download_name): a cut one says so.
  function downloadName(format, result) {
    return result.truncated ? "tokenlake-query-first-" + result.limit + "-rows." + format : "tokenlake-query." + format;
  }

  // --- live: offer the steps an extraction commits meanwhile -----------------------------
  let seen = null;
  async function watch() {
    try {
      const v = await api("/api/version");
      const key = v.version + "/" + v.steps;
      if (seen === null) seen = key;
      else if (key !== seen) { const live = document.getElementById("live"); live.href = location.href; live.hidden = false; }
    } catch (e) { /* the server may be restarting; try again later */ }
  }

  async function route() {
    const parts = location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
    if (parts.length === 0) return runsPage();
    if (parts[0] === "compare") return stepsPage(urlRuns(), "Comparison");
    if (parts[0] === "sql") return sqlPage();
    if (parts[0] === "runs" && parts.length === 2) return stepsPage([parts[1]], parts[1]);
    if (parts[0] === "runs" && parts.length === 4 && parts[2] === "steps") return stepPage(parts[1], parts[3]);
    if (parts[0] === "runs" && parts.length === 6 && parts[4] === "samples") return samplePage(parts[1], parts[3], parts[5]);
    throw new Error("No page here.");
  }

  route().then(() => { document.documentElement.dataset.rendered = "done"; },
    (error) => {
      main.replaceChildren(el("p", { class: "error", id: "page-error" }, error.message));
      document.documentElement.dataset.rendered = "failed";
    });
  watch();
  setInterval(watch, 5000);
})();
