/* poskernel_tl long-context head view: the whole triangle as a grid of blocks (computed in
 * Python, see poskernel_tl/report/viewer_long.py) and a zoom into any window of rows and
 * keys at full resolution, computed here from the head's q and k (logits = scale·q·k),
 * g(Δ) and each row's log-normaliser. Tokens reach the page through textContent only. */
(function () {
  "use strict";
  var PK = (window.PK = window.PK || {});
  var counter = 0;

  var el = PK.el;  /* viewer.js: text reaches the page as text nodes only */
  function plot(div, traces, layout) {
    var base = { margin: { l: 60, r: 15, t: 30, b: 45 }, font: { size: 11 }, height: 330 };
    Plotly.newPlot(div, traces, Object.assign(base, layout), { displaylogo: false, responsive: true, displayModeBar: false });
  }
  function grid(arr, n) {  // a flat n×n array as rows of numbers (null for NaN)
    var out = [];
    for (var i = 0; i < n; i++) {
      var r = new Array(n);
      for (var j = 0; j < n; j++) { var v = arr[i * n + j]; r[j] = isFinite(v) ? v : null; }
      out.push(r);
    }
    return out;
  }
  var TITLES = [["logits", "logits A(t, s), block mean", "Viridis"], ["fit", "fit g(t − s), block mean", "Viridis"],
    ["residual", "residual A − g, block mean", "RdBu"], ["mass", "pattern: attention mass per query row", "Viridis"]];

  /* the rows and keys whose factors the page carries (all, or one window's in a notebook) */
  function carried(L) {
    if (!L.q) return { d: 0, r0: 0, r1: L.T - 1, c0: 0, c1: L.T - 1 };  // loaded on first use
    var d = L.d || L.q.length / L.T, r0 = L.qFrom || 0, c0 = L.kFrom || 0;
    return { d: d, r0: r0, r1: r0 + L.q.length / d - 1, c0: c0, c1: c0 + L.k.length / d - 1 };
  }

  /* the window a permalink asks for: #…zoom=R0-R1,K0-K1 (digits only; anything else is ignored) */
  function hashWindow(L) {
    var m = /(?:^#|[&\/])zoom=(\d{1,7})-(\d{1,7}),(\d{1,7})-(\d{1,7})$/.exec(location.hash || "");
    if (!m) return null;
    var w = m.slice(1, 5).map(Number), c = carried(L);
    if (w[1] < w[0] || w[3] < w[2] || w[0] < c.r0 || w[1] > c.r1 || w[2] < c.c0 || w[3] > c.c1) return null;
    if (w[1] - w[0] + 1 > L.zoomMax || w[3] - w[2] + 1 > L.zoomMax) return null;
    return { r0: w[0], r1: w[1], c0: w[2], c1: w[3] };
  }

  function zoomMatrices(L, w) {
    var c = carried(L), d = c.d, A = [], F = [], R = [], P = [];
    for (var t = w.r0; t <= w.r1; t++) {
      var a = [], f = [], r = [], p = [];
      for (var s = w.c0; s <= w.c1; s++) {
        var lag = t - s, dot = 0;
        var attends = PK.keeps(L, t, s, true);  // the layer's mask, the diagonal read
        var fitted = attends && lag !== 0;
        if (attends) {
          var qi = (t - c.r0) * d, ki = (s - c.c0) * d;
          for (var j = 0; j < d; j++) dot += L.q[qi + j] * L.k[ki + j];
          dot *= L.scale;
        }
        var g = !fitted ? null : lag > 0 ? L.g[lag - 1] : L.gBack ? L.gBack[-lag - 1] : null;
        g = g === null || g === undefined || !isFinite(g) ? null : g;
        a.push(fitted ? dot : null); f.push(g); r.push(fitted && g !== null ? dot - g : null);
        p.push(attends ? Math.exp(dot - L.lse[t - c.r0]) : 0);
      }
      A.push(a); F.push(f); R.push(r); P.push(p);
    }
    return { logits: A, fit: F, residual: R, mass: P };
  }

  function tokenStrip(L, which, from, to) {
    var spans = [];
    for (var i = from; i <= to; i++) spans.push(el("span", { "class": "pk-tok", title: String(i), "data-pos": String(i) }, [String(L.tokens[i])]));
    return el("div", { "class": "pk-tokstrip", "data-pk-zoom": which, "data-pk-from": String(from), "data-pk-to": String(to) }, spans);
  }

  function drawZoom(L, holder, w) {
    holder.textContent = "";
    holder.setAttribute("data-pk-window", [w.r0, w.r1, w.c0, w.c1].join(","));
    holder.setAttribute("data-pk-drawn-ms", String(Math.round(performance.now())));
    var m = zoomMatrices(L, w), xs = [], ys = [], plots = [];
    for (var s = w.c0; s <= w.c1; s++) xs.push(s);
    for (var t = w.r0; t <= w.r1; t++) ys.push(t);
    TITLES.forEach(function () { plots.push(el("div", { "class": "pk-plot pk-half" })); });
    holder.appendChild(el("div", { "class": "pk-row" }, plots));
    holder.appendChild(el("p", { "class": "pk-note" }, ["Query rows " + w.r0 + "–" + w.r1 + ":"]));
    holder.appendChild(tokenStrip(L, "rows", w.r0, w.r1));
    holder.appendChild(el("p", { "class": "pk-note" }, ["Keys " + w.c0 + "–" + w.c1 + ":"]));
    holder.appendChild(tokenStrip(L, "keys", w.c0, w.c1));
    TITLES.forEach(function (tt, j) {
      var z = m[tt[0]], title = j === 3 ? "pattern P(t, s) = exp(A − lse(t))" : tt[1].replace(", block mean", "");
      plot(plots[j], [{ type: "heatmap", x: xs, y: ys, z: z, colorscale: tt[2], zmid: j === 2 ? 0 : undefined,
        hovertemplate: "t=%{y} s=%{x}: %{z:.4g}<extra></extra>" }],
      { title: { text: title }, yaxis: { autorange: "reversed", title: { text: "query t" } }, xaxis: { title: { text: "key s" } } });
    });
  }

  function controls(L, holder) {
    var inputs = {}, status = el("span", { "class": "pk-note", "data-pk-zoom-status": "" });
    [["r0", "rows from"], ["c0", "keys from"], ["n", "size"]].forEach(function (f) {
      inputs[f[0]] = el("input", { type: "number", min: "0", step: "1", "aria-label": f[1], "class": "pk-num" });
    });
    var button = el("button", { type: "button" }, ["Show"]);
    function show(w) {
      if (!L.q && L.loadFactors) {  // a report's head: its q and k load with the first zoom
        status.textContent = "loading this head's q and k …";
        L.loadFactors(function (ok) { if (ok) show(w); else status.textContent = "q and k did not load"; });
        return;
      }
      inputs.r0.value = w.r0; inputs.c0.value = w.c0; inputs.n.value = Math.max(w.r1 - w.r0, w.c1 - w.c0) + 1;
      status.textContent = "rows " + w.r0 + "–" + w.r1 + ", keys " + w.c0 + "–" + w.c1;
      drawZoom(L, holder, w);
    }
    var c = carried(L), side = Math.min(L.zoomMax, c.r1 - c.r0 + 1, c.c1 - c.c0 + 1);
    function place(r0, c0, n) {  // an n×n window inside the carried rows and keys
      r0 = Math.max(c.r0, Math.min(c.r1 - n + 1, r0));
      c0 = Math.max(c.c0, Math.min(c.c1 - n + 1, c0));
      return { r0: r0, r1: r0 + n - 1, c0: c0, c1: c0 + n - 1 };
    }
    function fromInputs() {
      var n = Math.max(1, Math.min(side, Math.floor(Number(inputs.n.value) || L.zoom)));
      show(place(Math.floor(Number(inputs.r0.value) || 0), Math.floor(Number(inputs.c0.value) || 0), n));
    }
    button.addEventListener("click", fromInputs);
    var bar = el("p", {}, ["Rows from ", inputs.r0, " keys from ", inputs.c0, " size ", inputs.n, " ", button, " ", status]);
    return { bar: bar, show: show, centre: function (t, s) {
      var n = Math.min(L.zoom, side);
      show(place(Math.round(t - n / 2), Math.round(s - n / 2), n));
    } };
  }

  function drawOverview(root, L) {
    var n = L.n, b = L.block, sec = el("section", { "class": "pk-sec", "data-pk-long": String(L.T) }, [
      el("h3", {}, ["Whole matrix, " + L.T + " tokens — overview of " + n + " × " + n + " blocks of " + b + " × " + b]),
      el("p", { "class": "pk-note" }, ["Logits, fit and residual: mean over the entries of each block that the fit reads; pattern: the block's attention mass per query row (a row block's masses sum to 1). Click a block to zoom there."])]);
    var plots = TITLES.map(function () { return el("div", { "class": "pk-plot pk-half" }); });
    sec.appendChild(el("div", { "class": "pk-row" }, plots));
    var gdiv = el("div", { "class": "pk-plot" });
    sec.appendChild(gdiv);
    root.appendChild(sec);
    TITLES.forEach(function (tt, j) {
      plot(plots[j], [{ type: "heatmap", z: grid(L[tt[0]], n), x0: (b - 1) / 2, dx: b, y0: (b - 1) / 2, dy: b,
        colorscale: tt[2], zmid: j === 2 ? 0 : undefined, hovertemplate: "t≈%{y:.0f} s≈%{x:.0f}: %{z:.4g}<extra></extra>" }],
      { title: { text: tt[1] }, yaxis: { autorange: "reversed", title: { text: "query t" } }, xaxis: { title: { text: "key s" } } });
    });
    var lags = Array.from(L.g, function (_, i) { return i + 1; });
    var traces = [{ x: lags, y: Array.from(L.g, function (v) { return isFinite(v) ? v : null; }), mode: "lines", line: { width: 1 }, name: "g(Δ)" }];
    if (L.gBack) traces.push({ x: lags, y: Array.from(L.gBack, function (v) { return isFinite(v) ? v : null; }), mode: "lines", line: { width: 1, dash: "dot" }, name: "g(−Δ)" });
    plot(gdiv, traces, { title: { text: "g(Δ) over every offset Δ = 1.." + (L.T - 1) }, xaxis: { title: { text: "lag Δ = t − s" } },
      yaxis: { title: { text: "g(Δ)" } }, showlegend: !!L.gBack, height: 280 });
    return plots;
  }

  PK.drawLong = function (root, L) {
    var plots = L.overview === false ? [] : drawOverview(root, L);
    var zsec = el("section", { "class": "pk-sec" }, [el("h3", {}, ["Zoom: any window at full resolution"])]);
    root.appendChild(zsec);
    if (!L.q && !L.loadFactors) {
      zsec.appendChild(el("p", { "class": "pk-missing" }, ["The zoom is not available for this view (see the notes above)."]));
      return;
    }
    [L.hint, L.factorNote].forEach(function (t) { if (t) zsec.appendChild(el("p", { "class": "pk-note", "data-pk-zoom-hint": "" }, [t])); });
    var holder = el("div", { "class": "pk-zoom", id: "pk-zoom-" + (++counter) });
    var c = controls(L, holder);
    zsec.appendChild(c.bar);
    zsec.appendChild(holder);
    plots.forEach(function (div) {
      div.on("plotly_click", function (ev) { c.centre(ev.points[0].y, ev.points[0].x); });
    });
    var n0 = Math.min(L.zoom, L.T), s = L.start, w = hashWindow(L);
    if (!w && !L.q) holder.appendChild(el("p", { "class": "pk-note" }, ["Click a block of the overview, or Show: the zoom loads this head's q and k."]));
    else c.show(w || (s ? { r0: s[0], r1: s[1], c0: s[2], c1: s[3] } : { r0: 0, r1: n0 - 1, c0: 0, c1: n0 - 1 }));
    root.setAttribute("data-pk-opened-ms", String(Math.round(performance.now())));
  };

  /* a report's head past 256 tokens: its overview file, then (on the first zoom) its q and
   * its key/value head's k (poskernel_tl/report/long_files.py) */
  PK.loadLong = function (root, F) {
    var base = F.dir + "/", stem = "L" + F.layer + "H" + F.head;
    function get(name, done) {
      PK.script(base + name + ".js", "PK_LONG", F.key + "/" + name, function (v) {
        if (!v) { done(null); return; }
        PK.decodeAll(v).then(function (x) { done(PK.flat(x)); }, function () { done(null); });
      });
    }
    root.textContent = "Loading the long view …";
    get(stem, function (v) {
      if (!v) { root.textContent = "The long view's file " + base + stem + ".js did not load."; return; }
      root.textContent = "";
      var L = v.long;
      L.tokens = F.tokens || Array.from({ length: L.T }, function (_, i) { return "#" + i; });
      root.appendChild(el("p", { "class": "pk-note" }, ["Long view of evaluation sequence " + F.seq + (F.tokens ? "" : " (token strings not available: positions shown)") + "."]));
      v.notes.forEach(function (n) { root.appendChild(el("p", { "class": "pk-note" }, [n])); });
      if (F.zoom) L.loadFactors = function (done) {
        get("Q" + F.layer + "H" + F.head, function (Q) {
          get("K" + F.layer + "G" + F.kv, function (K) {
            if (!Q || !K) { done(false); return; }
            Object.assign(L, { q: Q.q, lse: Q.lse, scale: Q.scale, d: Q.d, check: Q.check, k: K.k, qFrom: 0, kFrom: 0 });
            done(true);
          });
        });
      };
      PK.drawLong(root, L);
    });
  };
})();
