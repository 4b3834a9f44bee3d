/* Team overview: the month's figures and interruptions, refreshed in place. */
"use strict";
(function () {
  const {el, poll, setField} = window.Respawn;
  const root = document.getElementById("team-live");
  if (!root) return;
  const figures = document.getElementById("team-figures");

  function render(data) {
    const money = data.money;
    if (money) {
      setField(figures, "spent", money.spent_display, money.spent);
      setField(figures, "savings", money.savings_display, money.savings);
      setField(figures, "waste", money.waste_display);
      setField(figures, "gpu_hours", money.gpu_hours);
    }
    setField(figures, "live_instances", `${data.live_instances}`);
    const rows = data.interruptions.map((r) => el("tr", {},
      el("td", {text: r.cloud}), el("td", {text: r.zone}), el("td", {text: r.instance_type}),
      el("td", {text: r.kind_name}), el("td", {class: "num", text: `${r.count}`})));
    if (!rows.length) rows.push(el("tr", {class: "empty"}, el("td", {colspan: "5", text: "None this month."})));
    document.querySelector("#interruptions-table tbody").replaceChildren(...rows);
  }

  poll(root.dataset.live, render);
})();
