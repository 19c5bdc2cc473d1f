/* attnscope's attention viewer: the report page and `show` in a notebook. No library, no network, no eval.
   It reads the JSON data element (class asv-data) inside its root (the element this script sits in) and draws
   into the elements of that root marked data-viewer="head" | "gallery" | "matrix" | "compare" | "ablation" |
   "models" (the slider over the models of a report of several).
   The data's encodings are described in attnscope/output/viewer.py. */
(function () {
  "use strict";
  var script = document.currentScript;
  var root = script && script.parentNode;
  if (!root) { return; }
  var source = root.querySelector("script.asv-data");
  if (!source) { return; }
  var data = JSON.parse(source.textContent);
  var V = data.viewer;
  var HEADS = V.head_ids.length;
  // A report of several models: V.models[m] holds model m's records, characteristic heads and maps (the primary
  // model's maps, V.primary's, are the texts' own: the last model, the one the page opens on and whose tables,
  // diversity and ablation it holds); `records` and V.characteristic are the model shown's.
  var MODELS = V.models && V.models.length > 1 ? V.models : null;
  var PRIMARY = MODELS ? (typeof V.primary === "number" ? V.primary : MODELS.length - 1) : 0;
  var records = {};
  function useRecords(list) { records = {}; (list || []).forEach(function (r) { records[r.label] = r; }); }
  useRecords(MODELS ? MODELS[PRIMARY].heads : data.heads && data.heads.heads);
  var roles = {};
  V.roles.forEach(function (r) { roles[r.name] = r; });
  var scores = {};
  V.scores.forEach(function (s) { scores[s.name] = s; });
  var MASKED = [232, 232, 232];
  var BLUES = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225], [107, 174, 214],
    [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];
  var HEAD_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000", "#F0E442",
    "#7B3294", "#1B7837", "#A6611A", "#5E3C99", "#E7298A", "#66A61E", "#E6AB02", "#666666"];

  // ------------------------------------------------------------------------------------------------ helpers
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") { node.textContent = attrs[key]; }
      else if (key === "cls") { node.className = attrs[key]; }
      else if (key === "style") { node.style.cssText = attrs[key]; }
      else { node.setAttribute(key, attrs[key]); }
    });
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }
  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } return node; }
  // A view's labels of the query `row` and of the key `column` marked hot, and the two kept on its node (null: none).
  function markHot(node, rowLabels, columnLabels, row, column) {
    rowLabels.forEach(function (span, i) { span.classList.toggle("hot", i === row); });
    columnLabels.forEach(function (span, j) { span.classList.toggle("hot", j === column); });
    node.dataset.row = row === null || row === undefined ? "" : String(row);
    node.dataset.column = column === null || column === undefined ? "" : String(column);
  }
  function fixed(value, digits) { return value === null || value === undefined || isNaN(value) ? "-" : value.toFixed(digits); }
  function bytesOf(text) {
    var raw = atob(text), bytes = new Uint8Array(raw.length);
    for (var k = 0; k < raw.length; k++) { bytes[k] = raw.charCodeAt(k); }
    return bytes;
  }
  function ramp(stops, t) {
    t = Math.max(0, Math.min(1, t));
    var x = t * (stops.length - 1), k = Math.min(Math.floor(x), stops.length - 2), f = x - k;
    var a = stops[k], b = stops[k + 1];
    return [a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f];
  }
  function css(rgb) { return "rgb(" + Math.round(rgb[0]) + "," + Math.round(rgb[1]) + "," + Math.round(rgb[2]) + ")"; }
  // The colour scales of output/scales.py, from the page's data: the same stops and ends as the pictures' (a value
  // has one colour in importance.png, js_matrix.png and here).
  var SCALES = V.scales || {};
  Object.keys(SCALES).forEach(function (name) {
    SCALES[name].rgb = SCALES[name].stops.map(function (hex) {
      return [parseInt(hex.slice(1, 3), 16), parseInt(hex.slice(3, 5), 16), parseInt(hex.slice(5, 7), 16)];
    });
  });
  function scaleEnds(scale, largest) {  // ColourScale.limits
    if (scale.signed) { var limit = Math.max(Math.abs(largest), scale.high || 0) || 1; return [-limit, limit]; }
    var low = scale.low || 0, high = scale.high === null || scale.high === undefined ? largest : scale.high;
    return [low, high > low ? high : low + 1];
  }
  function scaleColour(name, value, largest) {  // ColourScale.rgb
    var scale = SCALES[name], ends = scaleEnds(scale, largest);
    return ramp(scale.rgb, (value - ends[0]) / (ends[1] - ends[0]));
  }
  function inkOn(rgb) {  // black or white, whichever reads on `rgb` (WCAG relative luminance, as the pictures')
    var c = rgb.map(function (v) { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2] > 0.179 ? "#000" : "#fff";
  }
  function scaleBar(name) {
    return el("span", { cls: "asv-bar", style: "background:linear-gradient(to right," + SCALES[name].stops.join(",") + ")" });
  }
  function weightColour(value) { return isNaN(value) ? MASKED : ramp(BLUES, Math.sqrt(Math.max(value, 0))); }
  function label(li, hi) { return V.layer_ids[li] + "." + V.head_ids[hi]; }
  function indexOfLabel(text) {
    var parts = String(text).split(".");
    var li = V.layer_ids.indexOf(Number(parts[0])), hi = V.head_ids.indexOf(Number(parts[1]));
    return li < 0 || hi < 0 ? null : [li, hi];
  }
  function roleChip(roleName) {
    var role = roles[roleName];
    if (!role) { return el("span"); }
    return el("span", { cls: "chip", text: role.short, style: "background:" + role.colour + ";color:" + role.ink });
  }

  // --------------------------------------------------------------------------------------------------- maps
  var cache = {}, cacheKeys = [];
  function mapsOf(t, model) { return MODELS && MODELS[model].maps ? MODELS[model].maps[t] : V.texts[t]; }  // {maps, scale}
  function tokenMap(t, li, hi, model) {
    var text = V.texts[t], n = text.n, source = mapsOf(t, model);
    if (!source.bytes) { source.bytes = bytesOf(source.maps); }
    var cells = V.causal ? n * (n + 1) / 2 : n * n;
    var base = (li * HEADS + hi) * cells, scale = source.scale[li][hi];
    var m = new Float32Array(n * n);
    for (var i = 0; i < n; i++) {
      var row = V.causal ? base + i * (i + 1) / 2 : base + i * n;
      for (var j = 0; j < n; j++) {
        if (V.causal && j > i) { m[i * n + j] = NaN; continue; }
        var x = source.bytes[row + j] / 255;
        m[i * n + j] = scale * x * x;
      }
    }
    return m;
  }
  function wordMap(t, m) {  // rows: the mean of a word's token rows; columns: the sum over its tokens (scores.words)
    var text = V.texts[t], n = text.n, words = text.words, W = words.length;
    var out = new Float32Array(W * W);
    for (var v = 0; v < W; v++) {
      for (var w = 0; w < W; w++) {
        var sum = 0, seen = false;
        for (var i = words[v][0]; i < words[v][1]; i++) {
          for (var j = words[w][0]; j < words[w][1]; j++) {
            var a = m[i * n + j];
            if (!isNaN(a)) { sum += a; seen = true; }
          }
        }
        out[v * W + w] = seen ? sum / (words[v][1] - words[v][0]) : NaN;
      }
    }
    return out;
  }
  function matrix(t, li, hi, unit, model) {  // model: the one shown when not given
    model = model === undefined ? state.model : model;
    var key = model + ":" + t + ":" + li + ":" + hi + ":" + unit;
    if (cache[key]) { return cache[key]; }
    var m = tokenMap(t, li, hi, model);
    if (unit === "words") { m = wordMap(t, m); }
    cache[key] = m;
    cacheKeys.push(key);
    if (cacheKeys.length > 256) { delete cache[cacheKeys.shift()]; }
    return m;
  }
  function unitLabels(t, unit) { return unit === "words" ? V.texts[t].word_text : V.texts[t].labels; }

  // ------------------------------------------------------------------------------------------------ heatmap
  // A map as a canvas (one cell per query row and key column) with optional labels; highlight(row, column).
  function Heatmap(m, labels, px, options) {
    options = options || {};
    var n = labels.length;
    // a map with labels has whole-pixel cells (its labels line up); a small one without fills `px` exactly
    var cell = options.labels === false ? px / n : Math.max(1, Math.min(options.maxCell || 22, Math.floor(px / n)));
    var size = Math.round(n * cell);
    var base = document.createElement("canvas");
    base.width = n; base.height = n;
    var context = base.getContext("2d"), image = context.createImageData(n, n);
    for (var k = 0; k < n * n; k++) {
      var rgb = weightColour(m[k]);
      image.data[4 * k] = rgb[0]; image.data[4 * k + 1] = rgb[1]; image.data[4 * k + 2] = rgb[2];
      image.data[4 * k + 3] = 255;
    }
    context.putImageData(image, 0, 0);
    var canvas = el("canvas", { width: size, height: size });
    var draw = canvas.getContext("2d");
    var showLabels = options.labels !== false && cell >= 8;
    var thinned = options.labels !== false && !showLabels && n > 1;  // a long text: every k-th label, as the PNGs
    var node = el("div", { cls: "asv-heat" });
    var rows = [], cols = [];
    if (thinned) {
      var ticks = thinnedTicks(n, Math.floor(size / THIN_PITCH)), half = THIN_FONT * 0.6;
      node.appendChild(el("div"));
      var above = el("div", { cls: "asv-cols asv-thin", style: "width:" + size + "px" });
      var beside = el("div", { cls: "asv-rows asv-thin", style: "height:" + size + "px" });
      ticks.forEach(function (i) {
        var text = i + " " + labels[i], middle = i * cell + cell / 2 - half;  // the position too: `40 river`
        var c = el("span", { text: text, title: labels[i] + " (key " + i + ")", style: "left:" + middle + "px;font-size:" + THIN_FONT + "px" });
        var r = el("span", { text: text, title: labels[i] + " (query " + i + ")", style: "top:" + middle + "px;font-size:" + THIN_FONT + "px" });
        c.addEventListener("mouseenter", function () { options.onHover && options.onHover({ key: i }); });
        r.addEventListener("mouseenter", function () { options.onHover && options.onHover({ query: i }); });
        above.appendChild(c); beside.appendChild(r); cols[i] = c; rows[i] = r;
      });
      node.appendChild(above); node.appendChild(beside);
    }
    if (showLabels) {
      var font = Math.min(cell - 2, 12) + "px";
      node.appendChild(el("div"));
      var top = el("div", { cls: "asv-cols" });
      var left = el("div", { cls: "asv-rows" });
      labels.forEach(function (text, i) {
        var c = el("span", { text: text, title: text + " (key " + i + ")", style: "width:" + cell + "px;font-size:" + font + ";line-height:" + cell + "px" });
        var r = el("span", { text: text, title: text + " (query " + i + ")", style: "height:" + cell + "px;font-size:" + font + ";line-height:" + cell + "px" });
        c.addEventListener("mouseenter", function () { options.onHover && options.onHover({ key: i }); });
        r.addEventListener("mouseenter", function () { options.onHover && options.onHover({ query: i }); });
        top.appendChild(c); left.appendChild(r); cols.push(c); rows.push(r);
      });
      node.appendChild(top); node.appendChild(left);
    }
    node.appendChild(canvas);
    if (!showLabels && !thinned) { node.style.gridTemplateColumns = "auto"; }
    function at(event) {
      var box = canvas.getBoundingClientRect();
      var j = Math.floor((event.clientX - box.left) / cell), i = Math.floor((event.clientY - box.top) / cell);
      return i >= 0 && j >= 0 && i < n && j < n ? { query: i, key: j } : null;
    }
    canvas.addEventListener("mousemove", function (event) { var p = at(event); if (p && options.onHover) { options.onHover(p); } });
    canvas.addEventListener("mouseleave", function () { options.onHover && options.onHover(null); });
    if (options.onClick) { canvas.addEventListener("click", options.onClick); }
    function highlight(row, column) {
      draw.imageSmoothingEnabled = false;
      draw.drawImage(base, 0, 0, size, size);
      draw.lineWidth = Math.max(1, Math.min(2, cell / 3));
      draw.strokeStyle = "#e69f00";
      if (row !== null && row !== undefined && row < n) { draw.strokeRect(0.5, row * cell + 0.5, size - 1, Math.max(cell - 1, 1)); }
      if (column !== null && column !== undefined && column < n) { draw.strokeRect(column * cell + 0.5, 0.5, Math.max(cell - 1, 1), size - 1); }
      if (row !== null && row !== undefined && column !== null && column !== undefined) {
        draw.strokeStyle = "#d00";
        draw.strokeRect(column * cell + 0.5, row * cell + 0.5, Math.max(cell - 1, 1), Math.max(cell - 1, 1));
      }
      markHot(node, rows, cols, row, column);
    }
    highlight(null, null);
    return { node: node, highlight: highlight, canvas: canvas };
  }

  // Labels of a long text's map, thinned as the pictures thin theirs (output/figures.py thinned_ticks): every k-th
  // token (k one of 1, 2, 5, 10, 20, ...) from the first, and the last, each at least THIN_PITCH pixels apart.
  var THIN_FONT = 10, THIN_PITCH = 14;
  function niceStep(atLeast) {
    for (var power = 1; ; power *= 10) {
      for (var k = 0; k < 3; k++) { if ([1, 2, 5][k] * power >= atLeast) { return [1, 2, 5][k] * power; } }
    }
  }
  function thinnedTicks(n, fit) {
    fit = Math.max(2, fit);
    var ticks = [];
    if (n <= fit) { for (var all = 0; all < n; all++) { ticks.push(all); } return ticks; }
    var step = niceStep((n - 1) / (fit - 1));
    for (var i = 0; i < n - 1; i += step) { ticks.push(i); }
    if (ticks.length > 1 && (n - 1) - ticks[ticks.length - 1] <= step / 2) { ticks.pop(); }
    ticks.push(n - 1);
    return ticks;
  }

  function scaleKey() {
    var bar = el("span", { cls: "asv-bar" });
    var stops = [];
    for (var k = 0; k <= 10; k++) { stops.push(css(weightColour((k / 10) * (k / 10))) + " " + k * 10 + "%"); }
    bar.style.background = "linear-gradient(to right," + stops.join(",") + ")";
    var parts = [el("span", { text: "weight 0" }), bar, el("span", { text: "1 (colour ∝ √weight)" })];
    if (V.causal) {
      parts.push(el("span", { cls: "asv-swatch", style: "background:" + css(MASKED) }));
      parts.push(el("span", { text: "a key after the query (not seen)" }));
    }
    return el("div", { cls: "asv-key" }, parts);
  }

  // -------------------------------------------------------------------------------------------------- lines
  // bertviz's view: queries left, keys right, a line per weight (opacity = weight), one colour per head.
  function Lines(maps, labels, onHover) {
    var n = labels.length, step = 18, width = 240;
    var canvas = el("canvas", { width: width, height: n * step });
    var left = el("div", { cls: "side left" }), right = el("div", { cls: "side right" });
    var lefts = [], rights = [];
    labels.forEach(function (text, i) {
      var a = el("span", { text: text, title: text + " (query " + i + ")" });
      var b = el("span", { text: text, title: text + " (key " + i + ")" });
      a.addEventListener("mouseenter", function () { onHover({ query: i }); });
      b.addEventListener("mouseenter", function () { onHover({ key: i }); });
      left.appendChild(a); right.appendChild(b); lefts.push(a); rights.push(b);
    });
    var node = el("div", { cls: "asv-lines" }, [left, canvas, right]);
    node.addEventListener("mouseleave", function () { onHover(null); });
    var draw = canvas.getContext("2d");
    function highlight(row, column) {
      draw.clearRect(0, 0, width, n * step);
      var focused = (row !== null && row !== undefined) || (column !== null && column !== undefined);
      maps.forEach(function (entry) {
        draw.strokeStyle = entry.colour;
        for (var i = 0; i < n; i++) {
          if (row !== null && row !== undefined && i !== row) { continue; }
          for (var j = 0; j < n; j++) {
            if (column !== null && column !== undefined && j !== column) { continue; }
            var w = entry.m[i * n + j];
            if (isNaN(w) || w < (focused ? 0.002 : 0.05)) { continue; }
            draw.globalAlpha = Math.min(1, focused ? w * 1.5 + 0.05 : w * 0.8);
            draw.lineWidth = focused ? 2 : 1;
            draw.beginPath();
            draw.moveTo(0, i * step + step / 2);
            draw.lineTo(width, j * step + step / 2);
            draw.stroke();
          }
        }
      });
      draw.globalAlpha = 1;
      markHot(node, lefts, rights, row, column);
    }
    highlight(null, null);
    return { node: node, highlight: highlight, canvas: canvas };
  }

  // ----------------------------------------------------------------------------------------------- the state
  var state = { li: 0, hi: 0, text: "auto", unit: V.words ? "words" : "tokens", view: "map", scope: "head", hover: null, model: PRIMARY };
  var explore = root.querySelector(".explore") || root.querySelector('[data-viewer="head"]');
  var panel = root.querySelector('[data-viewer="head"]');
  var shown = [];  // what the panel draws now: {highlight} components
  var readout = null, strip = null;

  function record(li, hi) { return records[label(li, hi)] || null; }
  function currentText() {
    if (state.text !== "auto") { return state.text; }
    var r = record(state.li, state.hi);
    var example = r && V.examples ? V.examples[r.role] : undefined;
    return example === undefined ? 0 : example;
  }

  function reason(r) {
    var role = roles[r.role], score = scores[r.role_metric];
    var name = score ? score.label : r.role_metric;
    if (!role) { return ""; }
    if (r.role === "mixed") {
      var closest = V.roles.filter(function (x) { return x.score === r.role_metric; })[0];
      return "mixed: no rule passes; the closest is " + name + " " + fixed(r.role_score, 2) +
        (closest && closest.threshold !== null ? " (the " + closest.name + " threshold is " + closest.threshold + ")" : "") + ".";
    }
    return r.role + ": " + name + " " + fixed(r.role_score, 2) + " ≥ " + role.threshold + " — " + role.description + ".";
  }

  function toggle(options, current, onChoose) {
    var box = el("span", { cls: "asv-toggle" });
    options.forEach(function (option) {
      var button = el("button", { type: "button", text: option[1], "data-value": option[0] });
      if (option[0] === current) { button.className = "on"; }
      button.addEventListener("click", function () { onChoose(option[0]); });
      box.appendChild(button);
    });
    return box;
  }

  function topList(values, names, skip, count) {
    var order = [];
    for (var k = 0; k < values.length; k++) { if (!isNaN(values[k]) && k !== skip) { order.push(k); } }
    order.sort(function (a, b) { return values[b] - values[a] || a - b; });
    return order.slice(0, count).map(function (k) { return "“" + names[k] + "”@" + k + " " + fixed(values[k], 2); }).join(" · ");
  }

  function setHover(hover) { state.hover = hover; refreshHover(); }

  function refreshHover() {
    var h = state.hover || {};
    var row = h.query === undefined ? null : h.query, column = h.key === undefined ? null : h.key;
    shown.forEach(function (component) { component.highlight(row, column); });
    var t = currentText(), names = unitLabels(t, state.unit), n = names.length;
    var m = matrix(t, state.li, state.hi, state.unit);
    if (readout) {
      var head = label(state.li, state.hi) + ": ";
      if (row !== null && column !== null) {
        readout.textContent = head + "“" + names[row] + "”@" + row + " → “" + names[column] + "”@" + column + ": " +
          fixed(m[row * n + column], 3) + ". It looks most at: " + topList(m.subarray(row * n, row * n + n), names, -1, 5);
      } else if (row !== null) {
        readout.textContent = head + "“" + names[row] + "”@" + row + " looks most at: " + topList(m.subarray(row * n, row * n + n), names, -1, 6);
      } else if (column !== null) {
        var col = new Float32Array(n);
        for (var i = 0; i < n; i++) { col[i] = m[i * n + column]; }
        readout.textContent = head + "“" + names[column] + "”@" + column + " is looked at most by: " + topList(col, names, -1, 6);
      } else {
        readout.textContent = "Hover a token (in the map's labels, the map or the text below) to see where it looks and what looks at it.";
      }
    }
    if (strip) {
      var spans = strip.children;
      for (var k = 0; k < spans.length; k++) {
        var span = spans[k], w = null, colour = null;
        if (row !== null) { w = m[row * n + k]; colour = "0,114,178"; }
        else if (column !== null) { w = m[k * n + column]; colour = "213,94,0"; }
        span.classList.toggle("q", k === (row !== null ? row : column));
        if (w === null || isNaN(w)) {
          span.style.background = ""; span.style.color = ""; span.removeAttribute("data-weight");
        } else {
          var alpha = Math.sqrt(Math.max(w, 0));
          span.style.background = "rgba(" + colour + "," + alpha.toFixed(3) + ")";
          span.style.color = alpha > 0.55 ? "#fff" : "";
          span.setAttribute("data-weight", w.toFixed(4));
        }
      }
    }
  }

  // ------------------------------------------------------------------------------------------------- the panel
  function renderHead() {
    if (!panel) { return; }
    clear(panel);
    shown = [];
    var t = currentText(), text = V.texts[t], r = record(state.li, state.hi), name = label(state.li, state.hi);
    panel.dataset.head = name;
    panel.dataset.text = String(t);
    var title = el("div", { cls: "asv-title" }, ["Head " + name + " "]);
    if (r) { title.appendChild(roleChip(r.role)); title.appendChild(document.createTextNode(" " + r.role)); }
    if (MODELS) {
      panel.dataset.model = MODELS[state.model].label;
      title.appendChild(el("span", { cls: "asv-model-tag", text: MODELS[state.model].label }));
    }
    panel.appendChild(title);
    if (V.mode === "show") {
      var buttons = el("div", { cls: "asv-heads" }, ["Head: "]);
      V.head_ids.forEach(function (head, hi) {
        var b = el("button", { type: "button", text: String(head), cls: hi === state.hi ? "on" : "" });
        b.addEventListener("click", function () { select(state.li, hi); });
        buttons.appendChild(b);
      });
      panel.appendChild(buttons);
    }
    if (r) {
      panel.appendChild(el("div", { cls: "asv-reason", text: reason(r) }));
      var list = el("div", { cls: "asv-scores" });
      V.scores.forEach(function (s) {
        if (r[s.name] === null || r[s.name] === undefined || !s.per_head) { return; }
        list.appendChild(el("span", { cls: s.name === r.role_metric ? "deciding" : "", title: s.label + ": " + s.description,
          text: s.short + " " + fixed(r[s.name], 2) }));
      });
      panel.appendChild(list);
    }
    if (V.dependencies) { panel.appendChild(circuitPanel(name)); }
    var controls = el("div", { cls: "asv-controls" });
    if (V.texts.length > 1) {
      var select_ = el("select", { "aria-label": "text" });
      var example = r && V.examples[r.role] !== undefined ? V.texts[V.examples[r.role]].name : V.texts[0].name;
      select_.appendChild(el("option", { value: "auto", text: "the text for its role: " + example }));
      V.texts.forEach(function (x, k) { select_.appendChild(el("option", { value: String(k), text: x.name })); });
      select_.value = String(state.text);
      select_.addEventListener("change", function () { state.text = select_.value === "auto" ? "auto" : Number(select_.value); renderHead(); });
      controls.appendChild(el("label", {}, ["Text ", select_]));
    }
    controls.appendChild(toggle([["tokens", "tokens"], ["words", "words"]], state.unit, function (v) { state.unit = v; state.hover = null; renderHead(); }));
    controls.appendChild(toggle([["map", "map"], ["lines", "lines"]], state.view, function (v) { state.view = v; renderHead(); }));
    if (HEADS > 1) {
      controls.appendChild(toggle([["head", "this head"], ["layer", "all heads of layer " + V.layer_ids[state.li]]], state.scope,
        function (v) { state.scope = v; renderHead(); }));
    }
    panel.appendChild(controls);
    readout = el("div", { cls: "asv-readout" });
    panel.appendChild(readout);
    var names = unitLabels(t, state.unit);
    var view = el("div", { cls: "asv-view" });
    if (state.view === "lines") {
      var maps = [];
      var heads = state.scope === "layer" ? V.head_ids.map(function (_, hi) { return hi; }) : [state.hi];
      heads.forEach(function (hi) {
        maps.push({ m: matrix(t, state.li, hi, state.unit), colour: state.scope === "layer" ? HEAD_COLOURS[hi % HEAD_COLOURS.length] : "#0072B2" });
      });
      var lines = Lines(maps, names, setHover);
      shown.push(lines);
      if (state.scope === "layer") {
        view.appendChild(el("div", { cls: "asv-key" }, heads.map(function (hi) {
          return el("span", {}, [el("span", { cls: "asv-swatch", style: "background:" + HEAD_COLOURS[hi % HEAD_COLOURS.length] }), " " + label(state.li, hi)]);
        })));
      }
      view.appendChild(lines.node);
    } else if (state.scope === "layer") {
      var grid = el("div", { cls: "asv-grid" });
      V.head_ids.forEach(function (_, hi) {
        var rr = record(state.li, hi);
        var small = Heatmap(matrix(t, state.li, hi, state.unit), names, 170, { labels: false, onHover: setHover,
          onClick: function () { state.scope = "head"; select(state.li, hi); } });
        shown.push(small);
        var caption = el("div", {}, [label(state.li, hi) + " "]);
        if (rr) { caption.appendChild(roleChip(rr.role)); }
        grid.appendChild(el("div", { cls: "asv-card" + (hi === state.hi ? " on" : ""), "data-head": label(state.li, hi) }, [caption, small.node]));
      });
      view.appendChild(grid);
      view.appendChild(scaleKey());
    } else {
      var big = Heatmap(matrix(t, state.li, state.hi, state.unit), names, 560, { onHover: setHover });
      shown.push(big);
      view.appendChild(el("div", { cls: "wide" }, [big.node]));
      view.appendChild(scaleKey());
    }
    view.addEventListener("mouseleave", function () { setHover(null); });
    panel.appendChild(view);
    strip = el("div", { cls: "asv-strip" });
    names.forEach(function (text_, k) {
      var span = el("span", { text: text_, "data-i": String(k) });
      span.addEventListener("mouseenter", function () { setHover({ query: k }); });
      strip.appendChild(span);
    });
    strip.addEventListener("mouseleave", function () { setHover(null); });
    panel.appendChild(el("div", { cls: "small", text: "The text (" + state.unit + "); hover one to shade where it looks:" }));
    panel.appendChild(strip);
    var notes = [];
    if (text.n < text.length) { notes.push("The first " + text.n + " of this text's " + text.length + " tokens are drawn."); }
    if (state.unit === "tokens" && text.words.length < text.n) { notes.push(V.continued_legend + "."); }
    if (state.unit === "words") { notes.push("Words: the mean of their tokens' rows, the sum over their tokens' columns."); }
    if (notes.length) { panel.appendChild(el("div", { cls: "small", text: notes.join(" ") })); }
    if (V.texts.length > 1) {
      panel.appendChild(el("h3", { text: "Head " + name + " on every text" }));
      var thumbs = el("div", { cls: "asv-grid" });
      V.texts.forEach(function (x, k) {
        var thumb = Heatmap(matrix(k, state.li, state.hi, "tokens"), x.labels, 96, { labels: false });
        var card = el("div", { cls: "asv-card" + (k === t ? " on" : ""), title: x.name, "data-text": String(k) },
          [thumb.node, el("span", { cls: "name", text: x.name })]);
        card.addEventListener("click", function () { state.text = k; renderHead(); });
        thumbs.appendChild(card);
      });
      panel.appendChild(thumbs);
    }
    refreshHover();
  }

  function select(li, hi, scroll) {
    state.li = li; state.hi = hi; state.hover = null;
    root.querySelectorAll("table.rolemap td.cell, table.asv-ablation td").forEach(function (cell) {
      cell.classList.toggle("sel", cell.dataset.head === label(li, hi));
    });
    renderHead();
    markCircuit();
    if (scroll && explore) { explore.scrollIntoView({ block: "start" }); }
    if (explore) { explore.focus({ preventScroll: true }); }
  }

  function selectLabel(text, scroll) {
    var at = indexOfLabel(text);
    if (at) { select(at[0], at[1], scroll); }
  }

  if (explore) {
    explore.addEventListener("keydown", function (event) {
      var tag = event.target.tagName;
      if (tag === "SELECT" || tag === "INPUT") { return; }
      var li = state.li, hi = state.hi, L = V.layer_ids.length;
      if (event.key === "ArrowRight") { hi += 1; if (hi >= HEADS) { hi = 0; li = (li + 1) % L; } }
      else if (event.key === "ArrowLeft") { hi -= 1; if (hi < 0) { hi = HEADS - 1; li = (li - 1 + L) % L; } }
      else if (event.key === "ArrowDown") { li = Math.min(L - 1, li + 1); }
      else if (event.key === "ArrowUp") { li = Math.max(0, li - 1); }
      else { return; }
      event.preventDefault();
      select(li, hi);
    });
  }

  // -------------------------------------------------------------------------------------- the role map's colours
  var colouring = "role";  // what the role map's cells show: the role, or a score's name
  function colourBy() {
    var holder = root.querySelector(".colour-by");
    var cells = root.querySelectorAll("table.rolemap td.cell");
    if (!holder || !cells.length) { return; }
    var chooser = el("select", { "aria-label": "colour the map by" });
    chooser.appendChild(el("option", { value: "role", text: "role" }));
    V.scores.forEach(function (s) {
      var any = Object.keys(records).some(function (k) { return records[k][s.name] !== null && records[k][s.name] !== undefined; });
      if (s.per_head && any) { chooser.appendChild(el("option", { value: s.name, text: s.label + " (" + s.short + ")" })); }
    });
    holder.appendChild(el("label", {}, ["Colour the map by ", chooser, " "]));
    holder.appendChild(el("span", { cls: "small asv-colour-key" }));
    cells.forEach(function (cell) {  // with grouped-query attention, the tooltip's key/value head stays
      var kv = (cell.getAttribute("title") || "").match(/; reads .*$/);
      cell.dataset.kv = kv ? kv[0] : "";
    });
    chooser.addEventListener("change", function () { colouring = chooser.value; paintRoleMap(); });
  }

  // A role map cell's text, in its label (the chip the circuit's arrows pass under).
  function cellText(cell, text) {
    var span = cell.querySelector(".asv-label");
    if (!span) { span = el("span", { cls: "asv-label" }); clear(cell).appendChild(span); }
    span.textContent = text;
  }

  // The role map's cells from the records of the model shown: each head's role (colour, short name, tooltip), or
  // its value of the score chosen, on the score's picture's scale.
  function paintRoleMap() {
    var cells = root.querySelectorAll("table.rolemap td.cell");
    var key = root.querySelector(".asv-colour-key");
    if (!cells.length) { return; }
    if (colouring === "role") {
      cells.forEach(function (cell) {
        var r = records[cell.dataset.head], role = r && roles[r.role];
        if (!role) { return; }
        var metric = scores[r.role_metric];
        cell.style.background = role.colour;
        cell.style.color = role.ink;
        cellText(cell, role.short);
        cell.dataset.role = r.role;
        cell.title = r.label + " " + r.role + ": " + (metric ? metric.short : r.role_metric) + " " + fixed(r.role_score, 2) + (cell.dataset.kv || "");
      });
      if (key) { clear(key); }
      return;
    }
    var name = colouring, score = scores[name], values = [];
    cells.forEach(function (cell) { values.push(records[cell.dataset.head][name]); });
    var top = Math.max.apply(null, values.map(Math.abs).concat([1e-12]));
    // as the score's picture (score_<name>.png): fractions from 0 to 1, nats from 0 to the largest, a signed
    // score centred at 0
    var scale = score.unit === "signed" ? "signed_score" : "score", largest = score.unit === "nats" ? top : 1;
    cells.forEach(function (cell, k) {
      var rgb = scaleColour(scale, values[k], largest);
      cell.style.background = css(rgb);
      cell.style.color = inkOn(rgb);
      cellText(cell, fixed(values[k], 2));
      cell.dataset.role = records[cell.dataset.head].role;
    });
    if (key) {
      var ends = scaleEnds(SCALES[scale], largest);
      clear(key).appendChild(el("span", { text: fixed(ends[0], 2) + " " }));
      key.appendChild(scaleBar(scale));
      key.appendChild(el("span", { text: " " + fixed(ends[1], 2) + (score.unit === "nats" ? " nats" : "") + " (" + SCALES[scale].key + ")" }));
    }
  }

  // The legend under the role map: the roles of the model shown, in the catalog's order.
  function paintLegend() {
    var legend = root.querySelector("table.rolemap") && root.querySelector("p.legend");
    if (!legend) { return; }
    var present = {};
    Object.keys(records).forEach(function (k) { present[records[k].role] = true; });
    clear(legend);
    V.roles.forEach(function (role) {
      if (!present[role.name]) { return; }
      legend.appendChild(roleChip(role.name));
      legend.appendChild(document.createTextNode(" " + role.name + "\u2002"));
    });
  }

  // ------------------------------------------------------------------------------------------------- the models
  // A report of several models: a slider (and a button per model, labelled) that shows one model at a time in the
  // role map, the examples and the head panel; the head chosen stays chosen.
  function modelSlider() {
    var holder = root.querySelector('[data-viewer="models"]');
    if (!holder || !MODELS) { return; }
    var last = MODELS.length - 1;
    var slider = el("input", { type: "range", min: "0", max: String(last), step: "1", value: String(PRIMARY), "aria-label": "model" });
    var named = el("span", { cls: "asv-model-name" });
    var buttons = toggle(MODELS.map(function (m, k) { return [String(k), m.label]; }), String(PRIMARY), function (v) { showModel(Number(v)); });
    buttons.classList.add("asv-model-buttons");
    slider.addEventListener("input", function () { showModel(Number(slider.value)); });
    clear(holder);
    holder.appendChild(el("div", { cls: "asv-controls" }, [el("label", {}, ["Model ", slider]), named]));
    holder.appendChild(buttons);
    holder.show = function (m) {
      slider.value = String(m);
      named.textContent = "model " + (m + 1) + " of " + MODELS.length + ": " + MODELS[m].label +
        (MODELS[m].name !== MODELS[m].label ? " (" + MODELS[m].name + ")" : "");
      buttons.querySelectorAll("button").forEach(function (b) { b.classList.toggle("on", b.dataset.value === String(m)); });
    };
    holder.show(PRIMARY);
  }

  function showModel(m) {
    if (!MODELS || m < 0 || m >= MODELS.length) { return; }
    if (state.text === "auto") { state.text = currentText(); }  // the same head on the same text, model after model
    state.model = m;
    useRecords(MODELS[m].heads);
    V.characteristic = MODELS[m].characteristic;
    var holder = root.querySelector('[data-viewer="models"]');
    if (holder && holder.show) { holder.show(m); }
    root.dataset.model = MODELS[m].label;
    paintRoleMap();
    paintLegend();
    gallery();
    renderHead();
    markCircuit();
  }

  // ------------------------------------------------------------------------------------------------- the circuit
  // attnscope circuit's records ({label, on, score, with, without, change}: head `label`'s score without head `on`):
  // the selected head's dependencies in both directions, in the panel and marked in the role map.
  function dependenciesOf(name) {
    var upstream = [], downstream = [];
    (V.dependencies || []).forEach(function (d) {
      if (d.label === name) { upstream.push(d); }
      if (d.on === name) { downstream.push(d); }
    });
    function byChange(a, b) { return Math.abs(b.change) - Math.abs(a.change) || (a.label + a.on < b.label + b.on ? -1 : 1); }
    return { upstream: upstream.sort(byChange), downstream: downstream.sort(byChange) };
  }
  var CHANGE_TOP = (V.dependencies || []).reduce(function (top, d) { return Math.max(top, Math.abs(d.change)); }, 1e-9);
  // the circuit's scale (output/scales.py score_change), its ends at ± the largest change of the page
  function changeColour(change) { return scaleColour("score_change", change, CHANGE_TOP); }

  function circuitPanel(name) {
    var found = dependenciesOf(name), box = el("div", { cls: "asv-circuit" });
    function item(d, other) {
      var rgb = changeColour(d.change);
      var node = el("span", { cls: "asv-dep", "data-head": other, title: d.label + "'s " + d.score + " score: " + fixed(d.with, 2) +
        " with " + d.on + ", " + fixed(d.without, 2) + " without it" }, [
        el("span", { cls: "chip", text: other, style: "background:" + css(rgb) + ";color:" + inkOn(rgb) }),
        " " + (scores[d.score] ? scores[d.score].short : d.score) + " " + fixed(d.with, 2) + " → " + fixed(d.without, 2) + " (" + (d.change >= 0 ? "+" : "−") + fixed(Math.abs(d.change), 2) + ")"]);
      node.addEventListener("click", function () { selectLabel(other); });
      return node;
    }
    var up = el("div", { cls: "asv-deps", "data-direction": "upstream" }, [el("b", { text: "Depends on" }),
      " (its score without each head):"]);
    found.upstream.forEach(function (d) { up.appendChild(item(d, d.on)); });
    if (!found.upstream.length) { up.appendChild(el("span", { cls: "small", text: state.li === 0 ? " none (no layer before it)" : " none among the dependencies kept" })); }
    var down = el("div", { cls: "asv-deps", "data-direction": "downstream" }, [el("b", { text: "Depended on by" }),
      " (their scores without " + name + "):"]);
    found.downstream.forEach(function (d) { down.appendChild(item(d, d.label)); });
    if (!found.downstream.length) { down.appendChild(el("span", { cls: "small", text: " none among the dependencies kept" })); }
    box.appendChild(up);
    box.appendChild(down);
    box.appendChild(el("div", { cls: "asv-key" }, [el("span", { text: "change −" + fixed(CHANGE_TOP, 2) }), scaleBar("score_change"),
      el("span", { text: "+" + fixed(CHANGE_TOP, 2) })]));
    box.appendChild(el("div", { cls: "small", text: "The change: the dependent head's score without the other head, minus " +
      "with it (" + SCALES.score_change.key + "); the largest changes of each head, as attnscope circuit measures them." }));
    return box;
  }

  function markCircuit() {
    var table = root.querySelector("table.rolemap");
    if (!table || !V.dependencies) { return; }
    var name = label(state.li, state.hi), found = dependenciesOf(name), marks = {};
    found.upstream.forEach(function (d) { marks[d.on] = { change: d.change, direction: "upstream" }; });
    found.downstream.forEach(function (d) { marks[d.label] = { change: d.change, direction: "downstream" }; });
    var any = Object.keys(marks).length > 0;
    table.querySelectorAll("td.cell").forEach(function (cell) {
      var mark = marks[cell.dataset.head], own = cell.dataset.head === name;
      // the heads on the path stand out: the others fade; each marked head is ringed in white inside an outline in
      // the colour of its change (solid: the chosen head depends on it; dashed: it depends on the chosen head)
      cell.classList.toggle("asv-faded", any && !mark && !own);
      if (mark && !own) {
        cell.dataset.circuit = mark.direction;
        cell.dataset.change = mark.change.toFixed(4);
        cell.style.outline = "3px " + (mark.direction === "upstream" ? "solid " : "dashed ") + css(changeColour(mark.change));
        cell.style.outlineOffset = "-3px";
        cell.style.boxShadow = "inset 0 0 0 5px #fff";
      } else {
        cell.removeAttribute("data-circuit");
        cell.removeAttribute("data-change");
        cell.style.outline = "";
        cell.style.outlineOffset = "";
        cell.style.boxShadow = "";
      }
    });
    drawEdges(table, name, found);
  }

  // Arrows over the role map (a canvas laid over its cells and under their labels), from the edge of a head's cell
  // to the edge of the head that depends on it, coloured by the change, thicker for a larger one; the canvas lists
  // them in data-edges ("0.2>1.0 0.2>1.3").
  function drawEdges(table, name, found) {
    var wrap = table.parentNode;
    var canvas = wrap.querySelector("canvas.asv-edges");
    if (!canvas) {
      canvas = el("canvas", { cls: "asv-edges" });
      wrap.style.position = "relative";
      wrap.appendChild(canvas);
    }
    var scale = window.devicePixelRatio || 1, width = table.offsetWidth, height = table.offsetHeight;
    canvas.width = Math.round(width * scale); canvas.height = Math.round(height * scale);
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    canvas.style.left = table.offsetLeft + "px"; canvas.style.top = table.offsetTop + "px";
    var draw = canvas.getContext("2d");
    draw.setTransform(scale, 0, 0, scale, 0, 0);
    draw.clearRect(0, 0, width, height);
    var box = table.getBoundingClientRect();
    function centre(head) {
      var cell = table.querySelector('td.cell[data-head="' + head + '"]');
      if (!cell) { return null; }
      var b = cell.getBoundingClientRect(), point = [b.left - box.left + b.width / 2, b.top - box.top + b.height / 2];
      point.box = b;
      return point;
    }
    var edges = found.upstream.map(function (d) { return [d.on, name, d.change]; })
      .concat(found.downstream.map(function (d) { return [name, d.label, d.change]; }));
    var drawn = [];
    // how far from a cell's centre a line leaving it in direction (x, y) meets its edge
    function toEdge(b, x, y) {
      var half = [b.width / 2, b.height / 2];
      return Math.min(x ? half[0] / Math.abs(x) : Infinity, y ? half[1] / Math.abs(y) : Infinity);
    }
    edges.forEach(function (edge) {
      var a = centre(edge[0]), b = centre(edge[1]);
      if (!a || !b) { return; }
      var colour = css(changeColour(edge[2])), dx = b[0] - a[0], dy = b[1] - a[1];
      var length = Math.sqrt(dx * dx + dy * dy) || 1, ux = dx / length, uy = dy / length;
      // a gentle curve (its control point off the straight line), so that arrows over one row stay apart
      var bend = Math.min(24, 0.25 * length), cx = (a[0] + b[0]) / 2 - uy * bend, cy = (a[1] + b[1]) / 2 + ux * bend;
      var tx = b[0] - cx, ty = b[1] - cy, tl = Math.sqrt(tx * tx + ty * ty) || 1;
      tx /= tl; ty /= tl;  // the direction the curve arrives in
      var sx = cx - a[0], sy = cy - a[1], sl = Math.sqrt(sx * sx + sy * sy) || 1;
      sx /= sl; sy /= sl;  // the direction it leaves in
      // from the edge of one cell to the edge of the other: the labels in the cells' middles stay clear (the canvas
      // also lies under them), and the arrow's head shows at the dependent cell's border
      var start = toEdge(a.box, sx, sy), stop = toEdge(b.box, tx, ty);
      var x1 = a[0] + sx * start, y1 = a[1] + sy * start;
      var size = 8, x2 = b[0] - tx * stop, y2 = b[1] - ty * stop;
      var width_ = 1.5 + 2.5 * Math.min(1, Math.abs(edge[2]) / CHANGE_TOP);
      draw.lineCap = "round";
      [["#fff", width_ + 2.5], [colour, width_]].forEach(function (stroke) {  // a white halo, then the arrow
        draw.strokeStyle = stroke[0];
        draw.lineWidth = stroke[1];
        draw.beginPath();
        draw.moveTo(x1, y1);
        draw.quadraticCurveTo(cx, cy, x2 - tx * size, y2 - ty * size);
        draw.stroke();
      });
      var px = -ty, py = tx;  // the arrow's head at the dependent head
      draw.beginPath();
      draw.moveTo(x2, y2);
      draw.lineTo(x2 - tx * size + px * size / 2, y2 - ty * size + py * size / 2);
      draw.lineTo(x2 - tx * size - px * size / 2, y2 - ty * size - py * size / 2);
      draw.closePath();
      draw.fillStyle = colour;
      draw.strokeStyle = "#fff";
      draw.lineWidth = 1;
      draw.fill();
      draw.stroke();
      drawn.push(edge[0] + ">" + edge[1]);
    });
    canvas.dataset.edges = drawn.join(" ");
  }

  // ---------------------------------------------------------------------------------------------- the gallery
  function gallery() {
    var holder = root.querySelector('[data-viewer="gallery"]');
    if (!holder || !V.texts.length) { return; }
    var grid = el("div", { cls: "asv-grid" });
    V.characteristic.forEach(function (text) {
      var r = records[text], at = indexOfLabel(text);
      if (!r || !at) { return; }
      var t = V.examples[r.role] === undefined ? 0 : V.examples[r.role];
      var map = Heatmap(matrix(t, at[0], at[1], "tokens"), V.texts[t].labels, 130, { labels: false });
      var card = el("div", { cls: "asv-card", "data-head": text, title: "head " + text + " on " + V.texts[t].name }, [
        el("div", {}, [roleChip(r.role), " " + text + " · " + (scores[r.role_metric] ? scores[r.role_metric].short : r.role_metric) + " " + fixed(r.role_score, 2)]),
        map.node, el("span", { cls: "name", text: "on " + V.texts[t].name })]);
      card.addEventListener("click", function () { state.text = "auto"; selectLabel(text); });
      grid.appendChild(card);
    });
    clear(holder).appendChild(grid);
  }

  // ----------------------------------------------------------------------------------------------- diversity
  function diversity() {
    var holder = root.querySelector('[data-viewer="matrix"]');
    if (!holder || !V.matrices) { return; }
    var K = V.order.length, labels = V.layer_ids.reduce(function (all, layer, li) {
      return all.concat(V.head_ids.map(function (_, hi) { return label(li, hi); }));
    }, []);
    var decoded = {};
    ["js", "cosine"].forEach(function (name) {
      var bytes = bytesOf(V.matrices[name]), view = new DataView(bytes.buffer), values = new Float64Array(K * K);
      var k = 0;
      for (var i = 0; i < K; i++) {
        values[i * K + i] = name === "js" ? 0 : 1;
        for (var j = i + 1; j < K; j++) {
          var v = view.getUint16(2 * k, true) / 65535;
          values[i * K + j] = v; values[j * K + i] = v; k++;
        }
      }
      decoded[name] = values;
    });
    var measure = "js";
    var cell = Math.max(2, Math.min(30, Math.floor(600 / K))), strip = 8, tree = 90, size = K * cell;
    var lab = cell >= 12 ? 38 : 0;  // room for the heads' labels, when the cells are large enough to name
    var x0 = lab + strip, y0 = tree + strip;
    var wrap = el("div", { cls: "asv-matrix" });
    var canvas = el("canvas", { width: x0 + size, height: y0 + size + lab });
    var tip = el("div", { cls: "asv-tip", style: "display:none" });
    var readoutM = el("div", { cls: "asv-readout asv-matrix-readout", text: "Hover a cell to name the two heads; click it to compare them." });
    var key = el("div", { cls: "asv-key" });
    var controls = el("div", { cls: "asv-controls" });
    function paint(hover) {
      var draw = canvas.getContext("2d"), values = decoded[measure];
      draw.clearRect(0, 0, canvas.width, canvas.height);
      for (var p = 0; p < K; p++) {
        var i = V.order[p];
        var r = records[labels[i]], colour = r && roles[r.role] ? roles[r.role].colour : "#ccc";
        draw.fillStyle = colour;
        draw.fillRect(lab, y0 + p * cell, strip - 1, cell);
        draw.fillRect(x0 + p * cell, tree, cell, strip - 1);
        for (var q = 0; q < K; q++) {
          draw.fillStyle = css(scaleColour(measure, values[i * K + V.order[q]], 1));  // the pictures' js/cosine scale
          draw.fillRect(x0 + q * cell, y0 + p * cell, cell, cell);
        }
        if (lab) {
          draw.fillStyle = "#333"; draw.font = "11px sans-serif"; draw.textAlign = "right"; draw.textBaseline = "middle";
          draw.fillText(labels[i], lab - 3, y0 + p * cell + cell / 2);
          draw.save(); draw.translate(x0 + p * cell + cell / 2, y0 + size + 3); draw.rotate(-Math.PI / 2);
          draw.fillText(labels[i], 0, 0); draw.restore();
        }
      }
      // the dendrogram: leaves at the bottom, a merge at the height of its average distance
      var xs = {}, ys = {}, highest = 0;
      V.linkage.forEach(function (m) { highest = Math.max(highest, m[2]); });
      highest = highest || 1;
      V.order.forEach(function (leaf, position) { xs[leaf] = x0 + position * cell + cell / 2; ys[leaf] = tree - 1; });
      draw.strokeStyle = "#555"; draw.lineWidth = 1;
      V.linkage.forEach(function (m, k) {
        var y = 4 + (tree - 6) * (1 - m[2] / highest), id = K + k;
        draw.beginPath();
        draw.moveTo(xs[m[0]], ys[m[0]]); draw.lineTo(xs[m[0]], y); draw.lineTo(xs[m[1]], y); draw.lineTo(xs[m[1]], ys[m[1]]);
        draw.stroke();
        xs[id] = (xs[m[0]] + xs[m[1]]) / 2; ys[id] = y;
      });
      if (hover) {
        draw.strokeStyle = "#e69f00"; draw.lineWidth = 2;
        draw.strokeRect(x0, y0 + hover[0] * cell, size, cell);
        draw.strokeRect(x0 + hover[1] * cell, y0, cell, size);
      }
      clear(key).appendChild(document.createTextNode(measure === "js" ? "JS divergence 0 " : "cosine similarity 0 "));
      key.appendChild(scaleBar(measure));
      key.appendChild(document.createTextNode((measure === "js" ? " 1 bit" : " 1") + " (" + SCALES[measure].key + ")"));
      key.appendChild(document.createTextNode("; dendrogram: average linkage of the JS divergence (top: " + fixed(highest, 3) + " bits)."));
    }
    function at(event) {
      var box = canvas.getBoundingClientRect();
      var x = event.clientX - box.left - x0, y = event.clientY - box.top - y0;
      var q = Math.floor(x / cell), p = Math.floor(y / cell);
      return p >= 0 && q >= 0 && p < K && q < K ? [p, q] : null;
    }
    function describe(i, j) {
      var a = labels[i], b = labels[j];
      var ra = records[a], rb = records[b];
      return a + (ra ? " (" + ra.role + ")" : "") + " ~ " + b + (rb ? " (" + rb.role + ")" : "") + ": JSD " +
        fixed(decoded.js[i * K + j], 3) + " bits, cosine " + fixed(decoded.cosine[i * K + j], 3);
    }
    canvas.addEventListener("mousemove", function (event) {
      var hit = at(event);
      if (!hit) { tip.style.display = "none"; paint(null); return; }
      var i = V.order[hit[0]], j = V.order[hit[1]];
      tip.textContent = describe(i, j);
      tip.style.display = "block";
      var box = wrap.getBoundingClientRect();
      tip.style.left = (event.clientX - box.left + 14) + "px";
      tip.style.top = (event.clientY - box.top + 14) + "px";
      readoutM.textContent = describe(i, j) + ". Click to compare them.";
      paint(hit);
    });
    canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; paint(null); });
    canvas.addEventListener("click", function (event) {
      var hit = at(event);
      if (hit) { compare(labels[V.order[hit[0]]], labels[V.order[hit[1]]], describe(V.order[hit[0]], V.order[hit[1]])); }
    });
    controls.appendChild(toggle([["js", "JS divergence"], ["cosine", "cosine similarity"]], measure, function (v) {
      measure = v;
      controls.querySelectorAll("button").forEach(function (b) { b.classList.toggle("on", b.dataset.value === v); });
      paint(null);
    }));
    wrap.appendChild(canvas); wrap.appendChild(tip);
    clear(holder);
    [controls, readoutM, el("div", { cls: "wide" }, [wrap]), key].forEach(function (node) { holder.appendChild(node); });
    paint(null);
    root.querySelectorAll("tr[data-pair]").forEach(function (row) {
      row.addEventListener("click", function () {
        var pair = row.dataset.pair.split(" "), i = labels.indexOf(pair[0]), j = labels.indexOf(pair[1]);
        compare(pair[0], pair[1], i >= 0 && j >= 0 ? describe(i, j) : pair[0] + " ~ " + pair[1]);
      });
    });
  }

  function compare(a, b, description) {
    var holder = root.querySelector('[data-viewer="compare"]');
    if (!holder) { return; }
    var at = [indexOfLabel(a), indexOfLabel(b)];
    if (!at[0] || !at[1]) { return; }
    var t = currentText(), names = V.texts[t].labels, maps = [];
    var close = el("button", { cls: "asv-close", type: "button", text: "×", title: "close" });
    close.addEventListener("click", function () { clear(holder); });
    var box = el("div", { cls: "asv-compare", "data-pair": a + " " + b }, [close,
      el("div", { cls: "asv-title", text: "Heads " + a + " and " + b + " side by side" }),
      el("div", { cls: "small", text: description + ". Text: " + V.texts[t].name + " (the head panel's text)." })]);
    var line = el("div", { cls: "asv-readout", text: "Hover a row or a cell to highlight it in both maps." });
    box.appendChild(line);
    var grid = el("div", { cls: "asv-grid" });
    [a, b].forEach(function (text, k) {
      var r = records[text];
      var map = Heatmap(matrix(t, at[k][0], at[k][1], "tokens", PRIMARY), names, 380, { onHover: function (h) {
        maps.forEach(function (other) { other.highlight(h ? h.query : null, h ? h.key : null); });
        line.textContent = h && h.query !== undefined ? "query “" + names[h.query] + "”@" + h.query + (h.key !== undefined ?
          " → “" + names[h.key] + "”@" + h.key + ": " + text + " " + fixed(matrix(t, at[k][0], at[k][1], "tokens", PRIMARY)[h.query * names.length + h.key], 3) : "") :
          "Hover a row or a cell to highlight it in both maps.";
      } });
      maps.push(map);
      var caption = el("div", { cls: "asv-title" }, [text + " "]);
      if (r) { caption.appendChild(roleChip(r.role)); caption.appendChild(document.createTextNode(" " + r.role)); }
      var card = el("div", { cls: "asv-card", "data-head": text }, [caption, el("div", { cls: "wide" }, [map.node])]);
      caption.addEventListener("click", function () { selectLabel(text, true); });
      grid.appendChild(card);
    });
    box.appendChild(grid);
    box.appendChild(scaleKey());
    clear(holder).appendChild(box);
    holder.scrollIntoView({ block: "nearest" });
  }

  // ------------------------------------------------------------------------------------------------ ablation
  function ablation() {
    var holder = root.querySelector('[data-viewer="ablation"]');
    if (!holder || !data.ablation) { return; }
    var values = {}, top = 1e-12;
    data.ablation.heads.forEach(function (h) { values[h.label] = h.importance; top = Math.max(top, Math.abs(h.importance)); });
    var table = el("table", { cls: "asv-ablation" });
    var head = el("tr", {}, [el("th", { text: "L\\H" })]);
    V.head_ids.forEach(function (h) { head.appendChild(el("th", { text: String(h) })); });
    table.appendChild(el("thead", {}, [head]));
    var body = el("tbody");
    V.layer_ids.forEach(function (layer, li) {
      var row = el("tr", {}, [el("th", { text: String(layer) })]);
      V.head_ids.forEach(function (_, hi) {
        var name = label(li, hi), v = values[name], rgb = scaleColour("loss_change", v, top);  // as importance.png
        var cell = el("td", { "data-head": name, title: name + ": loss " + (v >= 0 ? "+" : "") + fixed(v, 4) + " nats without it", text: fixed(v, 3) });
        cell.style.background = css(rgb);
        cell.style.color = inkOn(rgb);
        cell.addEventListener("click", function () { selectLabel(name, true); });
        row.appendChild(cell);
      });
      body.appendChild(row);
    });
    table.appendChild(body);
    clear(holder);
    holder.appendChild(el("div", { cls: "wide" }, [table]));
    holder.appendChild(el("div", { cls: "asv-key" }, [el("span", { text: "−" + fixed(top, 3) }), scaleBar("loss_change"),
      el("span", { text: "+" + fixed(top, 3) + " nats (" + SCALES.loss_change.key + ")" })]));
  }

  // ---------------------------------------------------------------------------------------------- the tables
  function tables() {
    root.querySelectorAll("table.rolemap td.cell, tr[data-head], .asv-card[data-head]").forEach(function (node) {
      if (node.closest('[data-viewer="head"]') || node.closest('[data-viewer="gallery"]') || node.closest('[data-viewer="compare"]')) { return; }
      node.addEventListener("click", function () { selectLabel(node.dataset.head, node.tagName === "TR"); });
    });
    root.querySelectorAll("table.sortable").forEach(function (table) {
      table.querySelectorAll("th").forEach(function (header, column) {
        header.addEventListener("click", function () {
          var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
          var descending = header.dataset.order !== "desc";
          header.dataset.order = descending ? "desc" : "asc";
          function value(row) {
            if (column === 0 && row.dataset.head) { var p = row.dataset.head.split("."); return Number(p[0]) * 100000 + Number(p[1]); }
            var text = row.cells[column].textContent.trim(), parts = text.split(" "), number = parseFloat(parts[parts.length - 1]);
            return isNaN(number) ? text : number;
          }
          rows.sort(function (a, b) {
            var x = value(a), y = value(b);
            var order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
            return descending ? -order : order;
          });
          rows.forEach(function (row) { body.appendChild(row); });
        });
      });
    });
  }

  // -------------------------------------------------------------------------------------------------- start
  var fallback = root.querySelector(".asv-fallback");
  if (fallback) { fallback.style.display = "none"; }
  colourBy();
  modelSlider();
  gallery();
  diversity();
  ablation();
  tables();
  var first = V.characteristic.length ? indexOfLabel(V.characteristic[0]) : null;
  state.li = first ? first[0] : 0;
  state.hi = first ? first[1] : 0;
  if (V.texts.length && panel) {
    root.querySelectorAll("table.rolemap td.cell").forEach(function (cell) { cell.classList.toggle("sel", cell.dataset.head === label(state.li, state.hi)); });
    renderHead();
    markCircuit();
  }
  if (MODELS) { root.dataset.model = MODELS[PRIMARY].label; }
  if (V.dependencies && typeof window !== "undefined") {
    window.addEventListener("resize", function () { markCircuit(); });
  }
  root.dataset.ready = "yes";
})();
