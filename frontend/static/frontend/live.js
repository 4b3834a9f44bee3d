/* Polling and small DOM helpers shared by the dashboard pages.
   Polls fast while the tab is visible and slowly while it is hidden; never reloads the page. */
"use strict";
window.Respawn = (function () {
  const FAST_MS = 2000, SLOW_MS = 30000;

  function poll(url, onData) {
    let timer = null, busy = false;
    async function tick() {
      timer = null;
      if (busy) return;
      busy = true;
      try {
        const response = await fetch(url, {headers: {Accept: "application/json"}, credentials: "same-origin",
                                           cache: "no-store"});
        if (response.ok) onData(await response.json());
      } catch (err) {
        /* the control plane is away for a moment: try again on the next tick */
      } finally {
        busy = false;
        schedule();
      }
    }
    function schedule() {
      clearTimeout(timer);
      timer = setTimeout(tick, document.hidden ? SLOW_MS : FAST_MS);
    }
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) { clearTimeout(timer); tick(); } else { schedule(); }
    });
    schedule();
    return {now: () => { clearTimeout(timer); tick(); }};
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children) node.append(child);
    return node;
  }

  function clock(ms, withSeconds) {
    const text = new Date(ms).toISOString().replace("T", " ");
    return (withSeconds ? text.slice(11, 19) : text.slice(5, 16)) + " UTC";
  }

  function setField(root, name, text, exact) {
    for (const node of root.querySelectorAll(`[data-field="${name}"]`)) {
      node.textContent = text;
      if (exact !== undefined) node.dataset.exact = exact === null ? "" : exact;
    }
  }

  return {poll, el, clock, setField};
})();
