/* poskernel_tl head viewer: Figure 1 as one clickable heatmap per condition, and the view
 * of one head, drawn with Plotly and circuitsvis from the data the report wrote
 * (report/data/{stem}.js assigns window.PK_DATA[key]). Every number shown is read from
 * those files; nothing is fitted or tested here. Text from the data (tokens, names) only
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
  function row(arr, i) {  // the i-th block along the first axes of a decoded array
    var n = arr.shape[arr.shape.length - 1];
    return arr.data.subarray(i * n, (i + 1) * n);
  }
  PK.decode = decode;

  /* ---------------------------------------------------------------- helpers */
  function fixed(x, d) { return x === null || x === undefined || !isFinite(x) ? "–" : Number(x).toFixed(d); }
  function sig(x) { return x === null || x === undefined || !isFinite(x) ? "–" : String(Number(Number(x).toPrecision(4))); }
  function yes(x) { return x === null || x === undefined ? "–" : x ? "yes" : "no"; }
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

  /* ------------------------------------------------- one head from a condition */
  PK.headFromCondition = function (d, layer, head, index) {
    var i = layer * d.n_heads + head, A = d.arrays, T = d.length;
    var num = function (key, label, v, digits) { return [key, label, v, digits]; };
    var p = {
      title: d.model_label + " · " + d.dataset_label + " · T=" + T + " · L" + layer + "H" + head,
      anchor: d.key + "/L" + layer + "H" + head, notes: [], links: [],
      numbers: [num("r2-pooled", "Track A pooled R²", d.r2.pooled[layer][head], 3),
        num("r2-B", d.centered ? "Track B centered R²" : "Track B R² (uncentered)", d.r2.B[layer][head], 3),
        num("r2-B-raw", "Track B raw R²", d.r2.B_raw[layer][head], 3),
        num("r2-nosink", "Track A pooled R², sink column left out", d.r2.nosink[layer][head], 3)],
      kernels: [{ label: "Track A pooled g(Δ)", values: row(A.g_a, i), back: A.g_a_back ? row(A.g_a_back, i) : null },
        { label: "Track B g(Δ) (" + d.g_b_source + ")", values: row(A.g_b, i), back: A.g_b_back ? row(A.g_b_back, i) : null }],
      perSeq: { values: column(A.per_seq, i, d.n_layers * d.n_heads), pooled: d.r2.pooled[layer][head] },
      spectra: ["trackB", "trackA"].map(function (s) { return spectrumOf(d, s, i); }),
      tables: d.extras.map(function (x) { return extraTable(x, i); }), seq: null
    };
    if (d.r2.within) {  // what the softmax sees: the same fit with a free constant per row
      p.numbers.splice(1, 0, num("r2-within", "Track A within-row R² (pooled)",
                                 d.r2.within[layer][head], 3));
    }
    if (A.g_within) {  // drawn over Track A's g, on its mean level
      p.kernels[0].within = row(A.g_within, i);
      p.kernels[0].withinBack = A.g_within_back ? row(A.g_within_back, i) : null;
    }
    if (d.weights) p.notes.push(d.weights);
    if (A.logits) {
      var codes = row(A.logits, i), lo = A.logits_lo.data[i], step = A.logits_step.data[i];
      var full = new Float32Array(T * T).fill(NaN), k = 0, both = d.causal === false;
      for (var t = 0; t < T; t++) for (var s = 0; s < (both ? T : t); s++) if (s !== t) full[t * T + s] = lo + step * codes[k++];
      p.seq = { T: T, logits: full, pattern: null, g: row(A.g_seq, i), r2: d.r2.seq[layer][head],
        gBack: both && A.g_seq_back ? row(A.g_seq_back, i) : null, twoSided: both,
        tokens: d.tokens, step: step,
        label: "evaluation sequence " + d.logits_seq + (d.tokens ? "" : " (token strings not available: positions shown)") };
    }
    if (d.long) p.longFiles = { dir: d.long.dir, key: d.key, layer: layer, head: head, seq: d.long.seq,
      kv: Math.floor(head / (d.group_size || 1)), zoom: d.long.zoom, tokens: d.tokens };
    p.links = otherConditions(d, layer, head, index);
    return p;
  };
  function column(arr, i, stride) {  // per-sequence values of head i from [n, layer, head]
    var n = arr.shape[0], out = new Float32Array(n);
    for (var j = 0; j < n; j++) out[j] = arr.data[j * stride + i];
    return out;
  }
  function spectrumOf(d, source, i) {
    var S = d.spectral[source], A = d.arrays;
    var out = { label: S.label, status: S.status, message: S.message, thetas: d.thetas, peaks: [], summary: [] };
    if (S.status !== "ok") return out;
    var mag = row(A["spec_" + source], i), scale = A["spec_" + source + "_scale"].data[i];
    out.omega = A.omega.data;
    out.power = Float64Array.from(mag, function (m) { return (m * scale) * (m * scale); });
    var f = {}; S.fields.forEach(function (name, j) { f[name] = S.rows[i][j]; });
    out.peaks = S.peaks[i].map(function (pk) {
      var o = {}; S.peak_fields.forEach(function (name, j) { o[name] = pk[j]; }); return o;
    });
    out.summary = [["status", f.status], ["aligned with θᵢ (p < 0.05)", yes(f.aligned)],
      ["p-value (rescaled-θ null)", sig(f.p_value)], ["false-positive rate of the test", sig(f.fpr)],
      ["significant peaks", fixed(f.n_significant, 0) + " of " + fixed(f.n_peaks_found, 0)],
      ["top-5 peaks within ±10% of a θᵢ", fixed(f.n_matched, 0) + " (chance " + fixed(f.chance, 2) + ")"],
      ["in the pre-registered analysis", yes(f.preregistered)]];
    return out;
  }
  function extraTable(x, i) {
    var out = { title: x.title, columns: ["quantity", "value", "95% interval", "note"], rows: [] };
    if (x.status !== "ok") { out.message = x.status + " — " + x.message; return out; }
    var v = x.values[i];
    if (!v) { out.message = "no row for this head"; return out; }
    var note = v[v.length - 1];
    out.rows = x.labels.map(function (label, j) {
      var iv = x.intervals[i] && x.intervals[i][j];
      return [label, sig(v[j]), iv && iv[0] !== null ? "[" + sig(iv[0]) + ", " + sig(iv[1]) + "]" : "",
        j === 0 ? note : ""];
    });
    return out;
  }
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
    drawKernels(root, p.kernels);
    p.spectra.forEach(function (s) { drawSpectrum(root, s); });
    if (p.perSeq) drawPerSeq(root, p.perSeq);
    if (p.tables.length) root.appendChild(section("Further analyses", "This head's rows of the per-head analyses (poskernel analyze NAME).", p.tables.map(drawTable)));
    root.setAttribute("data-pk-state", "drawn");
  };

  function drawSequence(root, q) {
    var T = q.T, id = "pk-cv-" + (++counter), att = [], tokens = [], both = !!q.twoSided;
    for (var t = 0; t < T; t++) {
      var rowv = new Array(T).fill(0), hi = both ? T : t;
      if (q.pattern) { for (var s = 0; s < (both ? T : t + 1); s++) rowv[s] = q.pattern[t * T + s]; }
      else if (t === 0 && !both) { rowv[0] = 1; }
      else {
        var mx = -Infinity, sum = 0;
        for (s = 0; s < hi; s++) if (s !== t) mx = Math.max(mx, q.logits[t * T + s]);
        for (s = 0; s < hi; s++) if (s !== t) { rowv[s] = Math.exp(q.logits[t * T + s] - mx); sum += rowv[s]; }
        for (s = 0; s < hi; s++) rowv[s] /= sum;
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
      : "Softmax of the saved logits over the keys s < t (the diagonal s = t is not saved, so this approximates the pattern; row 0 attends to itself).";
    root.appendChild(section("Attention pattern — " + q.label, note, [cv, strip]));
    if (typeof CircuitsVis === "undefined") {
      cv.setAttribute("data-pk-state", "error");
      cv.textContent = "The circuitsvis bundle did not load.";
    } else {
      CircuitsVis.render(id, CircuitsVis.AttentionPattern, { tokens: tokens, attention: att, maskUpperTri: !both });
      cv.setAttribute("data-pk-cells", String(T * T));
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
    var T = q.T, A = [], F = [], R = [];
    for (var t = 0; t < T; t++) {
      var a = new Array(T).fill(null), f = new Array(T).fill(null), r = new Array(T).fill(null);
      for (var s = 0; s < (q.twoSided ? T : t); s++) {
        if (s === t) continue;
        a[s] = q.logits[t * T + s];
        var g = s < t ? (q.g ? q.g[t - s - 1] : null) : (q.gBack ? q.gBack[s - t - 1] : null);
        if (g !== null) { f[s] = g; r[s] = a[s] - g; }
      }
      A.push(a); F.push(f); R.push(r);
    }
    return [A, F, R];
  }
  function drawKernels(root, kernels) {
    var plots = kernels.map(function () { return box("pk-plot pk-half"); });
    root.appendChild(section("Positional kernel g(Δ)", "Each source on its own axes (their scales differ). Track A: mean sub-diagonal of the raw logits pooled over sequences; Track B: the same fit on the averaged Gram matrix. Orange: Track A within rows (a free constant per row of each sequence, which the softmax ignores), on the raw kernel's mean level.",
      [el("div", { "class": "pk-row" }, plots)]));
    kernels.forEach(function (k, j) {
      var lags = Array.from(k.values, function (_, i) { return i + 1; });
      var traces = [{ x: lags, y: Array.from(k.values), mode: "lines", line: { width: 1.2 }, name: "keys before the query: g(Δ), Δ > 0" }];
      if (k.back) traces.push({ x: lags, y: Array.from(k.back), mode: "lines", line: { width: 1.2, dash: "dot" }, name: "keys after the query: g(−Δ)" });
      if (k.within) traces.push({ x: lags, y: Array.from(k.within), mode: "lines", line: { width: 1.2, color: "#e08a2c" }, name: "within rows (a constant per row removed)" });
      if (k.withinBack) traces.push({ x: lags, y: Array.from(k.withinBack), mode: "lines", line: { width: 1.2, color: "#e08a2c", dash: "dot" }, name: "within rows, g(−Δ)" });
      traces[0].name = k.within && !k.back ? "raw logits: g(Δ)" : traces[0].name;
      plot(plots[j], traces,
        { title: { text: k.label }, showlegend: !!(k.back || k.within), legend: { orientation: "h", y: -0.3 },
          xaxis: { title: { text: k.back ? "|Δ| = |t − s|" : "lag Δ = t − s" }, type: "log", minorloglabels: "complete" }, yaxis: { title: { text: "g(Δ)" } } });
    });
  }
  function drawSpectrum(root, s) {
    if (s.status !== "ok") {
      root.appendChild(section("Spectrum — " + s.label, null, [el("p", { "class": "pk-missing" }, [s.status + " — ", el("code", {}, [s.message])])]));
      return;
    }
    var div = box(), x = [], y = [], shapes = [];
    for (var m = 1; m < s.omega.length; m++) { x.push(s.omega[m]); y.push(s.power[m]); }
    (s.thetas || []).forEach(function (th) {
      if (th >= x[0] && th <= Math.PI) shapes.push({ type: "line", x0: th, x1: th, yref: "paper", y0: 0, y1: 1, line: { color: "#e08a2c", width: 0.8, dash: "dash" } });
    });
    var mk = function (sel, name, sym, color) {
      var pk = s.peaks.filter(sel);
      return { x: pk.map(function (p) { return p.omega; }), y: pk.map(function (p) { return p.magnitude * p.magnitude; }),
        mode: "markers", name: name, marker: { symbol: sym, size: 9, color: color, line: { color: "#000", width: 1 } } };
    };
    var traces = [{ x: x, y: y, mode: "lines", name: "|ĝ(ω)|² as analysed", line: { width: 1 } },
      mk(function (p) { return p.significant && p.matched; }, "significant, matched", "triangle-down", "#2ca02c"),
      mk(function (p) { return p.significant && !p.matched; }, "significant, unmatched", "triangle-down", "#d62728"),
      mk(function (p) { return !p.significant; }, "not significant", "triangle-down-open", "#000")];
    var rows = s.peaks.map(function (p, k) {
      return el("tr", { "data-pk-peak": String(k + 1) }, [el("td", {}, [String(k + 1)]),
        el("td", { "data-pk": "omega", "data-value": String(p.omega) }, [fixed(p.omega, 4)]),
        el("td", {}, [fixed(2 * Math.PI / p.omega, 1)]), el("td", {}, [yes(p.significant)]),
        el("td", {}, [yes(p.matched)]), el("td", {}, [fixed(p.nearest_theta, 4)]),
        el("td", {}, [p.rel_error === null ? "–" : fixed(100 * p.rel_error, 1) + "%"])]);
    });
    var summary = table(["", ""], s.summary.map(function (r) { return el("tr", {}, [el("th", {}, [r[0]]), el("td", {}, [String(r[1])])]); }));
    root.appendChild(section("Spectrum — " + s.label, "Dashed: the model's rotary frequencies θᵢ. Triangles: the top peaks (filled: significant; green: within ±10% of a θᵢ).",
      [div, el("div", { "class": "pk-row" }, [summary, table(["rank", "ω (rad/token)", "period (tokens)", "significant", "matched", "nearest θᵢ", "rel. error"], rows, { "data-pk-peaks": s.label })])]));
    plot(div, traces, { xaxis: { type: "log", minorloglabels: "complete", title: { text: "ω (rad/token)" } }, yaxis: { type: "log", minorloglabels: "complete", title: { text: "power" } }, shapes: shapes, height: 320, legend: { font: { size: 10 } } });
  }
  function drawPerSeq(root, ps) {
    var div = box("pk-plot pk-half");
    root.appendChild(section("Per-sequence R²", "Track A R² of each evaluation sequence; the line is the pooled fit.", [div]));
    plot(div, [{ type: "histogram", x: Array.from(ps.values), nbinsx: 30 }],
      { xaxis: { title: { text: "R² per sequence" } }, yaxis: { title: { text: "sequences" } },
        shapes: ps.pooled === null ? [] : [{ type: "line", x0: ps.pooled, x1: ps.pooled, yref: "paper", y0: 0, y1: 1, line: { color: "#d62728" } }] });
  }
  function drawTable(t) {
    if (t.message) return el("div", {}, [el("h4", {}, [t.title]), el("p", { "class": "pk-missing" }, [t.message])]);
    return el("div", {}, [el("h4", {}, [t.title]), table(t.columns, t.rows.map(function (r) {
      return el("tr", {}, r.map(function (c) { return el("td", {}, [c]); }));
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
  var decoded = {};
  function hashText() {  // a malformed escape (%E0%A4%A) is no address
    try { return decodeURIComponent(location.hash.slice(1)); } catch (e) { return ""; }
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
      decoded[d.key] = decoded[d.key] || decodeAll(d.arrays);
      decoded[d.key].then(function () {
        if (hashText() !== hash) return;  // moved on meanwhile
        PK.renderHead(panel, PK.headFromCondition(d, layer, head, index));
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
