// The comparison page's rows side by side (report/comparison.py): filters, search, the view in the
// URL's fragment (report/links.py COMPARE_KEYS), a row opened to both runs' verdicts. Text only.
(function () {
  "use strict";
  var D = aipDom, el = D.el, f3 = D.f3, raw = D.raw;
  var data = JSON.parse(document.getElementById("aip-compare-data").textContent);
  var root = document.getElementById("sbs");
  var KEYS = ["metric", "changed", "q", "open"];
  var PAGE = 100, shown = PAGE, openId = null;
  var CHANGE = {label: "label changed", scored: "scored in one run", score: "score changed", same: "same"};
  var metaBy = {}; data.metrics.forEach(function (m) { metaBy[m.metric] = m; });
  function verdictsText(vs) { return (vs || []).map(function (v) { return [v.l, v.r, v.e, v.da, v.db].join("\n"); }).join("\n"); }
  data.rows.forEach(function (r, i) {
    r.i = i;
    var parts = [r.id, r.a.label, r.b.label];
    if (r.v) r.v.forEach(function (it) { parts.push(it.t, it.ax, verdictsText(it.a), verdictsText(it.b)); });
    r.blob = parts.filter(function (x) { return x; }).join("\n").toLowerCase();
  });
  data.only.forEach(function (r) { r.blob = [r.id, r.label].filter(function (x) { return x; }).join("\n").toLowerCase(); });

  var c = {};
  var bar = el("div", {"class": "controls"});
  function control(label, node) { var l = el("label", null, label + " "); l.appendChild(node); return l; }
  c.metric = el("select", {"data-filter": "metric"});
  c.metric.appendChild(el("option", {value: ""}, "all metrics"));
  data.metrics.forEach(function (m) { c.metric.appendChild(el("option", {value: m.metric}, m.metric)); });
  c.changed = el("input", {type: "checkbox", "data-filter": "changed"});
  c.search = el("input", {type: "search", placeholder: "search ids, labels, reasoning", "data-filter": "search"});
  bar.appendChild(control("metric", c.metric)); bar.appendChild(control("changed only", c.changed)); bar.appendChild(c.search);
  root.appendChild(bar);
  var counts = el("p", {"class": "muted", id: "sbs-counts"}); root.appendChild(counts);
  var count = el("p", {"class": "count", id: "sbs-count"}); root.appendChild(count);
  var table = el("table", {"class": "rows", id: "sbs-rows"}); root.appendChild(table);
  var more = el("button", {type: "button", id: "sbs-more"}, "show more"); root.appendChild(more);
  var onlyHead = el("h3", {id: "sbs-only-head"}, "Rows in one run only"); root.appendChild(onlyHead);
  var onlyTable = el("table", {"class": "rows", id: "sbs-only"}); root.appendChild(onlyTable);

  function inMetric(m) { return !c.metric.value || m === c.metric.value; }
  function matches(r) {
    var q = c.search.value.trim().toLowerCase();
    return inMetric(r.m) && (!c.changed.checked || r.kind !== "same") && (!q || r.blob.indexOf(q) >= 0);
  }
  function say() {
    counts.textContent = data.metrics.filter(function (m) { return inMetric(m.metric); }).map(function (m) {
      var s = m.metric + ": " + m.both + " rows in both runs, " + m.changed + " changed (" + m.label + " labels), " +
        m.only_a + " only in A, " + m.only_b + " only in B";
      if (m.shown < m.both) s += "; the " + m.shown + " first (the differences first) are in this file";
      return s;
    }).join("\n");
    document.querySelectorAll("#compare-scores tr.score").forEach(function (tr) {  // the scores table follows the metric
      tr.style.display = inMetric(tr.getAttribute("data-metric")) ? "" : "none";
    });
  }
  function sideCells(tr, s, side) {
    var cls = "run-" + side;
    tr.appendChild(el("td", {"class": "num " + cls, "data-field": "score_" + side, "data-value": raw(s.score)}, f3(s.score)));
    tr.appendChild(el("td", {"class": cls, "data-field": "label_" + side}, s.label));
    tr.appendChild(el("td", {"class": "num " + cls, "data-field": "judged_" + side, "data-judged": raw(s.nj), "data-failed": raw(s.nf)},
      raw(s.nj) + " / " + raw(s.nf)));
    tr.appendChild(el("td", {"class": cls + (s.status === "error" ? " err" : s.status === "ok" ? "" : " muted"), "data-field": "status_" + side}, s.status));
  }
  function links(td, pairs) {
    pairs.forEach(function (p) {
      if (!p[1]) return;
      var a = el("a", {href: p[1], "data-link": p[0]}, "in " + p[0]);
      a.addEventListener("click", function (e) { e.stopPropagation(); });
      td.appendChild(a); td.appendChild(document.createTextNode(" "));
    });
  }
  function render() {
    say();
    var rs = data.rows.filter(matches);
    var at = openId === null ? -1 : rs.findIndex(function (r) { return r.id === openId; });
    if (at >= shown) shown = (Math.floor(at / PAGE) + 1) * PAGE;
    count.textContent = rs.length + " of " + data.rows.length + " rows match";
    count.setAttribute("data-matching", rs.length);
    table.textContent = "";
    var head = el("tr");
    [["metric"], ["input id"], ["A score", "run-a"], ["A label", "run-a"], ["A judged / excluded", "run-a"], ["A status", "run-a"],
      ["B score", "run-b"], ["B label", "run-b"], ["B judged / excluded", "run-b"], ["B status", "run-b"], ["diff"], ["change"], ["open"]]
      .forEach(function (h) { head.appendChild(el("th", h[1] ? {"class": h[1]} : null, h[0])); });
    table.appendChild(head);
    rs.slice(0, shown).forEach(function (r) {
      var tr = el("tr", {"class": "row", "data-metric": r.m, "data-input-id": r.id, "data-change": r.kind});
      tr.appendChild(el("td", null, r.m.replace(/^llm\./, "")));
      tr.appendChild(el("td", null, r.id));
      sideCells(tr, r.a, "a"); sideCells(tr, r.b, "b");
      tr.appendChild(el("td", {"class": "num", "data-field": "diff", "data-value": raw(r.d)}, D.signed(r.d)));
      tr.appendChild(el("td", {"class": "change", "data-field": "change"}, CHANGE[r.kind]));
      var lt = el("td", {"data-field": "links"}); links(lt, [["A", r.la], ["B", r.lb]]); tr.appendChild(lt);
      tr.addEventListener("click", function () { toggle(tr, r); openId = tr.classList.contains("open") ? r.id : null; write(); });
      table.appendChild(tr);
    });
    var open = at >= 0 ? table.querySelector("tr.row:nth-child(" + (at + 2) + ")") : null;
    if (open) toggle(open, rs[at]);
    more.style.display = rs.length > shown ? "" : "none";
    more.textContent = "show " + Math.min(PAGE, rs.length - shown) + " more";
    renderOnly();
  }
  function renderOnly() {
    var q = c.search.value.trim().toLowerCase();
    var rs = data.only.filter(function (r) { return inMetric(r.m) && (!q || r.blob.indexOf(q) >= 0); });
    onlyHead.textContent = "Rows in one run only (" + rs.length + ")";
    onlyTable.textContent = "";
    if (!rs.length) return;
    var head = el("tr");
    ["metric", "input id", "in run", "score", "label", "status", "open"].forEach(function (h) { head.appendChild(el("th", null, h)); });
    onlyTable.appendChild(head);
    rs.forEach(function (r) {
      var tr = el("tr", {"class": "only", "data-metric": r.m, "data-input-id": r.id, "data-side": r.side});
      tr.appendChild(el("td", null, r.m.replace(/^llm\./, ""))); tr.appendChild(el("td", null, r.id));
      tr.appendChild(el("td", null, r.side.toUpperCase()));
      tr.appendChild(el("td", {"class": "num", "data-field": "score", "data-value": raw(r.score)}, f3(r.score)));
      tr.appendChild(el("td", null, r.label));
      tr.appendChild(el("td", {"class": r.status === "error" ? "err" : r.status === "ok" ? "" : "muted"}, r.status));
      var lt = el("td"); links(lt, [[r.side.toUpperCase(), r.link]]); tr.appendChild(lt);
      onlyTable.appendChild(tr);
    });
  }
  function verdictBox(v) {
    var d = el("div", {"class": "verdict-box", "data-verdict": v.k});
    var head = (v.k || "judge") + (v.c === "baseline" ? " (baseline)" : "") + ": ";
    if (v.st !== "ok") { d.appendChild(el("span", {"class": "err"}, head + v.st + (v.e ? " — " + v.e : ""))); return d; }
    var words = D.verdictWords(v), mark = words[1];
    d.appendChild(el("span", {"data-verdict-label": v.l === null ? "" : v.l}, head + words[0]));
    if (mark) d.appendChild(el("span", {"class": mark[0]}, mark[1]));
    if (v.r) d.appendChild(el("div", {"class": "txt", "data-reasoning": "1"}, v.r));
    return d;
  }
  function sideBox(vs, side) {
    var d = el("div", {"data-side": side});
    d.appendChild(el("div", {"class": "who"}, "run " + side.toUpperCase() + " (" + (side === "a" ? data.run_a : data.run_b) + ")"));
    if (vs === null || vs === undefined) d.appendChild(el("div", {"class": "muted"}, "no such comparison in this run"));
    else if (!vs.length) d.appendChild(el("div", {"class": "muted"}, "not judged"));
    else vs.forEach(function (v) { d.appendChild(verdictBox(v)); });
    return d;
  }
  function toggle(tr, r) {
    var next = tr.nextSibling;
    if (next && next.classList && next.classList.contains("detail-row")) { next.remove(); tr.classList.remove("open"); return; }
    tr.classList.add("open");
    var dr = el("tr", {"class": "detail-row"}), td = el("td", {colspan: 13, "class": "detail", "data-input-id": r.id});
    dr.appendChild(td);
    td.appendChild(el("div", null, (metaBy[r.m].name || r.m) + " · " + r.id + " · A " + f3(r.a.score) + " → B " + f3(r.b.score)));
    if (r.v === false) {
      td.appendChild(el("div", {"class": "muted", "data-verdicts-missing": "1"},
        "this row's verdicts are not in this file (its size); its links open it in each run's report"));
    } else if (!r.v.length) {
      td.appendChild(el("div", {"class": "muted"}, "no comparison judged in either run"));
    } else {
      var q = c.search.value.trim().toLowerCase();
      r.v.forEach(function (it) {
        var box = el("div", {"class": "pair"});
        if (it.ch) box.setAttribute("data-changed", "1");
        if (q && [it.t, it.ax, verdictsText(it.a), verdictsText(it.b)].join("\n").toLowerCase().indexOf(q) >= 0) box.setAttribute("data-match", "1");
        box.appendChild(el("div", {"class": "who"}, (it.ax ? it.ax + ": " : "") + it.t + (it.ch ? " · changed" : "")));
        var side = el("div", {"class": "side"});
        side.appendChild(sideBox(it.a, "a")); side.appendChild(sideBox(it.b, "b"));
        box.appendChild(side); td.appendChild(box);
      });
    }
    tr.parentNode.insertBefore(dr, tr.nextSibling);
  }
  function pick(sel, value) {
    var ok = value !== undefined && Array.prototype.some.call(sel.options, function (o) { return o.value === value; });
    sel.value = ok ? value : "";
  }
  function apply(v) {
    pick(c.metric, v.metric);
    c.changed.checked = v.changed === "1" || v.changed === "true";
    c.search.value = v.q || "";
    openId = v.open || null; shown = PAGE; render();
    var target = openId !== null ? table.querySelector("tr.row.open") : null;
    if (target) target.scrollIntoView();
  }
  function write() {
    D.writeView(KEYS, {metric: c.metric.value, changed: c.changed.checked ? "1" : "", q: c.search.value.trim(), open: openId});
  }
  c.metric.addEventListener("change", function () { shown = PAGE; openId = null; render(); write(); });
  c.changed.addEventListener("change", function () { shown = PAGE; render(); write(); });
  var typing = null;
  c.search.addEventListener("input", function () { clearTimeout(typing); typing = setTimeout(function () { shown = PAGE; render(); write(); }, 150); });
  more.addEventListener("click", function () { shown += PAGE; render(); });
  window.addEventListener("hashchange", function () { var v = D.readView(KEYS); if (v) apply(v); });
  var first = D.readView(KEYS);
  if (first) apply(first); else render();
  root.setAttribute("data-ready", "1");
})();
