/* Jobs list: the rows of this page, refreshed in place from jobs.json. */
"use strict";
(function () {
  const table = document.getElementById("jobs-table");
  if (!table) return;
  const {el, poll} = window.Respawn;
  const FIGURES_FROM = 2;  // cells before it (id, name link) never change

  function statusCell(row) {
    const cell = el("td", {dataset: {field: "status"}}, el("span", {class: `status s-${row.status}`, text: row.status}));
    if (row.status_reason) cell.append(el("span", {class: "reason", text: row.status_reason}));
    return cell;
  }

  function progressCell(row) {
    const cell = el("td", {dataset: {field: "progress"}}, `${row.last_step}`);
    if (row.total_steps) {
      cell.append(` / ${row.total_steps} `,
        el("progress", {max: "100", value: `${row.progress_pct}`, "aria-label": `${row.progress_pct}% done`}));
    }
    return cell;
  }

  function cells(row) {
    return [
      el("td", {class: "num", dataset: {field: "id"}, text: `${row.id}`}),
      el("td", {}, el("a", {href: row.url, text: row.name})),
      el("td", {text: row.owner}),
      statusCell(row),
      progressCell(row),
      el("td", {dataset: {field: "eta"}, text: row.eta_display}),
      el("td", {class: "num", dataset: {field: "spent", exact: row.spent || ""}, text: row.spent_display}),
      el("td", {class: "num", dataset: {field: "savings", exact: row.savings || ""}, text: row.savings_display}),
      el("td", {class: "num", dataset: {field: "interruptions"}, text: `${row.interruptions}`}),
      el("td", {dataset: {field: "cloud"}, text: row.cloud || "–"}),
    ];
  }

  function render(data) {
    const body = table.tBodies[0];
    const shown = [...body.querySelectorAll("tr[data-job]")].map((tr) => tr.dataset.job);
    if (shown.join() === data.rows.map((row) => `${row.id}`).join() && shown.length) {
      // Same jobs in the same order: refresh the figures, keep the ids and name links (and keyboard focus) in place.
      body.querySelectorAll("tr[data-job]").forEach((tr, i) => {
        const fresh = cells(data.rows[i]);
        for (let c = FIGURES_FROM; c < fresh.length; c++) tr.cells[c].replaceWith(fresh[c]);
      });
      return;
    }
    const rows = data.rows.map((row) => el("tr", {dataset: {job: row.id}}, ...cells(row)));
    if (!rows.length) rows.push(el("tr", {class: "empty"}, el("td", {colspan: "10", text: "No jobs match."})));
    body.replaceChildren(...rows);
  }

  poll(table.dataset.live, render);
})();
