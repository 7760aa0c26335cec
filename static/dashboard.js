// durable-ui dashboard behaviour: keyboard stepping, JSON validation, tabs, charts, confirmations.
// Plain DOM code, no framework; every handler is delegated so htmx-swapped content works too.
(function () {
  "use strict";

  // True while a form under `selector` is in use: focus inside it, a field changed from what the page
  // drew, or a <details> unfolded. Polled fragments check it so a redraw never erases what someone types.
  window.formsBusy = function (selector) {
    var root = document.querySelector(selector);
    if (!root) return false;
    var active = document.activeElement;
    if (active && active !== document.body && root.contains(active) && active.closest("form")) return true;
    if (root.querySelector("form details[open]")) return true;
    return Array.prototype.some.call(root.querySelectorAll("form textarea, form input:not([type=hidden]), form select"),
      function (el) {
        if (el.type === "checkbox" || el.type === "radio") return el.checked !== el.defaultChecked;
        if (el.tagName === "SELECT") return Array.prototype.some.call(el.options, function (o) { return o.selected !== o.defaultSelected; });
        return el.value !== el.defaultValue;
      });
  };

  function stepTo(n) {
    var nav = document.querySelector("[data-stepper]");
    if (!nav || !window.htmx) return;
    var total = parseInt(nav.dataset.total, 10);
    n = Math.max(1, Math.min(total, n));
    var url = nav.dataset.url || "";
    htmx.ajax("GET", url + "?step=" + n + "&fragment=journal", {target: "#journal", swap: "outerHTML"}).then(function () {
      history.pushState({}, "", url + "?step=" + n);
    });
  }

  document.addEventListener("keydown", function (ev) {
    var t = ev.target;
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName) && t.type !== "range")) return;
    if (ev.altKey || ev.ctrlKey || ev.metaKey) return;
    if (t && t.getAttribute && t.getAttribute("role") === "tab") {  // a focused tab: ← → move between tabs only
      if (ev.key !== "ArrowRight" && ev.key !== "ArrowLeft" && ev.key !== "Home" && ev.key !== "End") return;
      var tabs = Array.prototype.slice.call(t.parentElement.querySelectorAll("[role=tab]"));
      var i = tabs.indexOf(t);
      var next = ev.key === "Home" ? 0 : ev.key === "End" ? tabs.length - 1
        : (i + (ev.key === "ArrowRight" ? 1 : -1) + tabs.length) % tabs.length;
      ev.preventDefault();
      selectTab(tabs[next]);
      tabs[next].focus();
      return;
    }
    var link = null;
    if (ev.key === "ArrowRight") link = document.getElementById("step-next");
    if (ev.key === "ArrowLeft") link = document.getElementById("step-prev");
    if (link) { ev.preventDefault(); link.click(); }
  });

  document.addEventListener("change", function (ev) {
    if (ev.target.matches("[data-step-slider]")) stepTo(parseInt(ev.target.value, 10));
    if (ev.target.matches("[data-enables]")) {
      var target = document.getElementById(ev.target.dataset.enables);
      if (target) target.disabled = !ev.target.checked;
    }
    if (ev.target.matches("[data-select-all]")) {
      document.querySelectorAll("input[name=run_ids]").forEach(function (c) { c.checked = ev.target.checked; });
    }
  });
  document.addEventListener("input", function (ev) {
    if (ev.target.matches("[data-step-slider]")) {
      var out = document.getElementById("step-number");
      if (out) out.textContent = ev.target.value;
    }
    if (ev.target.matches("textarea[data-json]")) validateJson(ev.target);
  });

  // Client-side half of the JSON editor's validation (the server checks again).
  function validateJson(area) {
    var msg = area.parentElement.querySelector(".json-error") || area.nextElementSibling;
    var text = area.value.trim();
    var error = "";
    if (text) { try { JSON.parse(text); } catch (e) { error = "Not valid JSON: " + e.message; } }
    area.setCustomValidity(error);
    area.setAttribute("aria-invalid", error ? "true" : "false");
    if (msg && msg.classList.contains("json-error")) msg.textContent = error;
    return !error;
  }
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var ok = true;
    form.querySelectorAll("textarea[data-json]").forEach(function (a) { ok = validateJson(a) && ok; });
    if (!ok) { ev.preventDefault(); ev.stopPropagation(); return; }
    if (form.dataset.confirm === "bulk") {
      var n = form.querySelectorAll("input[name=run_ids]:checked").length;
      var action = ev.submitter ? ev.submitter.value : "act on";
      if (!window.confirm(action + " " + n + " selected run(s)? This cannot be undone.")) ev.preventDefault();
    }
    if (ev.submitter && ev.submitter.dataset.confirmText && !window.confirm(ev.submitter.dataset.confirmText)) {
      ev.preventDefault();
    }
  }, true);
  document.addEventListener("htmx:validation:validate", function (ev) {
    if (ev.target.matches && ev.target.matches("textarea[data-json]")) validateJson(ev.target);
  });

  // Tabs (ARIA tablist): click or ← → within the tab list.
  // "Compare the two selected" (runs list): a plain link to the compare page, never the bulk form's POST.
  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest && ev.target.closest("[data-compare-url]");
    if (!btn) return;
    var ids = Array.prototype.map.call(document.querySelectorAll("input[name=run_ids]:checked"), function (c) { return c.value; });
    if (ids.length !== 2) {
      var flash = document.getElementById("flash");
      if (flash) { flash.textContent = "Select exactly two runs to compare (" + ids.length + " selected)."; flash.className = "msg warning"; flash.hidden = false; }
      return;
    }
    window.location.href = btn.dataset.compareUrl + "?a=" + encodeURIComponent(ids[0]) + "&b=" + encodeURIComponent(ids[1]);
  });
  document.addEventListener("click", function (ev) {
    var tab = ev.target.closest && ev.target.closest("[role=tab]");
    if (tab) selectTab(tab);
  });
  var chosenTab = null;  // kept across a redraw of the tabs (the window of steps moved)
  function selectTab(tab) {
    chosenTab = tab.id;
    var list = tab.parentElement;
    list.querySelectorAll("[role=tab]").forEach(function (t) {
      var on = t === tab;
      t.setAttribute("aria-selected", on ? "true" : "false");
      t.tabIndex = on ? 0 : -1;
      var panel = document.getElementById(t.getAttribute("aria-controls"));
      if (panel) panel.hidden = !on;
    });
  }

  function drawCharts(root) {
    if (!window.Plotly) return;
    var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
    (root || document).querySelectorAll("[data-chart]").forEach(function (el) {
      if (el.dataset.drawn) return;
      var src = document.getElementById(el.dataset.chart);
      if (!src) return;
      var fig = JSON.parse(src.textContent);
      if (dark) {
        fig.layout.font = {color: "#d8dbe0"};
        ["xaxis", "yaxis", "yaxis2"].forEach(function (ax) {
          if (ax === "yaxis2" && !fig.layout.yaxis2) return;
          fig.layout[ax] = Object.assign({gridcolor: "#2c313a", zerolinecolor: "#3a404b"}, fig.layout[ax] || {});
        });
      }
      Plotly.newPlot(el, fig.data, fig.layout, {displaylogo: false, responsive: true});
      el.dataset.drawn = "1";
      if (fig.layout.meta && fig.layout.meta.click === "step") {
        // the timeline: a click on a bar opens that bar's step in the stepper (its position is the customdata)
        el.on("plotly_click", function (ev) {
          var point = ev && ev.points && ev.points[0];
          var position = point ? parseInt(point.customdata, 10) : NaN;
          if (position > 0) stepTo(position);
        });
      }
    });
  }
  window.addEventListener("load", function () { drawCharts(document); });

  // The stepper moved: move the timeline's mark to its step. The chart carries each step's time range
  // and each bar's step range (charts.waterfall), so no request is needed.
  function markStep(position) {
    var el = document.getElementById("timeline-chart");
    var meta = el && el.layout && el.layout.meta;
    if (!meta || !window.Plotly || !(position > 0) || meta.current === position) return;
    meta.current = position;
    var widths = el.data.map(function (trace) {
      return ((trace.meta && trace.meta.ranges) || []).map(function (r) {
        return r[0] !== null && r[0] <= position && position <= (r[1] || r[0]) ? 2 : 0;
      });
    });
    Plotly.restyle(el, {"marker.line.width": widths});
    var times = meta.steps && meta.steps[String(position)];
    Plotly.relayout(el, {shapes: times ? [Object.assign({}, meta.band, {x0: times[0], x1: times[1]})] : []});
  }

  // On a phone the navigation folds behind "Menu" (the CSS shows the button only on narrow screens).
  function foldNav(folded) {
    var top = document.querySelector(".top");
    var toggle = document.getElementById("nav-toggle");
    if (!top || !toggle) return;
    top.classList.toggle("folded", folded);
    toggle.setAttribute("aria-expanded", folded ? "false" : "true");
  }
  document.addEventListener("DOMContentLoaded", function () { foldNav(true); });
  document.addEventListener("click", function (ev) {
    var toggle = ev.target.closest && ev.target.closest("[data-nav-toggle]");
    if (toggle) foldNav(toggle.getAttribute("aria-expanded") === "true");
  });

  // htmx does not swap error responses: say what happened instead of doing nothing.
  document.addEventListener("htmx:responseError", function (ev) {
    var xhr = ev.detail.xhr;
    var flash = document.getElementById("flash");
    if (!flash) return;
    var why = xhr.status === 403 ? "Refused: your role (or the read-only switch) does not allow this."
      : xhr.status === 404 ? "Not found: the run may have been purged."
      : "The server answered " + xhr.status + "; nothing was changed by this page.";
    flash.textContent = why;
    flash.className = "msg error";
    flash.hidden = false;
  });
  document.addEventListener("htmx:sendError", function () {
    var flash = document.getElementById("flash");
    if (flash) { flash.textContent = "Cannot reach the server; retrying on the next poll."; flash.className = "msg warning"; flash.hidden = false; }
  });
  // htmx:load fires on swapped-in content once it is in the page (an outerHTML swap's afterSettle fires
  // on the element it replaced, which no longer bubbles to document)
  document.addEventListener("htmx:load", function (ev) {
    drawCharts(ev.target);  // a swapped-in timeline
    var shown = ev.target.querySelector && ev.target.querySelector("#step-number");
    if (shown) markStep(parseInt(shown.textContent, 10));  // the stepper was swapped: it shows another step
    var tab = chosenTab && document.getElementById(chosenTab);
    if (tab && ev.target.contains(tab) && tab.getAttribute("aria-selected") !== "true") selectTab(tab);
  });
})();
