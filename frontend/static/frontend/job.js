/* Job page: timeline, loss and cost charts, checkpoints, log tail and events,
   all redrawn in place from status.json. */
"use strict";
(function () {
  const {el, poll, clock, setField} = window.Respawn;
  const MARKET_COLOURS = {spot: "#1f5fbf", on_demand: "#b35900"};
  const MARKERS = {
    notice: {label: "notices", style: "triangle", colour: "#8a6d00"},
    preempted: {label: "preemptions", style: "crossRot", colour: "#b00020"},
    lost: {label: "lost", style: "crossRot", colour: "#5c0011"},
    capacity_error: {label: "capacity errors", style: "rectRot", colour: "#6b3fa0"},
    checkpoint: {label: "checkpoints", style: "circle", colour: "#1b7a35"},
  };
  const LOSS_MARKS = {
    resumed: {label: "resumes", style: "rectRot", colour: "#1b7a35"},
    preempted: {label: "preemptions", style: "crossRot", colour: "#b00020"},
    lost: {label: "lost", style: "crossRot", colour: "#5c0011"},
  };
  const LOG_MAX_LINES = 100000;  // beyond, the oldest lines leave the page (the API keeps them)
  const ms = (iso) => (iso ? Date.parse(iso) : null);
  const fixed = (value, digits) => (value === null || value === undefined ? "–" : value.toFixed(digits));
  const charts = {};
  window.respawnCharts = charts;

  function timelineData(status) {
    const now = ms(status.as_of);
    const labelOf = Object.fromEntries(status.instances.map((i) => [i.id, i.label]));
    const datasets = [{
      type: "bar", label: "instances", order: 2, borderSkipped: false, barPercentage: 0.5,
      data: status.instances.map((i) => ({x: [ms(i.start), ms(i.end) || now], y: i.label})),
      backgroundColor: status.instances.map((i) => MARKET_COLOURS[i.market] || "#555"),
    }];
    for (const [kind, look] of Object.entries(MARKERS)) {
      const points = status.markers.filter((m) => m.kind === kind && m.at && labelOf[m.instance])
        .map((m) => ({x: ms(m.at), y: labelOf[m.instance], text: m.text}));
      datasets.push({type: "scatter", label: look.label, order: 1, data: points, pointStyle: look.style,
                     pointRadius: 7, borderWidth: 2, borderColor: look.colour, backgroundColor: look.colour});
    }
    return {labels: status.instances.map((i) => i.label), datasets};
  }

  function span(status) {
    /* The job's own time range, so bars are not squeezed against the epoch. */
    const starts = status.instances.map((i) => ms(i.start)).filter((t) => t !== null);
    const now = ms(status.as_of);
    const min = starts.length ? Math.min(...starts) : now - 60000;
    const ended = status.instances.length && status.instances.every((i) => i.end);
    const max = ended ? Math.max(...status.instances.map((i) => ms(i.end))) : now;  // a finished job ends with it
    return {min, max: Math.max(max, min + 1000)};
  }

  function ticks(range) {
    const short = range.max - range.min < 3 * 3600 * 1000;
    return {callback: (v) => clock(v, short), maxTicksLimit: 6};
  }

  function makeCharts(status) {
    const range = span(status);
    charts.timeline = new Chart(document.getElementById("timeline-chart"), {
      type: "bar", data: timelineData(status),
      options: {
        indexAxis: "y", animation: false, maintainAspectRatio: false,
        scales: {x: {type: "linear", beginAtZero: false, ...range, ticks: ticks(range)},
                 y: {type: "category"}},
        plugins: {legend: {display: false}, tooltip: {callbacks: {label: (ctx) => ctx.raw.text ||
          `${clock(ctx.raw.x[0])} – ${clock(ctx.raw.x[1])}`}}},
      },
    });
    charts.loss = new Chart(document.getElementById("loss-chart"), {
      type: "line",
      data: {datasets: [
        {label: "loss", data: [], borderColor: "#1f5fbf", pointRadius: 0, borderWidth: 1.5, spanGaps: false},
        ...Object.entries(LOSS_MARKS).map(([kind, look]) => ({
          type: "scatter", label: look.label, kind, data: [], pointStyle: look.style, pointRadius: 7, borderWidth: 2,
          borderColor: look.colour, backgroundColor: look.colour})),
      ]},
      options: {animation: false, maintainAspectRatio: false, parsing: false,
                scales: {x: {type: "linear", title: {display: true, text: "step"}},
                         y: {title: {display: true, text: "loss"}}}},
    });
    const worldSize = document.getElementById("world-size-chart");
    if (worldSize) {
      charts.worldSize = new Chart(worldSize, {
        type: "line",
        data: {datasets: [{label: "nodes", data: [], borderColor: "#1f5fbf", pointRadius: 3, borderWidth: 2,
                           stepped: "before"}]},
        options: {animation: false, maintainAspectRatio: false, parsing: false,
                  plugins: {legend: {display: false}, tooltip: {callbacks: {label: (ctx) => ctx.raw.text}}},
                  scales: {x: {type: "linear", ...range, ticks: ticks(range)},
                           y: {title: {display: true, text: "nodes"}, beginAtZero: true, ticks: {precision: 0}}}},
      });
    }
    charts.cost = new Chart(document.getElementById("cost-chart"), {
      type: "line",
      data: {datasets: [
        {label: "spent", data: [], borderColor: "#1f5fbf", pointRadius: 0, borderWidth: 2},
        {label: "on-demand for the kept work", data: [], borderColor: "#b35900", borderDash: [6, 4],
         pointRadius: 0, borderWidth: 2},
      ]},
      options: {animation: false, maintainAspectRatio: false, parsing: false,
                scales: {x: {type: "linear", ticks: ticks(range)},
                         y: {title: {display: true, text: "USD"}, beginAtZero: true}}},
    });
  }

  function updateCharts(status) {
    const range = span(status);
    charts.timeline.data = timelineData(status);
    Object.assign(charts.timeline.options.scales.x, range, {ticks: ticks(range)});
    charts.timeline.update("none");
    charts.cost.options.scales.x.ticks = ticks(range);
    const [curve, ...marks] = charts.loss.data.datasets;
    curve.data = lossCurve(status.loss);
    for (const dataset of marks) dataset.data = lossMarks(status, dataset.kind);
    charts.loss.update("none");
    if (charts.worldSize) {
      /* Each size from its moment on, drawn on to the end of the job's time range. */
      const points = status.world_sizes.map((w) => ({x: ms(w.at), y: w.world_size, text: `${w.world_size}: ${w.reason}${w.resumed ? `; resumed at ${w.resumed}` : ""}`}));
      if (points.length) points.push({...points[points.length - 1], x: range.max, text: `${points[points.length - 1].y} now`});
      charts.worldSize.data.datasets[0].data = points;
      Object.assign(charts.worldSize.options.scales.x, range, {ticks: ticks(range)});
      charts.worldSize.update("none");
    }
    charts.cost.data.datasets[0].data = status.cost_curve.map((p) => ({x: ms(p.at), y: p.spent}));
    charts.cost.data.datasets[1].data = status.cost_curve.map((p) => ({x: ms(p.at), y: p.on_demand}));
    charts.cost.update("none");
  }

  function lossCurve(points) {
    /* One line per instance: a gap where the next one starts again from its checkpoint. */
    const data = [];
    points.forEach(([step, loss, instance], i) => {
      if (i && points[i - 1][2] !== instance) data.push({x: step, y: null});
      data.push({x: step, y: loss});
    });
    return data;
  }

  function lossMarks(status, kind) {
    /* A mark sits on the curve at its step: the loss reported nearest to it. */
    return status.loss_marks.filter((m) => m.kind === kind).map((m) => {
      let near = null;
      for (const [step, loss] of status.loss) {
        if (near === null || Math.abs(step - m.step) < Math.abs(near[0] - m.step)) near = [step, loss];
      }
      return {x: m.step, y: near ? near[1] : 0, text: m.text};
    });
  }

  function timelineRows(status) {
    const rows = [];
    for (const i of status.instances) {
      rows.push({at: i.start, instance: i.label, kind: "launched", text: `launched (${i.market})`});
      if (i.end) rows.push({at: i.end, instance: i.label, kind: "ended", text: `ended: ${i.end_reason || i.state}`});
    }
    const labelOf = Object.fromEntries(status.instances.map((i) => [i.id, i.label]));
    for (const m of status.markers) rows.push({at: m.at, instance: labelOf[m.instance] || `#${m.instance}`,
                                               kind: m.kind, text: m.text});
    rows.sort((a, b) => (a.at || "").localeCompare(b.at || ""));
    return rows.map((r) => el("tr", {dataset: {kind: r.kind}},
      el("td", {text: r.at ? clock(ms(r.at)) : "–"}), el("td", {text: r.instance}), el("td", {text: r.text})));
  }

  function render(status) {
    const job = status.job, money = status.money;
    const summary = document.getElementById("job-summary");
    summary.querySelector('[data-field="status"]').className = `status s-${job.status}`;
    setField(summary, "status", job.status);
    setField(summary, "reason", job.status_reason);
    const failure = document.querySelector('[data-field="failure"]');
    failure.hidden = !job.failure;
    failure.textContent = job.failure;
    const figures = document.querySelector(".figures");
    setField(figures, "progress", job.total_steps ? `${job.last_step} / ${job.total_steps}` : `${job.last_step}`);
    setField(figures, "eta", job.eta_display);
    setField(figures, "spent", money.spent_display, money.spent);
    setField(figures, "savings", money.savings_display, money.savings);
    setField(figures, "waste", money.waste_display);
    setField(figures, "waste-parts", money.waste_parts_display);
    document.getElementById("job-drills").hidden = !money.drills_display;
    setField(figures, "drills", money.drills_display || "", money.drills);
    setField(figures, "drills-parts", `${money.drills_parts_display || ""} (not in spent or savings)`);
    setField(figures, "preemptions", `${job.preemptions}`);
    setField(figures, "artifact", job.artifact_uri || "–");
    setField(figures, "artifact-digest", job.artifact_uri ? job.artifact_digest : "");
    figures.querySelector('button[data-copies="artifact-uri"]').hidden = !job.artifact_uri;
    const costError = document.querySelector('[data-field="cost-error"]');
    costError.hidden = !money.cost_error;
    costError.textContent = money.cost_error || "";
    document.getElementById("cancel-form").hidden = !job.cancellable;

    document.querySelector("#timeline-table tbody").replaceChildren(...timelineRows(status));
    document.querySelector("#checkpoints-table tbody").replaceChildren(...status.checkpoints.map((c) =>
      el("tr", {dataset: {step: c.step}},
        el("td", {class: "num", text: `${c.step}`}), el("td", {text: c.kind}), el("td", {text: clock(ms(c.committed_at))}),
        el("td", {dataset: {field: "tiers"}, text: c.tiers.join(" + ")}),
        el("td", {}, el("span", {class: `validation v-${c.validation}`, text: c.validation}),
           c.validation_message ? ` ${c.validation_message}` : ""),
        el("td", {class: "num", text: fixed(c.reference_loss, 5)}), el("td", {class: "num", text: fixed(c.validation_loss, 5)}),
        el("td", {class: "num", text: fixed(c.stall_s, 3)}))));
    document.getElementById("events").replaceChildren(...status.events.map((e) =>
      el("li", {}, el("time", {datetime: e.at, text: clock(ms(e.at))}), " ",
         e.to ? `${e.from || "–"} → ${e.to}: ${e.message}` : e.message)));
    updateCharts(status);
  }

  const log = document.getElementById("log");
  const logState = {after: 0, lines: [], dropped: 0, busy: false};

  async function readLog() {
    /* From the first line on: every answer is a bounded batch past the last one read. */
    if (logState.busy) return;
    logState.busy = true;
    try {
      for (;;) {
        const response = await fetch(`${log.dataset.live}?after=${logState.after}`, {
          headers: {Accept: "application/json"}, credentials: "same-origin", cache: "no-store"});
        if (!response.ok) return;
        const answer = await response.json();
        logState.after = answer.next;
        if (answer.lines.length) showLog(answer.lines);
        if (!answer.more) return;
      }
    } catch (err) {
      /* the control plane is away for a moment: the next poll reads on from the same line */
    } finally {
      logState.busy = false;
    }
  }

  function showLog(lines) {
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    logState.lines.push(...lines);
    const over = logState.lines.length - LOG_MAX_LINES;
    if (over > 0) {
      logState.lines.splice(0, over);
      logState.dropped += over;
    }
    const note = logState.dropped ? [`… ${logState.dropped} earlier lines not shown here`] : [];
    log.textContent = [...note, ...logState.lines].join("\n");
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  // The page comes with the summary only; the first answer draws the charts, later ones redraw them.
  const live = poll(document.getElementById("job-live").dataset.live, (status) => {
    if (!charts.timeline) makeCharts(status);
    render(status);
    readLog();
  });
  live.now();

  for (const button of document.querySelectorAll("button[data-copies]")) {
    // The whole path, as the page shows it, onto the clipboard (the page writes no text of its own there).
    button.addEventListener("click", async () => {
      const text = document.getElementById(button.dataset.copies).textContent;
      try {
        await navigator.clipboard.writeText(text);
        button.textContent = "Copied";
      } catch (error) {
        getSelection().selectAllChildren(document.getElementById(button.dataset.copies));
        button.textContent = "Selected: press Ctrl+C";
      }
      setTimeout(() => { button.textContent = "Copy path"; }, 2000);
    });
  }
  const cancel = document.getElementById("cancel-form");
  cancel.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!window.confirm("Cancel this job? Its VMs are terminated.")) return;
    const token = cancel.querySelector("input[name=csrfmiddlewaretoken]").value;
    await fetch(cancel.action, {method: "POST", credentials: "same-origin",
                                headers: {"X-CSRFToken": token, Accept: "application/json"}});
    live.now();
  });
})();
