// What the report's scripts share (the viewer's and the comparison page's): elements whose text is only ever
// text, numbers formatted as the report formats them, and a view in the URL's fragment (`#v:` and
// URL-encoded key=value pairs, report/links.py).
var aipDom = (function () {
  "use strict";
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) { if (attrs[k] !== null && attrs[k] !== undefined) e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function none(x) { return x === null || x === undefined; }
  function f3(x) { return none(x) ? "n/a" : Number(x).toFixed(3); }
  function signed(x) { return none(x) ? "" : (x < 0 ? "" : "+") + Number(x).toFixed(3); }
  function raw(x) { return none(x) ? "" : String(x); }
  function readView(keys) {  // the fragment's view, or null when the URL has none
    var h = window.location.hash;
    if (h.indexOf("#v:") !== 0) return null;
    var p = new URLSearchParams(h.slice(3)), v = {};
    keys.forEach(function (k) { if (p.has(k)) v[k] = p.get(k); });
    return v;
  }
  function writeView(keys, v) {  // the view into the fragment, replacing the history entry
    var p = new URLSearchParams();
    keys.forEach(function (k) { if (v[k]) p.append(k, v[k]); });
    var h = "#v:" + p.toString();
    if (h !== window.location.hash) history.replaceState(null, "", h);
  }
  // A verdict in words, after its judge's name: a decision-flip pair (its `f`, flipped, true or false)
  // by its two decisions and whether it flipped, not by its stored label and score ("flip", 0: one pair's
  // share of the row's score, 1 for the same decision and 0 for a flip, which read "flip score 0.000");
  // any other verdict by its label and score. Returns [the text, its mark: [class, words] or null].
  function verdictWords(v) {
    var pair = v.f === true || v.f === false;
    var t = pair ? "" : (v.l || "") + (none(v.s) ? "" : " score " + f3(v.s));
    if (!none(v.da) || !none(v.db)) t += (t ? " · " : "") + "decisions a: " + (v.da || "none") + ", b: " + (v.db || "none");
    var mark = v.f ? ["flag", " · flipped, due to the persona"]
      : v.at === false && v.da !== v.db ? ["muted", " · decisions differ, not due to the persona"]
      : pair ? ["muted", v.da === v.db && !none(v.da) ? " · the same decision" : " · no flip"] : null;
    return [t, mark];
  }
  return {el: el, f3: f3, signed: signed, raw: raw, readView: readView, writeView: writeView, verdictWords: verdictWords};
})();
