/* Savings report: the cumulative spend, on-demand cost of the same work and savings, drawn
   as the job page draws its cost chart (Chart.js, time in ms on a linear axis). */
"use strict";
(function () {
  const {clock} = window.Respawn;
  const source = document.getElementById("report-cumulative");
  const canvas = document.getElementById("savings-chart");
  if (!source || !canvas) return;
  const points = JSON.parse(source.textContent);
  const at = points.map((p) => Date.parse(p.at));
  const series = (key) => points.map((p, i) => ({x: at[i], y: p[key]}));
  const short = at.length > 1 && at[at.length - 1] - at[0] < 3 * 24 * 3600 * 1000;
  const day = (ms) => new Date(ms).toISOString().slice(0, 10);
  window.respawnCharts = {savings: new Chart(canvas, {
    type: "line",
    data: {datasets: [
      {label: "spent", data: series("spent"), borderColor: "#1f5fbf", pointRadius: 0, borderWidth: 2},
      {label: "on-demand for the same work", data: series("on_demand"), borderColor: "#b35900", borderDash: [6, 4],
       pointRadius: 0, borderWidth: 2},
      {label: "saved", data: series("savings"), borderColor: "#1b7a35", backgroundColor: "rgba(27,122,53,0.12)",
       fill: "origin", pointRadius: 0, borderWidth: 2},
    ]},
    options: {animation: false, maintainAspectRatio: false, parsing: false,
              scales: {x: {type: "linear", ticks: {callback: (v) => (short ? clock(v, true) : day(v)), maxTicksLimit: 8}},
                       y: {title: {display: true, text: "USD"}}}},
  })};
})();
