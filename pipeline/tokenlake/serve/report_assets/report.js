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

  // One row per response token from the per-field arrays of a worst sample.
  function stripRows(cells) {
    const rows = new Array(cells.position.length);
    for (let i = 0; i < rows.length; i++) {
      const text = cells.text[i];
      rows[i] = {
        position: cells.position[i],
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

  function embed(chart) {
    const element = document.getElementById(chart.id);
    const spec = Object.assign({}, chart.spec, { datasets: {} });
    chart.datasets.forEach((name) => { spec.datasets[name] = data.datasets[name]; });
    if (chart.cells) spec.datasets[chart.datasets[0]] = stripRows(chart.cells);
    const options = { actions: false, renderer: chart.renderer, theme: dark() ? "dark" : undefined,
                      config: { background: null } };
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
  if (window.matchMedia) {
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", drawAll);
  }
})();
