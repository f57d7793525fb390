(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("aip-viewer-data").textContent);
  var root = document.getElementById("viewer");
  var metaBy = {}; data.metrics.forEach(function (m) { metaBy[m.metric] = m; });
  var PAGE = 100, shown = PAGE;
  var el = aipDom.el, f3 = aipDom.f3, raw = aipDom.raw;  // static/dom.js, inlined before this script
  function uniq(a) { var s = new Set(); a.forEach(function (x) { if (x !== null && x !== undefined) s.add(String(x)); }); return Array.from(s).sort(); }
  var KEYS = ["metric", "flagged", "failed", "excluded", "axis", "persona", "group", "label", "category", "q", "sort", "open"];  // report/links.py
  var personas = data.personas || {};
  function words(s) { return String(s || "").match(/\s+|[^\s]+/g) || []; }
  // the words of a that b lacks and of b that a lacks (a longest common subsequence of the words,
  // after the common head and tail; a middle too long to compare is marked whole)
  function diffWords(a, b) {
    var x = words(a), y = words(b), i = 0, ex = x.length, ey = y.length;
    var mx = x.map(function () { return false; }), my = y.map(function () { return false; });
    while (i < ex && i < ey && x[i] === y[i]) i++;
    while (ex > i && ey > i && x[ex - 1] === y[ey - 1]) { ex--; ey--; }
    var n = ex - i, m = ey - i, k, l;
    if (n * m > 1000000) { for (k = i; k < ex; k++) mx[k] = true; for (k = i; k < ey; k++) my[k] = true; }
    else {
      var t = [];  // t[k][l]: the common subsequence's length of x[i+k..] and y[i+l..]
      for (k = 0; k <= n; k++) t.push(new Int32Array(m + 1));
      for (k = n - 1; k >= 0; k--) for (l = m - 1; l >= 0; l--)
        t[k][l] = x[i + k] === y[i + l] ? t[k + 1][l + 1] + 1 : Math.max(t[k + 1][l], t[k][l + 1]);
      k = 0; l = 0;
      while (k < n && l < m) {
        if (x[i + k] === y[i + l]) { k++; l++; }
        else if (t[k + 1][l] >= t[k][l + 1]) { mx[i + k] = true; k++; }
        else { my[i + l] = true; l++; }
      }
      for (; k < n; k++) mx[i + k] = true;
      for (; l < m; l++) my[i + l] = true;
    }
    return [x.map(function (w, j) { return [w, mx[j] && /\S/.test(w)]; }), y.map(function (w, j) { return [w, my[j] && /\S/.test(w)]; })];
  }
  function marked(node, tokens) {  // text, each run of differing words in one <mark>, never markup
    var run = "", hit = "";
    tokens.forEach(function (t, j) {
      var on = t[1] || (hit && /^\s+$/.test(t[0]) && tokens[j + 1] && tokens[j + 1][1]);  // a space inside a run
      if (on) { if (run) { node.appendChild(document.createTextNode(run)); run = ""; } hit += t[0]; return; }
      if (hit) { node.appendChild(el("mark", null, hit)); hit = ""; }
      run += t[0];
    });
    if (hit) node.appendChild(el("mark", null, hit));
    if (run) node.appendChild(document.createTextNode(run));
    return node;
  }
  function personaText(m, id) {
    var ms = m ? [m] : Object.keys(personas);
    for (var i = 0; i < ms.length; i++) { var d = (personas[ms[i]] || {})[id]; if (d) return d; }
    return null;
  }
  data.rows.forEach(function (r, i) {
    r.i = i;
    var parts = [r.id, r.label, r.expl, r.error];
    r.probes.forEach(function (p) { parts.push(p.q, p.persona, p.who); Object.keys(p.ans).forEach(function (k) { parts.push(p.ans[k].t, p.ans[k].e); }); });
    r.items.forEach(function (it) { it.v.forEach(function (v) { parts.push(v.r, v.l, v.e); }); });
    r.single.forEach(function (v) { parts.push(v.r, v.l, v.e); });
    r.blob = parts.filter(function (x) { return x; }).join("\n").toLowerCase();
  });

  var c = {};
  function control(label, node) { var l = el("label", null, label + " "); l.appendChild(node); return l; }
  var bar = el("div", {"class": "controls"});
  c.metric = el("select", {"data-filter": "metric"});
  c.metric.appendChild(el("option", {value: ""}, "all metrics"));
  data.metrics.forEach(function (m) { c.metric.appendChild(el("option", {value: m.metric}, m.metric)); });
  c.axis = el("select", {"data-filter": "axis"}); c.persona = el("select", {"data-filter": "persona"});
  c.group = el("select", {"data-filter": "group"});
  c.cat = el("select", {"data-filter": "category"}); c.label = el("select", {"data-filter": "label"});
  c.flagged = el("input", {type: "checkbox", "data-filter": "flagged"});
  c.failed = el("input", {type: "checkbox", "data-filter": "failed"});
  c.excluded = el("input", {type: "checkbox", "data-filter": "excluded"});
  c.search = el("input", {type: "search", placeholder: "search ids, prompts, answers, reasoning", "data-filter": "search"});
  c.sort = el("select", {"data-filter": "sort"});
  [["score-asc", "score, lowest first"], ["score-desc", "score, highest first"], ["id", "input id"], ["failed", "most excluded first"]]
    .forEach(function (o) { c.sort.appendChild(el("option", {value: o[0]}, o[1])); });
  bar.appendChild(control("metric", c.metric)); bar.appendChild(control("axis", c.axis));
  bar.appendChild(control("persona", c.persona)); bar.appendChild(control("group", c.group)); c.catLabel = control("category / perturbation type", c.cat);
  bar.appendChild(c.catLabel); bar.appendChild(control("label", c.label));
  bar.appendChild(control("flipped / flagged", c.flagged)); bar.appendChild(control("failed", c.failed));
  bar.appendChild(control("excluded", c.excluded)); bar.appendChild(c.search); bar.appendChild(control("sort", c.sort));
  root.appendChild(bar);
  var count = el("p", {"class": "count", id: "viewer-count"}); root.appendChild(count);
  var note = el("p", {"class": "muted", id: "viewer-cap"}); root.appendChild(note);
  var table = el("table", {"class": "rows"}); root.appendChild(table);
  var more = el("button", {type: "button", id: "viewer-more"}, "show more"); root.appendChild(more);

  function fill(sel, values, all, text) {
    var cur = sel.value; sel.textContent = "";
    sel.appendChild(el("option", {value: ""}, all));
    values.forEach(function (v) { sel.appendChild(el("option", {value: v}, text ? text(v) : v)); });
    sel.value = values.indexOf(cur) >= 0 ? cur : "";
    sel.disabled = values.length === 0;
  }
  function lower(x) { return x === null || x === undefined ? null : String(x).toLowerCase(); }
  var spelling = {};  // a label's spelling (lower case -> as written), the chosen metric's or the most rows'
  function labels(rs) {
    var n = {}; spelling = {};
    rs.forEach(function (r) { if (r.label === null || r.label === undefined) return; var k = lower(r.label);
      n[k] = n[k] || {}; n[k][r.label] = (n[k][r.label] || 0) + 1; });
    Object.keys(n).forEach(function (k) {
      spelling[k] = Object.keys(n[k]).sort(function (a, b) { return n[k][b] - n[k][a] || (a < b ? -1 : a > b ? 1 : 0); })[0]; });
    return Object.keys(n).sort();
  }
  function inMetric() { var m = c.metric.value; return data.rows.filter(function (r) { return !m || r.m === m; }); }
  function refreshFacets() {
    var rs = inMetric(), m = c.metric.value;
    fill(c.axis, uniq([].concat.apply([], rs.map(function (r) { return r.axes; }))), "any axis");
    fill(c.persona, uniq([].concat.apply([], rs.map(function (r) { return r.personas; }))), "any persona",
      function (v) { var d = personaText(m, v); return d ? v + " — " + d : v; });
    fill(c.group, uniq([].concat.apply([], rs.map(function (r) { return r.groups || []; }))), "any group");
    fill(c.cat, uniq([].concat.apply([], rs.map(function (r) { return r.cats; }))), "any");
    fill(c.label, labels(rs), "any label", function (v) { return spelling[v]; });
    c.catLabel.firstChild.textContent = (m ? metaBy[m].facet : "category / perturbation type") + " ";
    var caps = data.metrics.filter(function (x) { return (!m || x.metric === m) && x.shown < x.total; });
    note.textContent = caps.length ? caps.map(function (x) {
      return x.metric + ": the " + x.shown + " lowest-scored of " + x.total + " rows are in this file; all of them: " +
        "SELECT * FROM v_weakest_rows WHERE run_id = '" + data.run_id + "' AND metric = '" + x.metric + "'"; }).join("; ") : "";
  }
  function matches(r) {
    var q = c.search.value.trim().toLowerCase();
    return (!c.metric.value || r.m === c.metric.value) && (!c.axis.value || r.axes.indexOf(c.axis.value) >= 0) &&
      (!c.persona.value || r.personas.indexOf(c.persona.value) >= 0) &&
      (!c.group.value || (r.groups || []).indexOf(c.group.value) >= 0) && (!c.cat.value || r.cats.indexOf(c.cat.value) >= 0) &&
      (!c.label.value || lower(r.label) === c.label.value) && (!c.flagged.checked || r.flagged) &&
      (!c.flagged.checked || !c.axis.value || !r.fax || !r.fax.length || r.fax.indexOf(c.axis.value) >= 0) &&
      (!c.failed.checked || r.failed) && (!c.excluded.checked || r.excluded) && (!q || r.blob.indexOf(q) >= 0);
  }
  function cmp(a, b) {
    var s = c.sort.value, x, y;
    if (s === "id") return a.m < b.m ? -1 : a.m > b.m ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    if (s === "failed") { x = (b.nf || 0) - (a.nf || 0); if (x) return x; }
    x = a.score === null ? -Infinity : a.score; y = b.score === null ? -Infinity : b.score;
    if (x !== y) return s === "score-desc" ? y - x : x - y;
    return a.i - b.i;
  }
  var openId = null;  // the input id of the open row (the fragment's open)
  function render() {
    var rs = data.rows.filter(matches).sort(cmp);
    var at = openId === null ? -1 : rs.findIndex(function (r) { return r.id === openId; });
    if (at >= shown) shown = (Math.floor(at / PAGE) + 1) * PAGE;  // the open row is on the page
    count.textContent = rs.length + " of " + data.rows.length + " rows match";
    count.setAttribute("data-matching", rs.length);
    table.textContent = "";
    var head = el("tr");
    ["metric", "input id", "score", "label", "judged", "excluded units", "events", "status"].forEach(function (h) { head.appendChild(el("th", null, h)); });
    table.appendChild(head);
    rs.slice(0, shown).forEach(function (r) {
      var tr = el("tr", {"class": "row", "data-metric": r.m, "data-input-id": r.id});
      tr.appendChild(el("td", null, r.m.replace(/^llm\./, "")));
      tr.appendChild(el("td", null, r.id));
      tr.appendChild(el("td", {"class": "num", "data-field": "score", "data-value": raw(r.score)}, f3(r.score)));
      tr.appendChild(el("td", {"data-field": "label"}, r.label));
      tr.appendChild(el("td", {"class": "num", "data-field": "n_judged", "data-value": raw(r.nj)}, raw(r.nj)));
      tr.appendChild(el("td", {"class": "num", "data-field": "n_failed", "data-value": raw(r.nf)}, raw(r.nf)));
      tr.appendChild(el("td", {"class": "num", "data-field": "n_events", "data-value": raw(r.ne)}, raw(r.ne)));
      tr.appendChild(el("td", {"data-field": "status", "class": r.status === "error" ? "err" : r.status === "ok" ? "" : "muted"}, r.status));
      tr.addEventListener("click", function () { toggle(tr, r); openId = tr.classList.contains("open") ? r.id : null; write(); });
      table.appendChild(tr);
    });
    var open = at >= 0 ? table.querySelector("tr.row:nth-child(" + (at + 2) + ")") : null;
    if (open) toggle(open, rs[at]);
    more.style.display = rs.length > shown ? "" : "none";
    more.textContent = "show " + Math.min(PAGE, rs.length - shown) + " more";
  }
  function answerBox(r, side, words) {
    var d = el("div");
    var p = side.p === null || side.p === undefined ? null : r.probes[side.p];
    d.appendChild(el("div", {"class": "who"}, side.who || (p && p.who) || "—"));
    if (!p) { d.appendChild(el("div", {"class": "muted"}, "(probe not recorded)")); return d; }
    if (p.persona) d.appendChild(el("div", {"class": "muted"}, p.persona));
    d.appendChild(el("div", {"class": "muted"}, "asked:"));
    d.appendChild(words ? marked(el("div", {"class": "txt", "data-probe-id": p.id}), words) : el("div", {"class": "txt", "data-probe-id": p.id}, p.q));
    var a = p.ans[side.s];
    d.appendChild(el("div", {"class": "muted"}, "answered" + (side.s !== "0" ? " (sample " + side.s + ")" : "") + ":"));
    if (!a) d.appendChild(el("div", {"class": "muted"}, "(no answer recorded)"));
    else if (a.st !== "ok") d.appendChild(el("div", {"class": "txt err", "data-answer": p.id}, a.st + ": " + (a.e || "")));
    else d.appendChild(el("div", {"class": "txt ans", "data-answer": p.id}, a.t));
    return d;
  }
  function verdictBox(v) {
    var d = el("div", {"class": "verdict-box", "data-verdict": v.k});
    var head = (v.k || "judge") + (v.c && v.c !== "baseline" ? "" : v.c ? " (baseline)" : "") + ": ";
    if (v.st !== "ok") { d.appendChild(el("span", {"class": "err"}, head + v.st + (v.e ? " — " + v.e : ""))); if (v.j) d.appendChild(markBox(v)); return d; }
    var words = aipDom.verdictWords(v), mark = words[1];
    d.appendChild(el("span", null, head + words[0]));
    if (mark) d.appendChild(el("span", {"class": mark[0]}, mark[1]));
    if (v.sw !== null && v.sw !== undefined) d.appendChild(el("span", {"class": "muted"}, v.sw ? " · judge saw b first" : " · judge saw a first"));
    if (v.r) d.appendChild(el("div", {"class": "txt", "data-reasoning": "1"}, v.r));
    if (v.calls === false && v.ck) {  // left out of the file for its size
      d.appendChild(el("div", {"class": "muted", "data-judge-call-missing": "1"}, "the judge's prompt and raw answer are not in this file: " +
        "SELECT request, response_text FROM llm_calls WHERE run_id = '" + data.run_id + "' AND call_key = '" + v.ck + "'"));
    } else if (v.jp || v.jr) {  // the judge's call, behind a toggle
      var call = el("details", {"class": "judge-call"});
      call.appendChild(el("summary", null, "the judge's prompt and raw answer" + (v.sw ? " (it saw b first: its response 1 is b)" : "")));
      call.appendChild(el("div", {"class": "muted"}, "prompt:"));
      call.appendChild(el("div", {"class": "txt", "data-judge-prompt": "1"}, v.jp || "(not recorded)"));
      call.appendChild(el("div", {"class": "muted"}, "raw answer:"));
      call.appendChild(el("div", {"class": "txt", "data-judge-raw": "1"}, v.jr || "(not recorded)"));
      d.appendChild(call);
    }
    if (v.j) d.appendChild(markBox(v));  // a verdict a person may check: judge right or wrong
    return d;
  }
  function toggle(tr, r) {
    var next = tr.nextSibling;
    if (next && next.classList && next.classList.contains("detail-row")) { next.remove(); tr.classList.remove("open"); return; }
    tr.classList.add("open");
    var dr = el("tr", {"class": "detail-row"}), td = el("td", {colspan: 8, "class": "detail", "data-input-id": r.id});
    dr.appendChild(td);
    var info = [(metaBy[r.m].name || r.m), "score " + f3(r.score)];
    if (r.raw !== r.score) info.push("raw " + f3(r.raw));
    td.appendChild(el("div", null, info.join(" · ")));
    if (r.expl) td.appendChild(el("div", {"class": "muted"}, r.expl));
    if (r.error) td.appendChild(el("div", {"class": "err"}, r.error));
    // a search opens to what it found: the comparisons that match it first
    var q = c.search.value.trim().toLowerCase();
    var found = function (it) {
      var parts = [it.title];
      [it.a, it.b].forEach(function (side) {
        var p = side.p === null || side.p === undefined ? null : r.probes[side.p];
        parts.push(side.who);
        if (p) { parts.push(p.q, p.persona, p.who, personaText(r.m, p.who)); if (p.ans[side.s]) parts.push(p.ans[side.s].t, p.ans[side.s].e); }
      });
      it.v.forEach(function (v) { parts.push(v.r, v.l, v.e); });
      return parts.filter(function (x) { return x; }).join("\n").toLowerCase().indexOf(q) >= 0;
    };
    var items = q ? r.items.filter(found).concat(r.items.filter(function (it) { return !found(it); })) : r.items;
    items.forEach(function (it) {
      var box = el("div", {"class": "pair"});
      if (q && found(it)) box.setAttribute("data-match", "1");
      box.appendChild(el("div", {"class": "who"}, (it.axis ? it.axis + ": " : "") + it.title));
      var side = el("div", {"class": "side"});
      var pa = it.a.p === null || it.a.p === undefined ? null : r.probes[it.a.p];
      var pb = it.b.p === null || it.b.p === undefined ? null : r.probes[it.b.p];
      var dw = pa && pb && pa.q && pb.q && pa.q !== pb.q ? diffWords(pa.q, pb.q) : [null, null];  // the words that differ
      side.appendChild(answerBox(r, it.a, dw[0])); side.appendChild(answerBox(r, it.b, dw[1])); box.appendChild(side);
      if (!it.v.length) box.appendChild(el("div", {"class": "muted"}, "not judged"));
      it.v.forEach(function (v) { box.appendChild(verdictBox(v)); });
      td.appendChild(box);
    });
    if (r.single.length) {
      var sb = el("div", {"class": "pair"}); sb.appendChild(el("div", {"class": "who"}, "verdicts on one answer"));
      r.single.forEach(function (v) { sb.appendChild(verdictBox(v)); }); td.appendChild(sb);
    }
    if (r.other.length) {
      var ob = el("div", {"class": "pair"}); ob.appendChild(el("div", {"class": "who"}, "other probes"));
      r.other.forEach(function (i) {
        var p = r.probes[i];
        Object.keys(p.ans).length ? Object.keys(p.ans).forEach(function (s) { ob.appendChild(answerBox(r, {p: i, s: s, who: p.meta || p.who})); })
          : ob.appendChild(answerBox(r, {p: i, s: "0", who: p.meta || p.who}));
      });
      td.appendChild(ob);
    }
    tr.parentNode.insertBefore(dr, tr.nextSibling);
  }
  // a person's check of the judge's verdicts (report/viewer.py: a checkable verdict's j, jc, la, sh):
  // "judge right" or "judge wrong" and the right category, with a note; kept in this browser's
  // localStorage by run, downloaded as the file `aip-eval label import` reads (export's columns)
  var lf = data.label_file || {columns: [], formula_prefixes: [], dir: ""};
  var markStore = "aip-viewer-marks:" + data.run_id, marks = {}, marksKept = true, byJ = {};
  function storage(get, key, value) {  // localStorage, or null where the browser keeps none
    try { if (get) return window.localStorage.getItem(key); window.localStorage.setItem(key, value); }
    catch (e) { marksKept = false; }
    return null;
  }
  try { var saved = JSON.parse(storage(true, markStore) || "{}"); if (saved && saved.marks && typeof saved.marks === "object") marks = saved.marks; }
  catch (e) { marks = {}; }
  function markKey(m, j) { return m + "\u001f" + j; }  // a judgement id is one metric's (the consistency metrics share theirs)
  data.rows.forEach(function (r) {  // each checkable verdict's row and comparison, for its mark and its file row
    r.items.forEach(function (it) { it.v.forEach(function (v) { if (v.j) { v.row = r; v.item = it; byJ[markKey(r.m, v.j)] = v; } }); });
    r.single.forEach(function (v) { if (v.j) { v.row = r; byJ[markKey(r.m, v.j)] = v; } });
  });
  var markBar = el("span", {"class": "marks", id: "viewer-marks"});
  c.labeller = el("input", {type: "text", size: 14, placeholder: "your name", "data-mark": "labeller"});
  c.labeller.value = storage(true, "aip-viewer-labeller") || "";
  c.labeller.addEventListener("input", function () { storage(false, "aip-viewer-labeller", c.labeller.value.trim()); });
  markBar.appendChild(control("labeller", c.labeller));
  var markCount = el("span", {id: "viewer-marked"}); markBar.appendChild(markCount);
  var download = el("button", {type: "button", "data-mark": "download"}, "Download labels"); markBar.appendChild(download);
  bar.appendChild(markBar);
  var markMsg = el("div", {"class": "mark-msg", id: "viewer-marks-msg"}); bar.parentNode.insertBefore(markMsg, bar.nextSibling);
  function countMarks() {
    var n = Object.keys(marks).length;
    markCount.textContent = n + (n === 1 ? " verdict" : " verdicts") + " marked" +
      (marksKept ? "" : " (this browser keeps no marks for the page: download them before you leave it)");
    markCount.setAttribute("data-marked", n);
    download.disabled = n === 0;
  }
  function saveMarks() { storage(false, markStore, JSON.stringify({marks: marks})); countMarks(); }
  function markBox(v) {
    var r = v.row, cats = ((metaBy[r.m] || {}).allowed || [])[v.la] || [], wrongOpen = false, key = markKey(r.m, v.j);
    var box = el("div", {"class": "mark", "data-mark-for": v.j, "data-mark-metric": r.m});
    var right = el("button", {type: "button", "data-mark": "right"}, "judge right");
    var wrong = el("button", {type: "button", "data-mark": "wrong"}, "judge wrong");
    var pick = el("select", {"data-mark": "category"});
    pick.appendChild(el("option", {value: ""}, "the right category:"));
    cats.forEach(function (x) { if (x !== v.jc) pick.appendChild(el("option", {value: x}, x)); });
    var note = el("input", {type: "text", size: 30, placeholder: "note (optional)", "data-mark": "note"});
    var state = el("span", {"data-mark": "state"});
    var clear = el("button", {type: "button", "data-mark": "clear"}, "clear");
    [state, right, wrong, pick, note, clear].forEach(function (x) { box.appendChild(x); });
    function show() {
      var mk = marks[key], ok = mk && mk.h === mk.jc;
      box.setAttribute("data-marked", mk ? (stale(key) ? "stale" : ok ? "right" : "wrong") : "");
      state.textContent = (mk && stale(key) ? "marked on answers since sampled again (left out of the file: mark it again); " : "") +
        (!mk ? "the judge says " + v.jc + ": " : ok ? "marked: the judge is right (" + mk.h + ") " :
        "marked: the judge is wrong (it says " + mk.jc + "), it is " + mk.h + " ");
      pick.style.display = wrongOpen || (mk && !ok) ? "" : "none";
      pick.value = mk && !ok ? mk.h : "";
      if (mk) note.value = mk.n || "";
      clear.style.display = mk ? "" : "none";
    }
    function set(h) {
      marks[key] = {m: r.m, j: v.j, i: r.id, jc: v.jc, h: h, n: note.value.trim(), sh: v.sh, al: cats};
      saveMarks(); show();
    }
    right.addEventListener("click", function () { wrongOpen = false; set(v.jc); });
    wrong.addEventListener("click", function () {
      wrongOpen = true;
      if (marks[key] && marks[key].h === marks[key].jc) { delete marks[key]; saveMarks(); }
      show(); pick.focus();
    });
    pick.addEventListener("change", function () { if (pick.value) set(pick.value); });
    note.addEventListener("input", function () { if (marks[key]) { marks[key].n = note.value.trim(); saveMarks(); } });
    clear.addEventListener("click", function () { delete marks[key]; wrongOpen = false; note.value = ""; saveMarks(); show(); });
    show();
    return box;
  }
  // a Blob's address for a download link, bound so that the page spells no call a CSS reader takes for a fetch
  var blobHref = URL.createObjectURL.bind(URL);
  function csvCell(x) {  // as label_files writes a cell: a ' before formula-looking text, quoted as Python's csv quotes
    var s = x === null || x === undefined ? "" : String(x);
    if (lf.formula_prefixes.some(function (p) { return s.indexOf(p) === 0; })) s = "'" + s;
    return /[",\r\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }
  function fileRow(key, mk, who) {  // the mark as a row of the file: what the import reads, and what the viewer showed
    var v = byJ[key], out = {judgement_id: mk.j, run_id: data.run_id, metric: mk.m, input_id: mk.i, allowed: (mk.al || []).join(" | "),
      shown_hash: mk.sh, judge_category: mk.jc, judge_reasoning: v ? v.r : "", human_label: mk.h, labeller: who, note: mk.n};
    if (v && v.item) {
      [["a", v.item.a], ["b", v.item.b]].forEach(function (x) {
        var side = x[1], p = side.p === null || side.p === undefined ? null : v.row.probes[side.p], a = p ? p.ans[side.s] : null;
        out["persona_" + x[0]] = [side.who || (p && p.who), p && p.persona].filter(function (t) { return t; }).join(": ");
        out["question_" + x[0]] = p ? p.q : "";
        out["answer_" + x[0]] = !a ? "" : a.st === "ok" ? a.t : a.st + ": " + (a.e || "");
      });
    }
    return out;
  }
  // a mark made on other answers than this report's (it was rebuilt after the run's answers were
  // sampled again): the import would refuse its file by its shown_hash
  function stale(key) { return !!byJ[key] && byJ[key].sh !== marks[key].sh; }
  download.addEventListener("click", function () {
    var who = c.labeller.value.trim();
    markMsg.textContent = "";
    if (!who) { markMsg.appendChild(el("span", {"class": "err"}, "Write your name in labeller first: aip-eval label import needs one for each label.")); c.labeller.focus(); return; }
    var byMetric = {}, left = 0;
    Object.keys(marks).sort().forEach(function (k) {
      if (stale(k)) { left++; return; }
      (byMetric[marks[k].m] = byMetric[marks[k].m] || []).push(k);
    });
    var dir = lf.dir ? lf.dir.replace(/\/*$/, "/") : "<warehouse dir>/labels/", ms = Object.keys(byMetric).sort();
    if (left) markMsg.appendChild(el("div", {"class": "err", "data-mark-stale": left}, left + (left === 1 ? " mark was" : " marks were") +
      " made on answers since sampled again, and left out: open " + (left === 1 ? "its verdict" : "their verdicts") + " and mark again."));
    if (!ms.length) return;
    markMsg.appendChild(el("div", null, "Move the file" + (ms.length > 1 ? "s" : "") + " to " + dir +
      " (where aip-eval label export writes), then import " + (ms.length > 1 ? "each" : "it") + ":"));
    ms.forEach(function (m) {
      var lines = [lf.columns.map(csvCell).join(",")].concat(byMetric[m].map(function (k) {
        var row = fileRow(k, marks[k], who);
        return lf.columns.map(function (k) { return csvCell(row[k]); }).join(",");
      }));
      var name = data.run_id + "--" + m + "--viewer.csv";  // UTF-8 with a byte-order mark, as export writes
      var blob = new Blob(["\ufeff" + lines.join("\r\n") + "\r\n"], {type: "text/csv;charset=utf-8"});
      var a = el("a", {href: blobHref(blob), download: name, "data-mark-file": m}, name);
      var line = el("div"); line.appendChild(a);
      line.appendChild(el("code", {"data-mark-command": m}, "aip-eval label import " + dir + name));
      markMsg.appendChild(line);
      a.click();
    });
  });
  countMarks();
  // the view in the URL's fragment (report/links.py): read on load and when the fragment changes,
  // written back (replacing the history entry) as the user filters, searches or opens a row
  function view() { return aipDom.readView(KEYS); }
  function pick(sel, value) {
    var ok = value !== undefined && Array.prototype.some.call(sel.options, function (o) { return o.value === value; });
    sel.value = ok ? value : "";
  }
  function apply(v) {
    pick(c.metric, v.metric); refreshFacets();
    pick(c.axis, v.axis); pick(c.persona, v.persona); pick(c.group, v.group); pick(c.cat, v.category);
    pick(c.label, v.label === undefined ? undefined : v.label.toLowerCase());
    c.flagged.checked = v.flagged === "1" || v.flagged === "true";
    c.failed.checked = v.failed === "1" || v.failed === "true";
    c.excluded.checked = v.excluded === "1" || v.excluded === "true";
    pick(c.sort, v.sort); if (!c.sort.value) c.sort.value = "score-asc";
    c.search.value = v.q || "";
    openId = v.open || null; shown = PAGE; render();
    var target = openId !== null ? table.querySelector("tr.row.open") : null;
    (target || root).scrollIntoView();
  }
  function write() {
    var v = {metric: c.metric.value, flagged: c.flagged.checked ? "1" : "", failed: c.failed.checked ? "1" : "",
      excluded: c.excluded.checked ? "1" : "", axis: c.axis.value, persona: c.persona.value, group: c.group.value,
      label: c.label.value ? spelling[c.label.value] : "", category: c.cat.value, q: c.search.value.trim(),
      sort: c.sort.value === "score-asc" ? "" : c.sort.value, open: openId};
    aipDom.writeView(KEYS, v);
  }
  [c.metric].forEach(function (s) { s.addEventListener("change", function () { refreshFacets(); shown = PAGE; openId = null; render(); write(); }); });
  [c.axis, c.persona, c.group, c.cat, c.label, c.flagged, c.failed, c.excluded, c.sort].forEach(function (s) {
    s.addEventListener("change", function () { shown = PAGE; render(); write(); }); });
  var typing = null;  // search as you type, once the typing pauses
  c.search.addEventListener("input", function () { clearTimeout(typing); typing = setTimeout(function () { shown = PAGE; render(); write(); }, 150); });
  more.addEventListener("click", function () { shown += PAGE; render(); });
  window.addEventListener("hashchange", function () { var v = view(); if (v) apply(v); });
  refreshFacets();
  var first = view();
  if (first) apply(first); else render();
  root.setAttribute("data-ready", "1");
})();
