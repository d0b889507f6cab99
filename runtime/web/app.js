// The live page of a flowrun pipeline. It draws the graph that api/graph describes, each node where
// the server placed it, and refreshes the numbers every second. It computes no layout and loads
// nothing but api/graph.
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
    COUNTERS.forEach(([key, caption], i) => {
      const x = 12 + (i % 2) * 118;
      const y = 62 + Math.floor(i / 2) * 18;
      text(g, {class: 'caption', x, y}, caption);
      fields[key] = text(g, {class: 'value', x: x + 108, y, 'text-anchor': 'end', 'data-field': key}, '–');
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
    return {g, fields, title, about};
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
  function showWatermark(view, w, taken) {
    const f = view.fields;
    f.watermark.textContent = w && w.least ? eventTime(w.least, taken) : '–';
    f.watermark_lag.textContent = w && w.least ? lag(w.lag_seconds) : '–';
    let about = view.about;
    if (w) {
      about += `\nwatermark in each partition of topic ${w.topic} (UTC), and its lag:` + w.partitions.map(p =>
        `\n  p${p.partition}  ` + (p.watermark ? new Date(p.watermark).toISOString() + ', lag ' + lag(p.lag_seconds) : 'none yet')).join('');
    }
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
    svg.setAttribute('viewBox', `0 0 ${graph.layout.width} ${graph.layout.height}`);
    svg.setAttribute('width', graph.layout.width);
    svg.setAttribute('height', graph.layout.height);
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
  }

  function update(graph) {
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
        showWatermark(view, n.watermark, graph.taken);
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
