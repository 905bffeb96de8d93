// The foqs console's own script (no inline scripts: the pages' CSP forbids them).
// - Refresh: every data-refresh-ms, unless paused or the tab is hidden, the parts of the
//   page marked hx-trigger="foqsrefresh from:body" reload themselves (htmx), and the
//   overview's chart reloads its series from /api/v1/series.
// - Pause: the header's button; remembered in localStorage.
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-refresh-ms") || "2000", 10);
  var button = document.getElementById("pause");
  var paused = localStorage.getItem("foqs.paused") === "1";
  var chart = null;

  function label() {
    if (button) {
      button.textContent = paused ? "Resume refresh" : "Pause refresh";
      button.setAttribute("aria-pressed", paused ? "true" : "false");
    }
  }

  function loadChart() {
    var el = document.getElementById("chart");
    if (!el || typeof uPlot === "undefined") return;
    // From the origin: a page opened as http://user:pass@host/ would give fetch a URL
    // with credentials, which it refuses.
    fetch(new URL(el.getAttribute("data-src"), location.origin), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) {
        if (!s) return;
        var data = [s.t, s.enqueued, s.delivered, s.acked];
        if (chart) { chart.setData(data); return; }
        var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
        var axis = { stroke: dark ? "#98a2b3" : "#5f6b7a", grid: { stroke: dark ? "#2a3039" : "#eceff3" } };
        chart = new uPlot({
          width: Math.max(300, el.clientWidth),
          height: 220,
          axes: [axis, Object.assign({ label: "items/s" }, axis)],
          series: [
            {},
            { label: "enqueued/s", stroke: "#2563eb", width: 2 },
            { label: "delivered/s", stroke: "#b26a00", width: 2 },
            { label: "acked/s", stroke: "#2e7d32", width: 2 }
          ]
        }, data, el);
      })
      .catch(function () {});
  }

  function refresh() {
    if (paused || document.hidden) return;
    if (typeof htmx !== "undefined") htmx.trigger(body, "foqsrefresh");
    loadChart();
  }

  if (button) {
    button.addEventListener("click", function () {
      paused = !paused;
      localStorage.setItem("foqs.paused", paused ? "1" : "0");
      label();
      if (!paused) refresh();
    });
  }
  document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
  label();
  loadChart();
  setInterval(refresh, every);
})();
