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
  return {el: el, f3: f3, signed: signed, raw: raw, readView: readView, writeView: writeView};
})();
