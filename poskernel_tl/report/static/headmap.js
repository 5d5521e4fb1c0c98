/* poskernel_tl head map: every head of every condition as one point (data/head_map.js,
 * written by poskernel_tl/report/head_map.py), any per-head column on x, y and the colour,
 * filters by model, dataset, length and layer kind, hover naming the head, a click opening
 * the head's view (its permalink). The map's own permalink (#map:x=…&y=…&c=…&f.model=…)
 * is parsed strictly: only known keys, column names and filter levels are taken, anything
 * else is ignored. Text from the data reaches the page through textContent, and Plotly's
 * labels with <, > and & escaped. */
(function () {
  "use strict";
  var PK = (window.PK = window.PK || {});
  var GL_ABOVE = 3000;  // more points than this: WebGL (scattergl)
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"];

  var el = PK.el;  /* viewer.js: text reaches the page as text nodes only */
  function plain(s) {  // a string for Plotly's labels: no markup survives
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function fmt(v) { return v === null || v === undefined || !isFinite(v) ? "–" : String(Number(Number(v).toPrecision(4))); }
  function own(obj, key) { return Object.prototype.hasOwnProperty.call(obj, key); }

  /* ------------------------------------------------------------- the permalink */
  function parseHash(D, hash) {
    var state = { filters: {} };
    if (typeof hash !== "string" || hash.slice(0, 5) !== "#map:" || hash.length > 4000) return state;
    hash.slice(5).split("&").forEach(function (part) {
      var m = /^(x|y|c|f\.[a-z_]{1,20})=([A-Za-z0-9%._~:+\-|]{0,1000})$/.exec(part);
      if (!m) return;
      var values;
      try { values = m[2].split("|").map(decodeURIComponent); } catch (e) { return; }
      if (m[1] === "x" || m[1] === "y") { if (own(D.numeric, values[0])) state[m[1]] = values[0]; return; }
      if (m[1] === "c") { if (own(D.numeric, values[0]) || own(D.categorical, values[0])) state.c = values[0]; return; }
      var col = m[1].slice(2);
      if (D.filters.indexOf(col) < 0) return;
      var levels = D.categorical[col].levels;
      state.filters[col] = values.filter(function (v) { return levels.indexOf(v) >= 0; });
    });
    return state;
  }
  function makeHash(s, D) {
    var parts = ["x=" + encodeURIComponent(s.x), "y=" + encodeURIComponent(s.y), "c=" + encodeURIComponent(s.c)];
    D.filters.forEach(function (col) {
      if (s.filters[col].length < D.categorical[col].levels.length)
        parts.push("f." + col + "=" + s.filters[col].map(encodeURIComponent).join("|"));
    });
    return "#map:" + parts.join("&");
  }

  /* --------------------------------------------------------------- the traces */
  function shown(D, s) {  // indices of the heads the filters keep
    var out = [];
    var keep = D.filters.map(function (col) {
      var levels = D.categorical[col].levels, ok = new Uint8Array(levels.length);
      s.filters[col].forEach(function (v) { ok[levels.indexOf(v)] = 1; });
      return [D.categorical[col].codes, ok];
    });
    for (var i = 0; i < D.n; i++) {
      var pass = true;
      for (var f = 0; f < keep.length && pass; f++) pass = keep[f][1][keep[f][0][i]] === 1;
      if (pass) out.push(i);
    }
    return out;
  }
  function hover(D, s, i) {
    var c = D.categorical, name = D.conditions[D.cond[i]] + "/L" + D.layer[i] + "H" + D.head[i];
    var cv = own(D.numeric, s.c) ? fmt(D.numeric[s.c][i]) : c[s.c].levels[c[s.c].codes[i]];
    return plain(name) + "<br>" + plain(D.labels[s.x]) + ": " + fmt(D.numeric[s.x][i]) + "<br>" +
      plain(D.labels[s.y]) + ": " + fmt(D.numeric[s.y][i]) + "<br>" + plain(D.labels[s.c]) + ": " + plain(cv) +
      (c.kernel_class && s.c !== "kernel_class" ? "<br>class: " + plain(c.kernel_class.levels[c.kernel_class.codes[i]]) : "");
  }
  function traces(D, s, idx) {
    var type = idx.length > GL_ABOVE ? "scattergl" : "scatter", X = D.numeric[s.x], Y = D.numeric[s.y];
    function trace(sub, name, marker) {
      return { type: type, mode: "markers", name: plain(name), x: sub.map(function (i) { return isFinite(X[i]) ? X[i] : null; }),
        y: sub.map(function (i) { return isFinite(Y[i]) ? Y[i] : null; }), customdata: sub,
        text: sub.map(function (i) { return hover(D, s, i); }), hovertemplate: "%{text}<extra></extra>", marker: marker };
    }
    if (own(D.categorical, s.c)) {
      var cat = D.categorical[s.c], groups = cat.levels.map(function () { return []; });
      idx.forEach(function (i) { groups[cat.codes[i]].push(i); });
      return groups.map(function (g, j) {
        return trace(g, cat.levels[j], { size: 6, opacity: 0.8, color: PALETTE[j % PALETTE.length] });
      }).filter(function (t) { return t.x.length; });
    }
    var C = D.numeric[s.c];
    return [trace(idx, D.labels[s.c], { size: 6, opacity: 0.85, colorscale: "Viridis", showscale: true,
      color: idx.map(function (i) { return isFinite(C[i]) ? C[i] : null; }), colorbar: { title: { text: plain(D.labels[s.c]) } } })];
  }

  /* ---------------------------------------------------------------- the map */
  function decoded(D) {
    if (D._ready) return D;
    var dec = function (v) { return PK.decode(v).data; };
    Object.keys(D.numeric).forEach(function (k) { D.numeric[k] = dec(D.numeric[k]); });
    Object.keys(D.categorical).forEach(function (k) { D.categorical[k].codes = dec(D.categorical[k].codes); });
    D.cond = dec(D.cond); D.layer = dec(D.layer); D.head = dec(D.head);
    D._ready = true;
    return D;
  }
  function select(options, labels, value, aria) {
    var sel = el("select", { "class": "pk-select", "aria-label": aria, "data-pk-axis": aria },
      options.map(function (o) { return el("option", { value: o }, [labels[o] || o]); }));
    sel.value = value;
    return sel;
  }
  function filterBoxes(D, s, draw) {  // one fieldset of checkboxes per filter column
    return D.filters.map(function (col) {
      var inputs = [];
      var set = el("fieldset", { "data-pk-filter": col }, [el("legend", {}, [D.labels[col] || col])].concat(
        D.categorical[col].levels.map(function (v) {
          var box = el("input", { type: "checkbox", "data-level": v });
          box.checked = s.filters[col].indexOf(v) >= 0;
          inputs.push(box);
          box.addEventListener("change", function () {
            s.filters[col] = D.categorical[col].levels.filter(function (w, j) { return inputs[j].checked; });
            draw();
          });
          return el("label", {}, [box, " " + v + " "]);
        })));
      return set;
    });
  }
  PK.headMap = function (id, data, report) {
    var root = document.getElementById(id);
    if (!root) return;
    if (!data || typeof Plotly === "undefined") { root.textContent = "The head map's data or Plotly did not load."; return; }
    var D = decoded(data), num = Object.keys(D.numeric), cats = Object.keys(D.categorical);
    var pick = function (want, from) { for (var i = 0; i < want.length; i++) if (from.indexOf(want[i]) >= 0) return want[i]; return from[0]; };
    var s = { x: pick(["R2_pooled"], num), y: pick(["tl_prev_token", "R2_gram", "R2_nosink"], num),
      c: pick(["kernel_class", "model"], cats.concat(num)), filters: {} };
    D.filters.forEach(function (col) { s.filters[col] = D.categorical[col].levels.slice(); });
    var asked = parseHash(D, location.hash);
    ["x", "y", "c"].forEach(function (k) { if (asked[k]) s[k] = asked[k]; });
    Object.keys(asked.filters).forEach(function (col) { s.filters[col] = asked.filters[col]; });
    var sx = select(num, D.labels, s.x, "x"), sy = select(num, D.labels, s.y, "y");
    var sc = select(cats.concat(num), D.labels, s.c, "colour");
    var boxes = filterBoxes(D, s, draw);
    var count = el("span", { "class": "pk-note", "data-pk-count": "" });
    var div = el("div", { "class": "pk-plot", "data-pk-state": "pending" });
    root.appendChild(el("div", { "class": "pk-map-controls" }, ["x ", sx, " y ", sy, " colour ", sc, count]));
    root.appendChild(el("div", { "class": "pk-map-controls" }, boxes));
    root.appendChild(div);
    var first = true;
    function draw() {
      s.x = sx.value; s.y = sy.value; s.c = sc.value;
      var t0 = performance.now(), idx = shown(D, s);
      count.textContent = idx.length + " of " + D.n + " heads";
      var layout = { margin: { l: 60, r: 20, t: 30, b: 50 }, height: 560, hovermode: "closest",
        xaxis: { title: { text: plain(D.labels[s.x]) } }, yaxis: { title: { text: plain(D.labels[s.y]) } },
        legend: { title: { text: plain(D.labels[s.c]) } }, uirevision: s.x + "|" + s.y };
      var done = Plotly.react(div, traces(D, s, idx), layout, { displaylogo: false, responsive: true });
      div.setAttribute("data-pk-sync-ms", String(Math.round(performance.now() - t0)));
      done.then(function () {
        div.setAttribute("data-pk-ms", String(Math.round(performance.now() - t0)));
        div.setAttribute("data-pk-state", "drawn");
        div.setAttribute("data-pk-points", String(idx.length));
      });
      if (!first && history.replaceState && (report || location.hash.slice(0, 5) === "#map:")) history.replaceState(null, "", makeHash(s, D));
      first = false;
      if (!div._pkClick) {
        div._pkClick = true;
        div.on("plotly_click", function (ev) {
          var i = ev.points[0].customdata;
          if (report && i !== undefined) location.hash = D.conditions[D.cond[i]] + "/L" + D.layer[i] + "H" + D.head[i];
        });
      }
    }
    [sx, sy, sc].forEach(function (sel) { sel.addEventListener("change", draw); });
    draw();
  };
})();
