// Draws every chart of the tokenlake report from the JSON in #report-data, offline.
// Vega, Vega-Lite and Vega-Embed come from the inline bundle (window.vegaEmbed).
// After drawing, each chart element gets data-marks (drawn mark items) and the document
// gets data-rendered="done" (or "failed"), which the browser test reads.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const STATES = ["masked", "no log-prob pair", "non-finite", "covered"];
  const views = [];
  // Each drawn chart's Vega view by element id, for the browser test to read scales and marks.
  window.reportViews = {};

  // One row per response token from the per-field arrays of a worst sample. `position` is
  // left out when it is the index, `text` when no token has one (report.py's _compact).
  function stripRows(cells) {
    const rows = new Array(cells.status.length);
    for (let i = 0; i < rows.length; i++) {
      const text = cells.text ? cells.text[i] : null;
      rows[i] = {
        position: cells.position ? cells.position[i] : i,
        token: text === null ? "#" + cells.token_id[i] : text,
        train: cells.train[i],
        rollout: cells.rollout[i],
        delta: cells.delta[i],
        status: cells.status[i],
        state: STATES[cells.status[i]],
      };
    }
    return rows;
  }

  // Mark items drawn in a view's scenegraph (SVG or canvas alike).
  function countMarks(scene, type) {
    let n = 0;
    (function walk(node) {
      if (!node || !node.items) return;
      if (node.marktype && node.marktype !== "group" && node.role === "mark") {
        if (!type || node.marktype === type) n += node.items.length;
        return;
      }
      node.items.forEach(walk);
    })(scene);
    return n;
  }

  function dark() {
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  }

  // A fixed-width chart (chart.fit > 0) is narrowed to its card (a strip's height alike).
  // The card is measured, not the chart's element, which takes its drawn chart's width.
  function fitted(chart, element, spec) {
    const card = element.parentElement, style = getComputedStyle(card);
    const room = card.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight)
      - chart.fit;
    if (!chart.fit || !spec.width || spec.width <= room || room < 60) return spec;
    const scale = room / spec.width;
    const height = chart.aspect ? Math.max(7, Math.floor(spec.height * scale)) : spec.height;
    return Object.assign(spec, { width: Math.floor(room), height });
  }

  // Legends below the plot: beside it they ran past a card's edge.
  const CONFIG = { background: null, legend: { orient: "bottom", labelLimit: 300, columns: 3 } };

  function embed(chart) {
    const element = document.getElementById(chart.id);
    const spec = fitted(chart, element, Object.assign({}, chart.spec, { datasets: {} }));
    chart.datasets.forEach((name) => { spec.datasets[name] = data.datasets[name]; });
    if (chart.cells) spec.datasets[chart.datasets[0]] = stripRows(chart.cells);
    const options = { actions: false, renderer: chart.renderer, theme: dark() ? "dark" : undefined,
                      config: CONFIG };
    return vegaEmbed(element, spec, options).then((result) => {
      views.push(result);
      window.reportViews[chart.id] = result.view;
      element.dataset.marks = String(countMarks(result.view.scenegraph().root));
      if (chart.cells) element.dataset.cells = String(countMarks(result.view.scenegraph().root, "rect"));
    });
  }

  function drawAll() {
    views.splice(0).forEach((r) => r.finalize());
    document.documentElement.dataset.rendered = "drawing";
    const charts = data.charts.concat(data.strips);
    return Promise.all(charts.map((c) => embed(c).catch((error) => {
      console.error("chart " + c.id + ": " + error);
      throw error;
    }))).then(
      () => { document.documentElement.dataset.rendered = "done"; },
      () => { document.documentElement.dataset.rendered = "failed"; });
  }

  drawAll();
  // Fixed-width charts were fitted to their cards: a new window width draws them again.
  let drawnWidth = window.innerWidth, pending = null;
  window.addEventListener("resize", () => {
    clearTimeout(pending);
    pending = setTimeout(() => {
      if (window.innerWidth !== drawnWidth) { drawnWidth = window.innerWidth; drawAll(); }
    }, 250);
  });
  // A folded part's fixed-width charts had no card width to fit while closed.
  document.querySelectorAll("details.folded").forEach((d) => d.addEventListener("toggle", () => {
    if (d.open && d.querySelector(".strip")) drawAll();
  }));
  if (window.matchMedia) {
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", drawAll);
  }
})();
