// The live page of a flowrun pipeline. It draws the graph that api/graph describes, each node where
// the server placed it, scaled to fit the window (zoom and pan move the view), and below it a card
// per node with the same figures (on a phone, the cards alone). It refreshes the numbers every
// second, computes no layout, loads nothing but api/graph and changes nothing.
'use strict';

(function () {
  const NS = 'http://www.w3.org/2000/svg';
  const REFRESH_MS = 1000;
  const svg = document.getElementById('graph');
  const numbers = new Intl.NumberFormat('en-US');
  const compact = new Intl.NumberFormat('en-US', {notation: 'compact', maximumFractionDigits: 1});

  // What is drawn: the shape it was drawn for, and the elements to update by node and edge.
  let shape = '';
  let nodeViews = new Map();
  let edgeViews = [];
  // The sparklines' width is 15 minutes: this many points of the server's history.
  let historySlots = 90;

  // What the graph's view shows, in the drawing's units: the whole drawing (full) until the user
  // zooms or pans, then the part chosen. The view always has the window's proportions.
  let full = null;
  let view = null;
  let zoomed = false;
  const MAX_ZOOM = 8;

  function showView() {
    svg.setAttribute('viewBox', `${view.x} ${view.y} ${view.w} ${view.h}`);
  }

  // fit shows the whole drawing, centred, as large as the window allows.
  function fit() {
    if (!full) {
      return;
    }
    const r = svg.getBoundingClientRect();
    const aspect = r.width > 0 && r.height > 0 ? r.width / r.height : full.w / full.h;
    let w = full.w, h = full.h;
    if (w / h < aspect) {
      w = h * aspect;
    } else {
      h = w / aspect;
    }
    view = {x: (full.w - w) / 2, y: (full.h - h) / 2, w, h};
    zoomed = false;
    showView();
  }

  // zoomBy scales the view by factor (above 1 zooms in) around a point of the drawing, by default
  // the view's centre; never further out than the whole drawing, nor in past MAX_ZOOM times it.
  function zoomBy(factor, cx, cy) {
    if (!view) {
      return;
    }
    const widest = Math.max(full.w, full.h * view.w / view.h);
    const w = Math.min(widest, Math.max(widest / MAX_ZOOM, view.w / factor));
    if (w >= widest) {
      fit();
      return;
    }
    const f = w / view.w;
    cx = cx === undefined ? view.x + view.w / 2 : cx;
    cy = cy === undefined ? view.y + view.h / 2 : cy;
    view = {x: cx - (cx - view.x) * f, y: cy - (cy - view.y) * f, w, h: view.h * f};
    zoomed = true;
    showView();
  }

  // panBy moves the view by a distance in the drawing's units.
  function panBy(dx, dy) {
    if (!view) {
      return;
    }
    view.x += dx;
    view.y += dy;
    zoomed = true;
    showView();
  }

  // unitsPerPixel is how many of the drawing's units a pixel of the window shows.
  function unitsPerPixel() {
    const r = svg.getBoundingClientRect();
    return r.width > 0 ? view.w / r.width : 1;
  }

  function pointAt(clientX, clientY) {
    const r = svg.getBoundingClientRect();
    const k = unitsPerPixel();
    return [view.x + (clientX - r.left) * k, view.y + (clientY - r.top) * k];
  }

  document.getElementById('zoom-in').addEventListener('click', () => zoomBy(1.5));
  document.getElementById('zoom-out').addEventListener('click', () => zoomBy(1 / 1.5));
  document.getElementById('zoom-fit').addEventListener('click', fit);
  svg.addEventListener('wheel', e => {
    if (!view) {
      return;
    }
    e.preventDefault();
    const [cx, cy] = pointAt(e.clientX, e.clientY);
    zoomBy(Math.exp(-e.deltaY * (e.deltaMode === 1 ? 0.05 : 0.002)), cx, cy);
  }, {passive: false});
  let drag = null;
  svg.addEventListener('pointerdown', e => {
    if (!view || e.button !== 0) {
      return;
    }
    drag = {x: e.clientX, y: e.clientY, id: e.pointerId};
    svg.setPointerCapture(e.pointerId);
    svg.classList.add('dragging');
  });
  svg.addEventListener('pointermove', e => {
    if (!drag || e.pointerId !== drag.id) {
      return;
    }
    const k = unitsPerPixel();
    panBy((drag.x - e.clientX) * k, (drag.y - e.clientY) * k);
    drag.x = e.clientX;
    drag.y = e.clientY;
  });
  const endDrag = () => {
    drag = null;
    svg.classList.remove('dragging');
  };
  svg.addEventListener('pointerup', endDrag);
  svg.addEventListener('pointercancel', endDrag);
  svg.addEventListener('keydown', e => {
    if (!view) {
      return;
    }
    const step = 0.1;
    const keys = {
      '+': () => zoomBy(1.5), '=': () => zoomBy(1.5), '-': () => zoomBy(1 / 1.5), '0': fit,
      ArrowLeft: () => panBy(-view.w * step, 0), ArrowRight: () => panBy(view.w * step, 0),
      ArrowUp: () => panBy(0, -view.h * step), ArrowDown: () => panBy(0, view.h * step),
    };
    if (keys[e.key]) {
      e.preventDefault();
      keys[e.key]();
    }
  });
  window.addEventListener('resize', () => {
    if (!zoomed) {
      fit();
    }
  });

  function make(name, attrs, parent) {
    const el = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) {
      el.setAttribute(k, v);
    }
    if (parent) {
      parent.appendChild(el);
    }
    return el;
  }

  function text(parent, attrs, content) {
    const el = make('text', attrs, parent);
    el.textContent = content;
    return el;
  }

  // count shows a number in full up to 99,999 and shortened above (123.4K), to fit its box.
  function count(v) {
    if (v === null || v === undefined) {
      return '–';
    }
    return v < 100000 ? numbers.format(v) : compact.format(v);
  }

  // rate shows messages per second; nothing where the server cannot tell (a route's outputs).
  function rate(v) {
    if (v === null || v === undefined) {
      return '';
    }
    const shown = v === 0 ? '0' : v < 10 ? v.toFixed(1) : numbers.format(Math.round(v));
    return shown + ' msg/s';
  }

  // LOCATION is where a diagnostic says it happened: path:line,column-line,column followed by ': '.
  const LOCATION = /^\S+:\d+(,\d+)?(-\d+(,\d+)?)?: /;

  function shorten(s, n) {
    return s.length > n ? s.slice(0, n - 1) + '…' : s;
  }

  // The counters of sources, stages and sinks, in rows of two: what became of the messages taken
  // in (with a stateful stage's line below, they add up but for those waiting for a retry), then
  // the attempts that failed and were made again.
  const COUNTERS = [
    ['in', 'in'], ['out', 'out'],
    ['filtered', 'filtered'], ['dead_lettered', 'dead-lettered'],
    ['failed_attempts', 'failed'], ['retries', 'retries'],
  ];
  // A stateful stage's outcomes of its own and what it found, on a line of their own.
  const STATE_COUNTERS = [['dropped', 'dropped'], ['absorbed', 'absorbed'], ['late', 'late'], ['duplicates', 'dups']];

  function drawNode(n, layer) {
    const g = make('g', {class: 'node ' + n.type, 'data-node': n.id, transform: `translate(${n.x},${n.y})`}, layer);
    const title = make('title', {}, g);
    title.textContent = [n.id, n.detail, n.key ? 'key: ' + n.key : '',
      n.dead_letter_topic ? 'dead letters go to topic ' + n.dead_letter_topic : ''].filter(Boolean).join('\n');
    const about = title.textContent;
    make('rect', {class: 'box', width: n.width, height: n.height, rx: n.type === 'topic' ? 14 : 6}, g);
    text(g, {class: 'name', x: 12, y: 21, 'data-field': 'name'}, shorten(n.name, 28));
    const detail = text(g, {class: 'detail', x: 12, y: 38, 'data-field': 'detail'},
      shorten(n.type === 'topic' ? 'topic · ' + n.detail : n.detail, 34));
    const fields = {detail};
    if (n.type === 'topic') {
      if (n.partitions <= 32) {
        for (let p = 0; p < n.partitions; p++) {
          const x = 12 + (p % 4) * 57;
          const y = 48 + Math.floor(p / 4) * 18;
          make('rect', {class: 'cell', x, y, width: 53, height: 15, rx: 3}, g);
          text(g, {class: 'cell-caption', x: x + 4, y: y + 11}, 'p' + p);
          fields['length.' + p] = text(g, {class: 'cell-value', x: x + 50, y: y + 11, 'text-anchor': 'end',
            'data-field': 'length', 'data-partition': p}, '–');
        }
      } else {
        const t = text(g, {class: 'counter', x: 12, y: 60}, 'entries ');
        fields.entries = make('tspan', {class: 'value', 'data-field': 'entries'}, t);
        fields.entries.textContent = '–';
      }
      return {g, fields, title, about};
    }
    // Two columns: the second, whose captions are longer (dead-lettered), a little wider.
    COUNTERS.forEach(([key, caption], i) => {
      const x = i % 2 === 0 ? 12 : 114;
      const y = 62 + Math.floor(i / 2) * 18;
      text(g, {class: 'caption', x, y}, caption);
      fields[key] = text(g, {class: 'value', x: i % 2 === 0 ? 100 : n.width - 12, y, 'text-anchor': 'end', 'data-field': key}, '–');
    });
    if (n.type === 'source' && n.kind === 'redis_stream') {
      // What the source has not read yet of the stream it reads.
      const t = text(g, {class: 'counter backlog', x: 12, y: 116}, '');
      make('tspan', {class: 'caption'}, t).textContent = 'stream lag ';
      fields.stream_lag = make('tspan', {class: 'value', 'data-field': 'stream_lag'}, t);
      make('tspan', {class: 'caption'}, t).textContent = ' · pending ';
      fields.stream_pending = make('tspan', {class: 'value', 'data-field': 'stream_pending'}, t);
      make('tspan', {class: 'caption'}, t).textContent = ' · length ';
      fields.stream_length = make('tspan', {class: 'value', 'data-field': 'stream_length'}, t);
      fields.stream = t;
    } else if (n.type === 'source') {
      const t = text(g, {class: 'counter', x: 12, y: 116}, 'produced ');
      fields.produced = make('tspan', {class: 'value', 'data-field': 'produced'}, t);
      fields.produced.textContent = '–';
      // What the system the source reads (Kafka, JetStream, AMQP) still holds for it, when the
      // source reports it.
      fields.upstream_caption = make('tspan', {class: 'caption'}, t);
      fields.upstream_lag = make('tspan', {class: 'value', 'data-field': 'upstream_lag'}, t);
    } else {
      let y = 116;
      if (n.stateful) {
        // What a stateful stage dropped or took into its windows, and what it found late or
        // repeated; the server made its box a line taller.
        const t = text(g, {class: 'counter', x: 12, y}, '');
        STATE_COUNTERS.forEach(([key, caption], i) => {
          make('tspan', {class: 'caption'}, t).textContent = (i > 0 ? ' · ' : '') + caption + ' ';
          fields[key] = make('tspan', {class: 'value', 'data-field': key}, t);
          fields[key].textContent = '–';
        });
        y += 18;
        // Its own watermark where it is furthest behind, and how far that is behind the clock;
        // the box's title lists every partition's.
        const w = text(g, {class: 'counter', x: 12, y}, '');
        make('tspan', {class: 'caption'}, w).textContent = 'watermark ';
        fields.watermark = make('tspan', {class: 'value', 'data-field': 'watermark'}, w);
        fields.watermark.textContent = '–';
        make('tspan', {class: 'caption'}, w).textContent = ' · lag ';
        fields.watermark_lag = make('tspan', {class: 'value', 'data-field': 'watermark_lag'}, w);
        fields.watermark_lag.textContent = '–';
        y += 18;
      }
      text(g, {class: 'caption', x: 12, y}, 'dead-letter stream');
      fields.dead_letters = text(g, {class: 'value dlq', x: n.width - 12, y, 'text-anchor': 'end', 'data-field': 'dead_letters'}, '–');
    }
    // The latest dead letter's reason (the title and the node's card list the last five), then
    // the sparklines of the last 15 minutes: messages in per second, and the input's lag.
    const y = n.height - 40;
    fields.last_dead_letter = text(g, {class: 'last-dead-letter', x: 12, y, 'data-field': 'last_dead_letter'}, '');
    const sparkWidth = (n.width - 36) / 2;
    for (const [key, caption, x] of [['rate', 'in/s', 12], ['lag', 'lag', 24 + sparkWidth]]) {
      make('rect', {class: 'spark-area', x, y: n.height - 30, width: sparkWidth, height: 20, rx: 2}, g);
      const at = `translate(${x},${n.height - 28})`;
      fields[key + '_fill'] = make('path', {class: 'spark-fill ' + key, d: '', transform: at}, g);
      fields[key + '_history'] = make('path', {class: 'spark ' + key, d: '', 'data-field': key + '_history',
        transform: at, 'data-width': sparkWidth}, g);
      // Over the line, with a halo (style.css) that keeps it readable.
      fields[key + '_caption'] = text(g, {class: 'spark-caption', x: x + 3, y: n.height - 21}, caption);
    }
    return {g, fields, title, about};
  }

  // sparkPaths draws a series (oldest first; null where unknown) in a box of width by height, the
  // newest point at the right and the box's width for 15 minutes, scaled so that the series' largest
  // value is a little below the top: the line, and the area under it.
  function sparkPaths(series, slots, width, height) {
    if (!series || series.length === 0) {
      return {line: '', area: ''};
    }
    const top = Math.max(1, ...series.filter(v => v !== null)) * 1.2;
    const step = width / Math.max(1, slots - 1);
    let line = '', area = '';
    let segment = [];
    const close = () => {
      if (segment.length > 0) {
        const [first, last] = [segment[0], segment[segment.length - 1]];
        area += 'M' + segment.map(([x, y]) => x + ',' + y).join('L') + `L${last[0]},${height}L${first[0]},${height}Z`;
        line += 'M' + segment.map(([x, y]) => x + ',' + y).join('L');
      }
      segment = [];
    };
    series.forEach((v, i) => {
      if (v === null) {
        close();
        return;
      }
      segment.push([(width - (series.length - 1 - i) * step).toFixed(1), (height - (v / top) * height).toFixed(1)]);
    });
    close();
    return {line, area};
  }

  // showSpark draws a series in a sparkline's two paths.
  function showSpark(f, key, series, width, height) {
    const {line, area} = sparkPaths(series, historySlots, width, height);
    f[key + '_history'].setAttribute('d', line);
    f[key + '_fill'].setAttribute('d', area);
  }

  // reasonsAbout lists a node's latest dead letters for its title.
  function reasonsAbout(last) {
    if (!last || last.length === 0) {
      return '';
    }
    return '\nlast dead letters (newest first):' + last.map(d => `\n  ${new Date(d.at).toISOString()}  ${d.reason}`).join('');
  }

  // eventTime shows an event time in UTC: the time of day when it is on the clock's day (taken),
  // else the day.
  function eventTime(at, taken) {
    const s = new Date(at).toISOString();
    return s.slice(0, 10) === new Date(taken).toISOString().slice(0, 10) ? s.slice(11, 19) : s.slice(0, 10);
  }

  // lag shows how far a watermark is behind the clock; ahead of it (event times in the future), a
  // minus sign.
  function lag(seconds) {
    return seconds < 0 ? '−' + duration(-seconds) : duration(seconds);
  }

  // showWatermark writes a stateful stage's watermark: in its box the least of its partitions', in
  // its title every partition's.
  function showWatermark(view, w, taken, last) {
    const f = view.fields;
    f.watermark.textContent = w && w.least ? eventTime(w.least, taken) : '–';
    f.watermark_lag.textContent = w && w.least ? lag(w.lag_seconds) : '–';
    let about = view.about;
    if (w) {
      about += `\nwatermark in each partition of topic ${w.topic} (UTC), and its lag:` + w.partitions.map(p =>
        `\n  p${p.partition}  ` + (p.watermark ? new Date(p.watermark).toISOString() + ', lag ' + lag(p.lag_seconds) : 'none yet')).join('');
    }
    about += reasonsAbout(last);
    if (view.title.textContent !== about) {
      view.title.textContent = about;
    }
  }

  // The server gives each edge its points: two are joined by a curve, more by straight lines with
  // rounded corners.
  function edgePath(points) {
    const [x1, y1] = points[0];
    if (points.length === 2) {
      const [x2, y2] = points[1];
      const d = Math.max(40, (x2 - x1) / 2);
      return `M${x1},${y1} C${x1 + d},${y1} ${x2 - d},${y2} ${x2},${y2}`;
    }
    let d = `M${x1},${y1}`;
    for (let i = 1; i < points.length - 1; i++) {
      const [px, py] = points[i - 1], [x, y] = points[i], [nx, ny] = points[i + 1];
      const before = Math.hypot(x - px, y - py), after = Math.hypot(nx - x, ny - y);
      const r = Math.min(10, before / 2, after / 2);
      if (r === 0) {
        d += ` L${x},${y}`;
        continue;
      }
      d += ` L${x - (x - px) / before * r},${y - (y - py) / before * r}`;
      d += ` Q${x},${y} ${x + (nx - x) / after * r},${y + (ny - y) / after * r}`;
    }
    const [xn, yn] = points[points.length - 1];
    return d + ` L${xn},${yn}`;
  }

  function drawEdge(e, id, lines, labels) {
    const [mx, my] = e.label_at;
    const cls = 'edge ' + e.kind + (e.implicit ? ' implicit' : '') + (e.fused ? ' fused' : '');
    const g = make('g', {class: cls, 'data-edge': id}, lines);
    const title = make('title', {}, g);
    title.textContent = `${e.from} → ${e.to} (topic ${e.topic}${e.implicit ? ', implicit' : ''}${e.fused ? ', fused: in memory' : ''})` + (e.label ? '\n' + e.label : '');
    const marker = {dead_letter: 'url(#arrow-dead)', side_output: 'url(#arrow-side)'}[e.kind] || 'url(#arrow)';
    make('path', {d: edgePath(e.points), 'marker-end': marker}, g);
    // Up to three lines: a route's condition, the rate, and the reader's lag and pending entries. A
    // dead-letter edge and a side output (late, duplicates) say what they carry before the rate.
    const label = make('text', {class: 'edge-label', x: mx, y: my - 4, 'text-anchor': 'middle', 'data-edge': id}, labels);
    const fields = {};
    const caption = {dead_letter: 'dead letters', side_output: e.label, lookup: 'lookup'}[e.kind];
    const condition = caption === undefined && e.label;
    if (condition) {
      make('tspan', {class: 'condition', x: mx, dy: '-1.2em'}, label).textContent = shorten(e.label, 22);
    }
    const first = make('tspan', {x: mx, dy: condition ? '1.2em' : 0}, label);
    if (caption) {
      make('tspan', {class: 'caption ' + e.kind}, first).textContent = caption + ' ';
    }
    fields.rate = make('tspan', {'data-field': 'rate'}, first);
    if (e.kind === 'reads') {
      const second = make('tspan', {x: mx, dy: '1.2em', class: 'backlog'}, label);
      make('tspan', {class: 'caption'}, second).textContent = 'lag ';
      fields.lag = make('tspan', {'data-field': 'lag'}, second);
      make('tspan', {class: 'caption'}, second).textContent = ' · pending ';
      fields.pending = make('tspan', {'data-field': 'pending'}, second);
      fields.backlog = second;
    }
    return {g, label, fields};
  }

  function edgeIds(edges) {
    const seen = new Map();
    return edges.map(e => {
      const base = e.from + '>' + e.to;
      const n = (seen.get(base) || 0) + 1;
      seen.set(base, n);
      return n === 1 ? base : base + '#' + n;
    });
  }

  function draw(graph) {
    svg.replaceChildren();
    const refit = !full || !zoomed;
    full = {w: graph.layout.width, h: graph.layout.height};
    if (refit) {
      fit();
    } else {
      showView();
    }
    const defs = make('defs', {}, svg);
    for (const [id, cls] of [['arrow', 'arrowhead'], ['arrow-dead', 'arrowhead dead'], ['arrow-side', 'arrowhead side']]) {
      const m = make('marker', {id, viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto'}, defs);
      make('path', {d: 'M0,0 L10,5 L0,10 z', class: cls}, m);
    }
    const lines = make('g', {class: 'edges'}, svg);
    const nodes = make('g', {class: 'nodes'}, svg);
    const labels = make('g', {class: 'edge-labels'}, svg);
    nodeViews = new Map(graph.nodes.map(n => [n.id, drawNode(n, nodes)]));
    const ids = edgeIds(graph.edges);
    edgeViews = graph.edges.map((e, i) => drawEdge(e, ids[i], lines, labels));
    drawCards(graph);
  }

  function update(graph) {
    if (graph.history && graph.history.step_seconds > 0) {
      historySlots = Math.round(900 / graph.history.step_seconds);
    }
    for (const n of graph.nodes) {
      const view = nodeViews.get(n.id);
      const f = view.fields;
      if (n.type === 'topic') {
        for (const p of n.partition_lengths || []) {
          if (f['length.' + p.partition]) {
            f['length.' + p.partition].textContent = p.length < 10000 ? count(p.length) : compact.format(p.length);
          }
        }
        if (f.entries && n.partition_lengths) {
          f.entries.textContent = count(n.partition_lengths.reduce((s, p) => s + p.length, 0));
        }
        continue;
      }
      const c = n.counters;
      for (const [key] of COUNTERS) {
        f[key].textContent = count(c ? c[key] : null);
      }
      f.dead_lettered.classList.toggle('hot', !!c && c.dead_lettered > 0);
      if (n.stateful) {
        for (const [key] of STATE_COUNTERS) {
          f[key].textContent = count(c ? c[key] : null);
        }
        showWatermark(view, n.watermark, graph.taken, n.last_dead_letters);
      } else {
        const about = view.about + reasonsAbout(n.last_dead_letters);
        if (view.title.textContent !== about) {
          view.title.textContent = about;
        }
      }
      const last = n.last_dead_letters && n.last_dead_letters[0];
      // The box has room for the start of the reason: without where in the pipeline it happened
      // (path:line,column: ), which the title and the card show.
      f.last_dead_letter.textContent = last ? shorten('last: ' + last.reason.replace(LOCATION, ''), 34) : '';
      const h = n.history;
      for (const key of ['rate', 'lag']) {
        const series = h ? h[key] : null;
        showSpark(f, key, series, Number(f[key + '_history'].dataset.width), 18);
        const now = series && series.length ? series[series.length - 1] : null;
        f[key + '_caption'].textContent = (key === 'rate' ? 'in/s ' + (now === null ? '' : rate(now).replace(' msg/s', '')) : 'lag ' + (now === null ? '' : count(now)));
      }
      if (f.produced) {
        const p = n.progress;
        f.produced.textContent = !p ? '–' : count(p.produced) + (p.total ? ' of ' + count(p.total) : '') + (p.done ? ', done' : '');
        const upstream = p && p.upstream_lag != null;
        f.upstream_caption.textContent = upstream ? ' · upstream lag ' : '';
        f.upstream_lag.textContent = upstream ? count(p.upstream_lag) : '';
        f.upstream_lag.classList.toggle('behind', upstream && p.upstream_lag > 0);
      }
      if (f.stream) {
        const st = n.stream;
        f.stream_lag.textContent = count(st ? st.lag : null);
        f.stream_pending.textContent = count(st ? st.pending : null);
        f.stream_length.textContent = count(st ? st.length : null);
        f.stream.classList.toggle('behind', !!st && st.lag > 0);
      }
      if (f.dead_letters) {
        f.dead_letters.textContent = count(n.dead_letters);
        f.dead_letters.classList.toggle('hot', n.dead_letters > 0);
      }
      // A node that waits says so in place of its description: paused (its downstream fails
      // transiently), held back (a topic it writes is at its max_lag) or delayed (a rate limit).
      let waiting = '';
      if (n.paused) {
        waiting = 'paused: ' + n.paused.reason;
      } else if (n.held_back_by) {
        waiting = 'held back: topic ' + n.held_back_by + ' is full';
      } else if (n.delaying) {
        waiting = 'rate limit: ' + n.delaying + ' waiting';
      }
      f.detail.textContent = shorten(waiting || n.detail, 34);
      f.detail.classList.toggle('waiting', !!waiting);
      view.g.classList.toggle('waiting', !!waiting);
      view.g.classList.toggle('has-dead-letters', n.dead_letters > 0 || (!!c && c.dead_lettered > 0));
      view.g.classList.toggle('elsewhere', !c);
    }
    updateCards(graph);
    graph.edges.forEach((e, i) => {
      const f = edgeViews[i].fields;
      f.rate.textContent = rate(e.rate);
      if (f.lag) {
        f.lag.textContent = count(e.lag);
        f.pending.textContent = count(e.pending);
        f.backlog.classList.toggle('behind', e.lag > 0);
      }
      edgeViews[i].g.classList.toggle('moving', e.rate > 0);
    });
  }

  // The cards: per node, the same figures as in the graph, the reads edges' lag and pending
  // entries, the watermark, the sparklines and the last five dead letters in full. On a phone they
  // are all there is.
  const cards = document.getElementById('cards');
  let cardViews = new Map();

  function html(tag, attrs, parent, content) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      el.setAttribute(k, v);
    }
    if (content !== undefined) {
      el.textContent = content;
    }
    if (parent) {
      parent.appendChild(el);
    }
    return el;
  }

  function drawCards(graph) {
    cards.replaceChildren();
    cardViews = new Map();
    // In the order of the flow: by layer, then from the top.
    const ordered = [...graph.nodes].sort((a, b) => a.layer - b.layer || a.y - b.y);
    for (const n of ordered) {
      const card = html('article', {class: 'card ' + n.type, 'data-card': n.id}, cards);
      html('h3', {}, card, n.name);
      const fields = {};
      fields.detail = html('p', {class: 'detail'}, card, n.type === 'topic' ? 'topic · ' + n.detail : n.detail);
      const dl = html('dl', {}, card);
      // A figure in one of two columns, or (wide) across both.
      const figure = (key, caption, wide) => {
        const row = html('div', wide ? {class: 'wide'} : {}, dl);
        html('dt', {}, row, caption);
        fields[key] = html('dd', {'data-card-field': key}, row, '–');
      };
      if (n.type === 'topic') {
        figure('entries', 'entries');
        figure('partitions', 'partitions');
        fields.partitions.textContent = numbers.format(n.partitions);
        fields.lengths = html('p', {class: 'line', 'data-card-field': 'lengths'}, card);
        cardViews.set(n.id, {card, fields});
        continue;
      }
      for (const [key, caption] of COUNTERS) {
        figure(key, caption);
      }
      if (n.stateful) {
        for (const [key, caption] of STATE_COUNTERS) {
          figure(key, caption);
        }
        figure('watermark', 'watermark (UTC)', true);
        figure('watermark_lag', 'watermark lag', true);
      }
      if (n.type === 'source') {
        figure('produced', n.kind === 'redis_stream' ? 'stream lag' : 'produced', true);
      } else {
        figure('dead_letters', 'dead-letter stream', true);
      }
      fields.inputs = graph.edges.filter(e => e.to === n.id && e.kind === 'reads').map(e => {
        const line = html('p', {class: 'line'}, card);
        html('span', {class: 'caption'}, line, 'from ' + e.from + ': ');
        return {edge: e.from + '>' + e.to, el: html('span', {'data-card-field': 'input'}, line, '–')};
      });
      const sparks = html('div', {class: 'sparks'}, card);
      for (const [key, caption] of [['rate', 'in/s, 15 min'], ['lag', 'input lag, 15 min']]) {
        const fig = html('figure', {}, sparks);
        fields[key + '_caption'] = html('figcaption', {}, fig, caption);
        const box = make('svg', {viewBox: '0 0 100 28', preserveAspectRatio: 'none', role: 'img', 'aria-label': caption}, fig);
        make('rect', {class: 'spark-area', x: 0, y: 0, width: 100, height: 28}, box);
        fields[key + '_fill'] = make('path', {class: 'spark-fill ' + key, d: ''}, box);
        fields[key + '_history'] = make('path', {class: 'spark ' + key, d: '', 'vector-effect': 'non-scaling-stroke',
          'data-card-field': key + '_history'}, box);
      }
      fields.reasons = html('ol', {class: 'reasons', 'data-card-field': 'reasons'}, card);
      fields.no_reasons = html('p', {class: 'none'}, card, 'no dead letters');
      cardViews.set(n.id, {card, fields});
    }
  }

  function updateCards(graph) {
    const edges = new Map();
    const ids = edgeIds(graph.edges);
    graph.edges.forEach((e, i) => edges.set(ids[i], e));
    for (const n of graph.nodes) {
      const view = cardViews.get(n.id);
      const f = view.fields;
      if (n.type === 'topic') {
        const lengths = n.partition_lengths || [];
        f.entries.textContent = lengths.length ? count(lengths.reduce((s, p) => s + p.length, 0)) : '–';
        const shown = lengths.map(p => `p${p.partition} ${count(p.length)}`);
        if (f.lengths.dataset.shown !== shown.join()) {
          f.lengths.replaceChildren(...shown.flatMap((p, i) => [i > 0 ? ' · ' : '', html('span', {class: 'partition'}, null, p)]));
          f.lengths.dataset.shown = shown.join();
        }
        continue;
      }
      const g = nodeViews.get(n.id);
      const c = n.counters;
      for (const [key] of COUNTERS) {
        f[key].textContent = count(c ? c[key] : null);
      }
      f.dead_lettered.classList.toggle('hot', !!c && c.dead_lettered > 0);
      if (n.stateful) {
        for (const [key] of STATE_COUNTERS) {
          f[key].textContent = count(c ? c[key] : null);
        }
        f.watermark.textContent = g.fields.watermark.textContent;
        f.watermark_lag.textContent = g.fields.watermark_lag.textContent;
      }
      if (f.produced) {
        f.produced.textContent = g.fields.produced ? g.fields.produced.textContent : g.fields.stream_lag.textContent;
      }
      if (f.dead_letters) {
        f.dead_letters.textContent = count(n.dead_letters);
        f.dead_letters.classList.toggle('hot', n.dead_letters > 0);
      }
      for (const input of f.inputs) {
        const e = edges.get(input.edge);
        input.el.textContent = !e ? '–' : rate(e.rate) + (e.lag === null ? '' : ` · lag ${count(e.lag)} · pending ${count(e.pending)}`);
        input.el.classList.toggle('behind', !!e && e.lag > 0);
      }
      f.detail.textContent = g.fields.detail.textContent;
      f.detail.classList.toggle('waiting', g.fields.detail.classList.contains('waiting'));
      const h = n.history;
      for (const key of ['rate', 'lag']) {
        const series = h ? h[key] : null;
        showSpark(f, key, series, 100, 28);
        const now = series && series.length ? series[series.length - 1] : null;
        const caption = key === 'rate' ? 'in/s, 15 min' : 'input lag, 15 min';
        f[key + '_caption'].textContent = now === null ? caption : caption + ': ' + (key === 'rate' ? rate(now) : count(now));
      }
      const last = n.last_dead_letters || [];
      const shown = JSON.stringify(last);
      if (f.reasons.dataset.shown !== shown) {
        f.reasons.replaceChildren();
        for (const d of last) {
          const li = html('li', {}, f.reasons);
          html('time', {datetime: d.at}, li, new Date(d.at).toISOString().slice(11, 19) + ' ');
          html('span', {class: 'reason'}, li, d.reason);
        }
        f.reasons.dataset.shown = shown;
      }
      f.no_reasons.hidden = last.length > 0;
      view.card.classList.toggle('has-dead-letters', g.g.classList.contains('has-dead-letters'));
      view.card.classList.toggle('elsewhere', !c);
    }
  }

  function status(graph) {
    document.title = 'flowrun · ' + graph.pipeline.name;
    document.getElementById('pipeline').textContent = graph.pipeline.name;
    document.getElementById('description').textContent = graph.pipeline.description || '';
    const badge = document.getElementById('ready');
    let problem = graph.poll_error ? 'Redis: ' + graph.poll_error : graph.not_ready;
    if (graph.redis_failing_since) {
      const secs = (new Date(graph.taken) - new Date(graph.redis_failing_since)) / 1000;
      problem = 'Redis has been failing for ' + duration(Math.max(0, secs)) + '; waiting for it';
    }
    badge.textContent = graph.ready ? 'ready' : 'not ready: ' + problem;
    badge.className = 'badge ' + (graph.ready ? 'ok' : 'warn');
    const taken = new Date(graph.taken);
    document.getElementById('updated').textContent =
      `updated ${taken.toLocaleTimeString()} · running ${duration(graph.elapsed_seconds)} · ${graph.leases} partition leases`;
  }

  function duration(seconds) {
    const s = Math.floor(seconds);
    if (s < 60) {
      return s + 's';
    }
    if (s < 3600) {
      return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
    }
    if (s < 86400) {
      return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
    }
    const days = Math.floor(s / 86400);
    return days < 10 ? days + 'd ' + Math.floor((s % 86400) / 3600) + 'h' : numbers.format(days) + 'd';
  }

  async function refresh() {
    try {
      const res = await fetch('api/graph', {cache: 'no-store'});
      if (!res.ok) {
        throw new Error('HTTP ' + res.status);
      }
      const graph = await res.json();
      const next = JSON.stringify([graph.layout, graph.nodes.map(n => [n.id, n.x, n.y]), graph.edges.map(e => e.points)]);
      if (next !== shape) {
        draw(graph);
        shape = next;
      }
      update(graph);
      status(graph);
      document.body.dataset.state = 'ok';
    } catch (err) {
      const badge = document.getElementById('ready');
      badge.textContent = 'no answer from flowrun (' + err.message + '); the numbers below are stale';
      badge.className = 'badge error';
      document.body.dataset.state = 'error';
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  refresh();
})();
