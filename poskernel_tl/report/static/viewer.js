/* poskernel_tl head viewer: Figure 1 as one clickable heatmap per condition, and the view
 * of one head, drawn with Plotly and circuitsvis from the data the report wrote
 * (report/data/{stem}.js assigns window.PK_DATA[key]: one page per head, built in Python by
 * report/head_page.py, as is a notebook's page). Every number, curve and table is drawn as
 * given; nothing is fitted, tested or assembled here. Text from the data (tokens, names) only
 * ever reaches the page through textContent or circuitsvis (React), never as markup. */
(function () {
  "use strict";
  var PK = (window.PK = window.PK || {});
  var counter = 0;

  /* ------------------------------------------------------------ typed arrays */
  var f16 = null;
  function half(bits) {
    if (!f16) {
      f16 = new Float32Array(65536);
      for (var h = 0; h < 65536; h++) {
        var e = (h >> 10) & 31, m = h & 1023, s = h >> 15 ? -1 : 1;
        f16[h] = e === 0 ? s * m * Math.pow(2, -24) : e === 31 ? (m ? NaN : s * Infinity)
          : s * (1 + m / 1024) * Math.pow(2, e - 15);
      }
    }
    var out = new Float32Array(bits.length);
    for (var i = 0; i < bits.length; i++) out[i] = f16[bits[i]];
    return out;
  }
  function typedOf(dtype, buf) {
    return dtype === "f4" ? new Float32Array(buf) : dtype === "f8" ? new Float64Array(buf)
      : dtype === "f2" ? half(new Uint16Array(buf)) : dtype === "u2" ? new Uint16Array(buf)
      : new Uint8Array(buf);
  }
  function decode(spec) {  // a decoded array, or a Promise of one when it was deflated
    var raw = atob(spec.b64), buf = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) buf[i] = raw.charCodeAt(i);
    if (!spec.z) return { data: typedOf(spec.dtype, buf.buffer), shape: spec.shape };
    var stream = new Blob([buf]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (b) {
      return { data: typedOf(spec.dtype, b), shape: spec.shape };
    });
  }
  function decodeAll(obj) {  // every {dtype, shape, b64} inside obj, decoded in place
    var pending = [];
    (function walk(o) {
      Object.keys(o).forEach(function (k) {
        var v = o[k];
        if (!v || typeof v !== "object" || ArrayBuffer.isView(v)) return;
        if (v.b64 !== undefined && v.dtype) {
          var out = decode(v);
          if (out.then) pending.push(out.then(function (d) { o[k] = d; }));
          else o[k] = out;
        } else walk(v);
      });
    })(obj);
    return Promise.all(pending).then(function () { return obj; });
  }

  PK.decode = decode;

  /* ---------------------------------------------------------------- helpers */
  function fixed(x, d) { return x === null || x === undefined || !isFinite(x) ? "–" : Number(x).toFixed(d); }
  function sig(x) { return x === null || x === undefined || !isFinite(x) ? "–" : String(Number(Number(x).toPrecision(4))); }
  /* an element with attributes and children; text reaches the page as text nodes only
   * (also PK.el, for the long view and the head map, loaded after this file) */
  function el(tag, attrs, kids) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    (kids || []).forEach(function (c) {
      if (c !== null && c !== undefined) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }
  PK.el = el;
  function table(head, rows, attrs) {
    return el("table", Object.assign({ "class": "pk-table" }, attrs || {}), [
      el("tr", {}, head.map(function (h) { return el("th", {}, [h]); }))
    ].concat(rows));
  }
  function cell(c) {  // a table cell: text, or {text, attrs}
    return c !== null && typeof c === "object" ? el("td", c.attrs || {}, [String(c.text)]) : el("td", {}, [String(c)]);
  }
  function section(title, note, kids) {
    return el("section", { "class": "pk-sec" }, [el("h3", {}, [title]),
      note ? el("p", { "class": "pk-note" }, [note]) : null].concat(kids));
  }
  function plot(div, traces, layout) {
    var base = { margin: { l: 55, r: 15, t: 30, b: 45 }, font: { size: 11 }, height: 300 };
    Plotly.newPlot(div, traces, Object.assign(base, layout),
      { displaylogo: false, responsive: true, displayModeBar: false });
    return div;
  }
  function box(cls) { return el("div", { "class": cls || "pk-plot" }); }

  /* ------------------------------------------------ links to other views */
  function otherConditions(d, layer, head, index) {
    var links = [["× back to the report", "#"]];
    if (head > 0) links.push(["← L" + layer + "H" + (head - 1), "#" + d.key + "/L" + layer + "H" + (head - 1)]);
    if (head + 1 < d.n_heads) links.push(["L" + layer + "H" + (head + 1) + " →", "#" + d.key + "/L" + layer + "H" + (head + 1)]);
    (index || []).forEach(function (c) {
      if (c.key !== d.key && c.model === d.model && layer < c.n_layers && head < c.n_heads)
        links.push(["same head: " + c.dataset_label + " · T=" + c.length, "#" + c.key + "/L" + layer + "H" + head]);
    });
    return links;
  }

  /* ----------------------------------------------------------- drawing a head */
  PK.renderHead = function (root, p) {
    root.textContent = "";
    root.setAttribute("data-pk-head", p.anchor || p.title);
    root.appendChild(el("h2", { "class": "pk-head-title" }, [p.title]));
    root.appendChild(el("ul", { "class": "pk-links" }, p.links.map(function (l) {
      return el("li", {}, [el("a", { href: l[1] }, [l[0]])]);
    })));
    p.notes.forEach(function (n) { root.appendChild(el("p", { "class": "pk-note" }, [n])); });
    if (p.zoomOnly && p.long && PK.drawLong) {  // one window of a head (HeadView.zoom)
      PK.drawLong(root, p.long);
      root.setAttribute("data-pk-state", "drawn");
      return;
    }
    root.appendChild(table(["quantity", "value"], p.numbers.map(function (n) {
      return el("tr", {}, [el("th", {}, [n[1]]), el("td", { "data-pk": n[0] }, [fixed(n[2], n[3])])]);
    }), { "class": "pk-table pk-numbers" }));
    if (p.seq) drawSequence(root, p.seq);
    else if (p.long && PK.drawLong) PK.drawLong(root, p.long);
    else if (p.longFiles && PK.loadLong) PK.loadLong(root.appendChild(el("div", {})), p.longFiles);
    else root.appendChild(section("Attention pattern and logits", "This condition saved no full logits (run with --save-logits yes to keep them).", []));
    drawPanels(root, p.panels || [], p.shared || {});
    if (p.tables.length) root.appendChild(section("Further analyses", "This head's rows of the per-head analyses (poskernel analyze NAME).", p.tables.map(drawTable)));
    root.setAttribute("data-pk-state", "drawn");
  };

  function fromCodes(q) {  // a report's 8-bit display copy of the logits, as a T × T matrix
    var T = q.T, full = new Float32Array(T * T).fill(NaN), k = 0;
    for (var t = 0; t < T; t++) for (var s = 0; s < (q.twoSided ? T : t); s++) if (s !== t) full[t * T + s] = q.lo + q.step * q.codes[k++];
    return full;
  }
  /* the layer's mask as the page reads it (Mask.page in Python: twoSided, last, chunk):
     whether row t keeps key s — s < t unless two-sided (s = t only with ``diagonal``: the
     softmax reads it, no fit does), |t − s| ≤ last where a window cuts, t and s in one
     chunk where one binds */
  PK.keeps = function (m, t, s, diagonal) {
    if (s === t) return !!diagonal;
    if (!m.twoSided && s > t) return false;
    if (m.last !== null && m.last !== undefined && Math.abs(t - s) > m.last) return false;
    return !m.chunk || Math.floor(t / m.chunk) === Math.floor(s / m.chunk);
  };
  function readsOf(q) {  // the entries the fit reads (the diagonal is not saved)
    return function (t, s) { return PK.keeps(q, t, s, false); };
  }
  function drawSequence(root, q) {
    if (q.codes) q.logits = fromCodes(q);
    var T = q.T, id = "pk-cv-" + (++counter), att = [], tokens = [], both = !!q.twoSided;
    var reads = readsOf(q), kept = 0;
    for (var t = 0; t < T; t++) {
      var rowv = new Array(T).fill(0), hi = both ? T : t;
      if (q.pattern) { for (var s = 0; s < (both ? T : t + 1); s++) rowv[s] = q.pattern[t * T + s]; }
      else if (t === 0 && !both) { rowv[0] = 1; }
      else {
        var mx = -Infinity, sum = 0;
        for (s = 0; s < hi; s++) if (reads(t, s)) { mx = Math.max(mx, q.logits[t * T + s]); kept++; }
        for (s = 0; s < hi; s++) if (reads(t, s)) { rowv[s] = Math.exp(q.logits[t * T + s] - mx); sum += rowv[s]; }
        if (sum > 0) { for (s = 0; s < hi; s++) rowv[s] /= sum; }
        else rowv[t] = 1;  // no saved key kept (a chunk's first row): it attends to itself
      }
      att.push(rowv);
      tokens.push(q.tokens ? String(q.tokens[t]) : String(t));
    }
    var cv = el("div", { id: id, "class": "pk-cv", "data-pk-state": "pending" });
    var strip = el("details", { "class": "pk-tokens" }, [el("summary", {}, [T + " tokens"]),
      el("div", { "class": "pk-tokstrip" }, tokens.map(function (tok, i) {
        return el("span", { "class": "pk-tok", title: String(i) }, [tok]);
      }))]);
    var note = q.pattern ? "The head's attention pattern (hook_pattern)."
      : both ? "Softmax of the saved logits over every key s ≠ t (no causal mask; the diagonal s = t is not saved, so this approximates the pattern)."
      : "Softmax of the saved logits over the keys s < t its mask keeps (within its window or chunk where it has one; the diagonal s = t is not saved, so this approximates the pattern; row 0 attends to itself).";
    root.appendChild(section("Attention pattern — " + q.label, note, [cv, strip]));
    if (typeof CircuitsVis === "undefined") {
      cv.setAttribute("data-pk-state", "error");
      cv.textContent = "The circuitsvis bundle did not load.";
    } else {
      CircuitsVis.render(id, CircuitsVis.AttentionPattern, { tokens: tokens, attention: att, maskUpperTri: !both });
      cv.setAttribute("data-pk-cells", String(T * T));
      if (!q.pattern) cv.setAttribute("data-pk-kept", String(kept));
      cv.setAttribute("data-pk-state", "mounted");
    }
    var mats = fitMatrices(q), plots = [box("pk-plot pk-third"), box("pk-plot pk-third"), box("pk-plot pk-third")];
    var noteFit = (both ? "Every off-diagonal entry (s ≠ t; no causal mask)." : "Strictly lower triangle (s < t).") +
      " Fit: this sequence's g(Δ) from the run, g(t − s); R² of the fit " +
      fixed(q.r2, 3) + "." + (q.step ? " Logits are an 8-bit display copy (step " + sig(q.step) + ")." : "");
    root.appendChild(section("Logits, their Toeplitz fit and the residual", noteFit, [el("div", { "class": "pk-row" }, plots)]));
    ["logits A(t, s)", "fit g(t − s)", "residual A − g(t − s)"].forEach(function (title, j) {
      plot(plots[j], [{ type: "heatmap", z: mats[j], colorscale: j === 2 ? "RdBu" : "Viridis", zmid: j === 2 ? 0 : undefined,
        hovertemplate: "t=%{y} s=%{x}: %{z:.3f}<extra></extra>" }],
      { title: { text: title }, yaxis: { autorange: "reversed", title: { text: "query t" } },
        xaxis: { title: { text: "key s" } }, height: 330 });
    });
  }
  function fitMatrices(q) {
    var T = q.T, A = [], F = [], R = [], reads = readsOf(q);
    for (var t = 0; t < T; t++) {
      var a = new Array(T).fill(null), f = new Array(T).fill(null), r = new Array(T).fill(null);
      for (var s = 0; s < (q.twoSided ? T : t); s++) {
        if (!reads(t, s)) continue;
        a[s] = q.logits[t * T + s];
        var g = s < t ? (q.g ? q.g[t - s - 1] : null) : (q.gBack ? q.gBack[s - t - 1] : null);
        if (g !== null) { f[s] = g; r[s] = a[s] - g; }
      }
      A.push(a); F.push(f); R.push(r);
    }
    return [A, F, R];
  }
  /* every panel of the page, consecutive ones of one section in one row */
  function drawPanels(root, panels, shared) {
    var i = 0;
    while (i < panels.length) {
      var j = i, row = el("div", { "class": "pk-row" });
      while (j < panels.length && panels[j].section === panels[i].section) j++;
      var mine = panels.slice(i, j);
      root.appendChild(section(panels[i].section, panels[i].sectionNote || null, [row]));
      var boxes = mine.map(function (p) {  // every box in place first: Plotly sizes to its box
        if (p.kind === "message") return row.appendChild(el("p", { "class": "pk-missing" }, [p.status + " — ", el("code", {}, [p.text])]));
        return row.appendChild(box(p.width === "full" ? "pk-plot" : "pk-plot pk-half"));
      });
      mine.forEach(function (p, k) {
        if (p.kind === "curve") drawCurve(boxes[k], p, shared);
        else if (p.kind === "histogram") drawHistogram(boxes[k], p);
        else if (p.kind === "matrix") drawMatrix(boxes[k], p);
        if (p.tables && p.tables.length) row.parentNode.appendChild(el("div", { "class": "pk-row" }, p.tables.map(drawGrid)));
      });
      i = j;
    }
  }
  function axis(label, log) {
    var a = { title: { text: label } };
    if (log) Object.assign(a, { type: "log", minorloglabels: "complete" });
    return a;
  }
  function drawCurve(div, p, shared) {
    var shapes = (p.vlines || []).map(function (x) {
      return { type: "line", x0: x, x1: x, yref: "paper", y0: 0, y1: 1, line: { color: "#e08a2c", width: 0.8, dash: "dash" } };
    });
    var traces = p.series.map(function (s) {
      var y = Array.from(s.y, function (v) { return v * (s.scale || 1); }), x = typeof s.x === "string" ? Array.from(shared[s.x]) : s.x ? Array.from(s.x)
        : y.map(function (_, i) { return i + s.first; });
      var t = { x: x, y: y, mode: s.mode, name: s.name, line: { width: s.mode === "lines" ? 1.2 : 1 } };
      if (s.color) t.line.color = s.color;
      if (s.dash) t.line.dash = s.dash;
      if (s.mode === "markers") t.marker = { symbol: s.symbol, size: 9, color: s.color, line: { color: "#000", width: 1 } };
      return t;
    });
    plot(div, traces, { title: { text: p.title || "" }, showlegend: !!p.legend, legend: { orientation: "h", y: -0.3, font: { size: 10 } },
      xaxis: axis(p.xLabel, p.logX), yaxis: axis(p.yLabel, p.logY), shapes: shapes, height: p.width === "full" ? 320 : 300 });
  }
  function drawHistogram(div, p) {
    plot(div, [{ type: "histogram", x: Array.from(p.values), nbinsx: 30 }],
      { xaxis: { title: { text: p.xLabel } }, yaxis: { title: { text: p.yLabel } },
        shapes: p.marker === null || p.marker === undefined ? [] : [{ type: "line", x0: p.marker, x1: p.marker, yref: "paper", y0: 0, y1: 1, line: { color: "#d62728" } }] });
  }
  function drawMatrix(div, p) {
    var n = p.shape[1], z = [];
    for (var r = 0; r < p.shape[0]; r++) z.push(Array.from(p.z.subarray(r * n, (r + 1) * n)));
    plot(div, [{ type: "heatmap", z: z, colorscale: "Viridis" }],
      { xaxis: { title: { text: p.xLabel } }, yaxis: { title: { text: p.yLabel }, autorange: "reversed" } });
  }
  function drawGrid(t) {  // a table of a panel: columns, rows of cells
    return table(t.columns, t.rows.map(function (r) { return el("tr", {}, r.map(cell)); }), t.attrs);
  }
  function drawTable(t) {
    if (t.message) return el("div", {}, [el("h4", {}, [t.title]), el("p", { "class": "pk-missing" }, [t.message])]);
    return el("div", {}, [el("h4", {}, [t.title]), table(t.columns, t.rows.map(function (r) {
      return el("tr", {}, r.map(cell));
    }))]);
  }

  /* ----------------------------------------------------- the report's viewer */
  var index = null;
  function heatmaps(root) {
    var select = el("select", { "class": "pk-select", "aria-label": "condition" },
      index.map(function (c, j) { return el("option", { value: String(j) }, [c.label]); }));
    var div = box("pk-plot pk-fig1");
    root.appendChild(el("p", {}, ["Condition: ", select]));
    root.appendChild(div);
    function show() {
      var c = index[Number(select.value)], shapes = [];
      for (var b = c.group_size; c.group_size > 1 && b < c.n_heads; b += c.group_size)
        shapes.push({ type: "line", x0: b - 0.5, x1: b - 0.5, y0: -0.5, y1: c.n_layers - 0.5, line: { color: "#fff", width: 2 } });
      var kinds = (c.kinds || []).map(function (k) { return c.r2[0].map(function () { return k; }); });
      plot(div, [{ type: "heatmap", z: c.r2, zmin: 0, zmax: 1, colorscale: "Viridis", customdata: kinds,
        colorbar: { title: { text: "R²" } },
        hovertemplate: "L%{y}H%{x}" + (kinds.length ? " (%{customdata})" : "") + ": R² %{z:.3f}<extra></extra>" }],
      { title: { text: c.label + " — Track A pooled R² (click a head)" }, shapes: shapes,
        xaxis: { title: { text: "head" }, dtick: 1 }, yaxis: { title: { text: "layer" }, autorange: "reversed" },
        height: Math.max(320, 18 * c.n_layers + 120) });
      div.removeAllListeners && div.removeAllListeners("plotly_click");
      div.on("plotly_click", function (ev) { location.hash = c.key + "/L" + ev.points[0].y + "H" + ev.points[0].x; });
    }
    select.addEventListener("change", show);
    show();
  }
  /* a data file that assigns window[store][key], loaded once with a <script> element (file://) */
  PK.script = function (src, store, key, done) {
    if ((window[store] || {})[key]) { done(window[store][key]); return; }
    var tag = el("script", { src: src });
    tag.onload = function () { done((window[store] || {})[key] || null); };
    tag.onerror = function () { done(null); };
    document.head.appendChild(tag);
  };
  function load(cond, done) { PK.script(cond.data, "PK_DATA", cond.key, done); }
  var shared = {};
  function hashText() {  // a malformed escape (%E0%A4%A) is no address
    try { return decodeURIComponent(location.hash.slice(1)); } catch (e) { return ""; }
  }
  /* head i's page of a condition's data file, decoded, with what its heads share */
  function pageOf(d, i) {
    shared[d.key] = shared[d.key] || decodeAll(d.shared || {}).then(flat);
    return Promise.all([shared[d.key], decodeAll(d.heads[i])]).then(function (got) {
      var p = flat(got[1]);
      p.shared = got[0];
      if (p.seq && !p.seq.tokens) p.seq.tokens = d.tokens;
      if (p.longFiles && !p.longFiles.tokens) p.longFiles.tokens = d.tokens;
      return p;
    });
  }
  function route() {
    var panel = document.getElementById("pk-head"), hash = hashText();
    var m = /^(.+)\/L(\d+)H(\d+)(?:\/zoom=\d{1,7}-\d{1,7},\d{1,7}-\d{1,7})?$/.exec(hash);
    if (!m) { panel.hidden = true; panel.textContent = ""; return; }
    var cond = index.filter(function (c) { return c.key === m[1]; })[0];
    var layer = Number(m[2]), head = Number(m[3]);
    panel.hidden = false;
    if (!cond || layer >= cond.n_layers || head >= cond.n_heads) {
      panel.textContent = "No head at “" + hash + "” in this report.";
      return;
    }
    panel.textContent = "Loading " + cond.label + " …";
    load(cond, function (d) {
      if (!d) { panel.textContent = "The data file " + cond.data + " did not load."; return; }
      pageOf(d, layer * d.n_heads + head).then(function (p) {
        if (hashText() !== hash) return;  // moved on meanwhile
        p.links = otherConditions(d, layer, head, index);
        PK.renderHead(panel, p);
        panel.scrollTop = 0;
      }, function (err) { panel.textContent = "The data of " + cond.label + " could not be decoded: " + err; });
    });
  }
  PK.start = function () {
    index = JSON.parse(document.getElementById("pk-index").textContent);
    var root = document.getElementById("pk-fig1");
    if (typeof Plotly === "undefined") { root.textContent = "The Plotly bundle did not load (assets/plotly.min.js)."; return; }
    if (index.length) heatmaps(root);
    window.addEventListener("hashchange", route);
    route();
  };
  function flat(o) {  // every decoded {data, shape} inside o replaced by its typed array
    Object.keys(o).forEach(function (k) {
      var v = o[k];
      if (!v || typeof v !== "object" || ArrayBuffer.isView(v)) return;
      if (v.data && ArrayBuffer.isView(v.data) && v.shape) o[k] = v.data;
      else flat(v);
    });
    return o;
  }
  PK.decodeAll = decodeAll;
  PK.flat = flat;
  PK.showHead = function (id, payloadId) {  // a single head from an inline payload (notebooks)
    decodeAll(JSON.parse(document.getElementById(payloadId).textContent)).then(function (p) {
      PK.renderHead(document.getElementById(id), flat(p));
    });
  };
})();
