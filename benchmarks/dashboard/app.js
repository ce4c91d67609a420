// The dashboard page script (plain browser JS, inlined by build.mjs). Top: a headline table of the
// current figures against their anchors and goals (GOALS), then the charts that matter (KEY), then
// every figure grouped by suite, then the runs. Result files whose names mark a superseded
// experiment (VARIANTS) are left out of all of it unless the "show superseded" toggle (or the URL
// hash #variants) asks for them in the grouped part.
// When done it records, for each canvas, how many pixels were drawn (data-drawn on <body>): the
// headless test reads that to know the charts really drew.
(() => {
  // Superseded experiment runs, by result file name: kept for the record, not current figures.
  const VARIANTS = [
    { re: /-split(-\d+)?$/, why: 'split-argmax experiment' },
    { re: /-argmax(-\d+)?$/, why: 'argmax experiment' },
    { re: /-upstream$/, why: "upstream's argmax, a comparison run" },
    { re: /-no-cuda-graphs$/, why: 'CUDA graphs off, a diagnosis run' },
    { re: /-omp-passive/, why: 'OMP_WAIT_POLICY=passive experiment' },
    { re: /-threads\d+$/, why: 'thread count experiment' },
    { re: /-one-runner/, why: 'one-runner build (reverted)' },
    { re: /\d{8}j-/, why: 'run j: the reverted one-runner build (issue 6)' },
    { re: /smoke/, why: 'smoke run of a new benchmark' },
  ];
  const variantOf = (file) => VARIANTS.find((v) => v.re.test(String(file).replace(/\.json$/, '')));

  // The goals the headline table checks, each with where it comes from. `kind: 'ratio'` compares
  // median / anchor median, `kind: 'max'` the median itself; `gpu` goals were set for the H200, so
  // a CPU run is shown but not judged.
  const GOALS = [
    {
      id: 'decode',
      title: 'decode, one stream through the HTTP API vs llama-bench tg128',
      source: 'issue 6: single-stream HTTP decode at least 0.98 of upstream llama-bench',
      kind: 'ratio',
      min: 0.98,
      gpu: true,
      match: (f) =>
        /decode/.test(f.name) &&
        /HTTP/.test(f.name) &&
        !/COMBINE|MoE|after serving|again|repeat|concurrent/.test(f.name) &&
        /^llama-bench tg\d+/.test(f.anchor?.name ?? '') &&
        !/--rpc/.test(f.anchor.name),
      key: (_f, m) => m,
    },
    {
      id: 'prefill',
      title: 'prefill 512 vs llama-bench pp512',
      source: 'no goal set (issue 6 measures it beside decode)',
      kind: 'ratio',
      match: (f) =>
        /prefill 512/.test(f.name) &&
        !/COMBINE|--rpc|merged port/.test(f.name) &&
        /^llama-bench pp512/.test(f.anchor?.name ?? ''),
      key: (_f, m) => m,
    },
    {
      id: 'rpc',
      title: 'ggml-RPC through the merged port vs stock ggml-rpc-server',
      source: 'issue 18: the merged port stays at parity with stock ggml-rpc-server (0.99x)',
      kind: 'ratio',
      min: 0.99,
      gpu: true,
      match: (f) =>
        /merged port/.test(f.name) &&
        /decode|prefill/.test(f.name) &&
        /stock ggml-rpc-server/.test(f.anchor?.name ?? ''),
      key: (f, m) =>
        `${m}, ${/1\/1 split/.test(f.name) ? '1/1 split' : 'all layers remote'}, ${/prefill/.test(f.name) ? 'prefill' : 'decode'}`,
    },
    {
      id: 'concurrency',
      title: 'serving: engine aggregate decode vs llama-batched-bench S_TG',
      source: 'issue 19: >= 0.95x of llama-batched-bench at every level',
      kind: 'ratio',
      min: 0.95,
      gpu: true,
      match: (f) =>
        /^concurrency: engine aggregate decode, \d+ concurrent.*\(vs batched-bench\)$/.test(f.name),
      key: (f, m) => `${m}, ${/(\d+) concurrent/.exec(f.name)[1]} streams`,
    },
    {
      id: 'stall',
      title: 'prefill stall: max inter-token gap of running streams',
      source: 'issue 19: max gap <= 60 ms while a long prompt is prefilled',
      kind: 'max',
      max: 60,
      gpu: true,
      match: (f) => /^stall: max inter-token gap.*budget \d+$/.test(f.name),
      key: (f, m) => `${m}, budget ${/budget (\d+)$/.exec(f.name)[1]}`,
    },
    {
      id: 'combine',
      title: 'COMBINE: head engine HTTP, 1/1 split with a peer engine vs llama-bench --rpc stock',
      source: 'no goal set',
      kind: 'ratio',
      match: (f) => /^COMBINE (decode|prefill)/.test(f.name) && /--rpc stock/.test(f.anchor?.name ?? ''),
      key: (f, m) => `${m}, ${/^COMBINE prefill/.test(f.name) ? 'prefill' : 'decode'}`,
    },
  ];

  const COLORS = ['#1f6fd1', '#e07b00', '#2a9d3f', '#8e44ad', '#c0392b', '#16a085', '#7f8c8d', '#b8860b'];
  const WIDTH = 560;

  const results = (window.HYDRA_RESULTS || []).map((r, run) => ({
    ...r,
    run,
    model: modelOfRun(r),
    variant: variantOf(r.file),
  }));
  const current = results.filter((r) => !r.variant);

  function modelOfRun(r) {
    const m = r.notes && typeof r.notes.model === 'string' ? r.notes.model : '';
    return m
      .split('/')
      .pop()
      .replace(/\.gguf$/, '');
  }
  // The model a figure measured: named in the figure (8b q4_0, llama-8b-q4_0), else the run's.
  function modelOf(r, f) {
    const m = /(?:llama-)?\b(tiny|\d+b)[- ]q4_0/.exec(f.name);
    if (m) return `${/MoE/.test(f.name) ? 'MoE ' : ''}${m[1]} q4_0`;
    return r.model.replace(/^llama-/, '').replace(/-q4_0$/, ' q4_0') || 'model n/a';
  }
  const gpuOf = (r) => (r.machine.gpus?.length ? r.machine.gpus[0] : 'CPU');
  const fmt = (v) => (v == null ? '' : Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3));
  const el = (tag, props = {}, text) => {
    const e = document.createElement(tag);
    Object.assign(e, props);
    if (text != null) e.textContent = String(text);
    return e;
  };

  // ---- headline table --------------------------------------------------------------------------
  // goal id -> key -> [{ r, f }] oldest first, from the current (non-variant) runs.
  const byGoal = new Map(GOALS.map((g) => [g.id, new Map()]));
  for (const r of current) {
    for (const f of r.figures) {
      for (const g of GOALS) {
        if (!g.match(f) || (g.gpu && !r.machine.gpus?.length)) continue;
        const key = g.key(f, modelOf(r, f));
        const rows = byGoal.get(g.id);
        if (!rows.has(key)) rows.set(key, []);
        const list = rows.get(key);
        // One point per run and key: the first figure of a run that matches.
        if (!list.length || list[list.length - 1].r !== r) list.push({ r, f });
      }
    }
  }

  function verdict(g, f) {
    if (g.kind === 'ratio' && g.min == null) return { text: 'no goal', cls: '' };
    if (g.kind === 'max')
      return f.median <= g.max ? { text: 'meets', cls: 'ok' } : { text: 'misses', cls: 'bad' };
    if (f.ratio == null) return { text: 'no anchor', cls: 'bad' };
    return f.ratio >= g.min ? { text: 'meets', cls: 'ok' } : { text: 'misses', cls: 'bad' };
  }

  const headline = document.getElementById('headline');
  const htable = el('table', { className: 'headline' });
  htable.innerHTML =
    '<tr><th>figure</th><th>model, case</th><th>ours</th><th>anchor</th><th>ratio</th><th>goal</th><th>status</th><th>run (latest)</th><th>result file</th><th>commit</th></tr>';
  let headlineRows = 0;
  for (const g of GOALS) {
    const rows = byGoal.get(g.id);
    if (!rows.size) continue;
    const goalText = g.kind === 'max' ? `<= ${g.max} ${'ms'}` : g.min != null ? `>= ${g.min}x` : '—';
    const keys = [...rows.keys()].sort((a, b) => a.localeCompare(b, 'en', { numeric: true }));
    keys.forEach((key, i) => {
      const list = rows.get(key);
      const { r, f } = list[list.length - 1];
      const v = verdict(g, f);
      const tr = el('tr', { className: 'hrow' });
      tr.dataset.goal = g.id;
      tr.dataset.key = key;
      if (i === 0) {
        const td = el('td', { rowSpan: keys.length, className: 'goalname', title: g.source }, g.title);
        td.appendChild(el('div', { className: 'src' }, g.source));
        tr.appendChild(td);
      }
      const cells = [
        [key],
        [`${fmt(f.median)} ${f.unit}`, 'num'],
        [f.anchor ? `${fmt(f.anchor.median)} ${f.anchor.unit} (${f.anchor.name})` : '—'],
        [f.ratio == null ? '—' : `${f.ratio.toFixed(3)}x`, 'num'],
        [goalText, 'goal'],
        [v.text, v.cls],
        [`${r.date.slice(0, 16).replace('T', ' ')}, ${gpuOf(r)}`],
        [r.file, 'file'],
        [r.commit.slice(0, 10), 'commit'],
      ];
      for (const [text, cls] of cells) tr.appendChild(el('td', { className: cls ?? '' }, text));
      htable.appendChild(tr);
      headlineRows++;
    });
  }
  if (headlineRows) {
    headline.appendChild(htable);
    headline.appendChild(
      el(
        'p',
        { className: 'meta' },
        'Goals set for the H200 are checked on GPU runs only; CPU runs of the same figures are in the charts below.',
      ),
    );
  } else headline.appendChild(el('p', { className: 'meta' }, 'No results carry a headline figure yet.'));

  // ---- charts ----------------------------------------------------------------------------------
  // x labels: one per run, thinned so that neighbours never overlap (about 64 px per label).
  function runAxis(labels) {
    const step = Math.max(1, Math.ceil(labels.length / Math.floor((WIDTH - 90) / 64)));
    return {
      splits: () => labels.map((_, i) => i).filter((i) => i % step === 0 || i === labels.length - 1),
      values: (_u, vals) => vals.map((v) => labels[v] ?? ''),
      size: 40,
    };
  }
  // Flat reference lines (goal, anchor, limit) with their names, spread so that two labels at
  // nearly the same height do not print over each other.
  function flatHook(lines) {
    return (u) => {
      const ctx = u.ctx;
      ctx.save();
      const used = [];
      for (const line of lines) {
        const y = u.valToPos(line.v, 'y', true);
        if (!Number.isFinite(y)) continue;
        ctx.strokeStyle = line.color;
        ctx.fillStyle = line.color;
        ctx.lineWidth = 1.5 * devicePixelRatio;
        ctx.setLineDash([8 * devicePixelRatio, 4 * devicePixelRatio]);
        ctx.beginPath();
        ctx.moveTo(u.bbox.left, y);
        ctx.lineTo(u.bbox.left + u.bbox.width, y);
        ctx.stroke();
        ctx.font = `${11 * devicePixelRatio}px system-ui`;
        const w = ctx.measureText(line.text).width;
        let x = u.bbox.left + u.bbox.width - w - 4 * devicePixelRatio;
        for (const p of used) if (Math.abs(p.y - y) < 13 * devicePixelRatio && p.x < x + w) x = p.x - w - 12;
        ctx.fillStyle = 'rgba(255,255,255,0.85)';
        ctx.fillRect(x - 2, y - 15 * devicePixelRatio, w + 4, 13 * devicePixelRatio);
        ctx.fillStyle = line.color;
        ctx.fillText(line.text, x, y - 4 * devicePixelRatio);
        used.push({ x, y });
      }
      ctx.restore();
    };
  }
  function box(parent, titleText, metaText, cls = 'chart') {
    const b = el('div', { className: cls });
    b.appendChild(el('h3', {}, titleText));
    if (metaText) b.appendChild(el('div', { className: 'meta' }, metaText));
    parent.appendChild(b);
    return b;
  }
  const yFromZero = (pad = 1.15) => ({ range: (_u, _min, max) => [0, max > 0 ? max * pad : 1] });

  // A figure family over runs: one line per key (model, case), y = ratio to the anchor.
  function ratioOverRuns(parent, title, rowsByKey, goal) {
    const runs = [...new Set([...rowsByKey.values()].flat().map((p) => p.r.run))].sort((a, b) => a - b);
    const labels = runs.map((i) => results[i].commit.slice(0, 7));
    const keys = [...rowsByKey.keys()].sort((a, b) => a.localeCompare(b, 'en', { numeric: true }));
    const latest = keys.map((k) => {
      const l = rowsByKey.get(k);
      return `${k}: ${l[l.length - 1].f.ratio?.toFixed(3) ?? '—'}x`;
    });
    const b = box(
      parent,
      title,
      `ratio to the anchor over runs (x: commit); latest: ${latest.join('; ')}`,
      'chart key',
    );
    const series = [{ label: 'run', value: (_u, v) => (v == null ? '' : labels[v]) }];
    const data = [runs.map((_, i) => i)];
    keys.forEach((k, i) => {
      const c = COLORS[i % COLORS.length];
      series.push({
        label: k,
        stroke: c,
        width: 2,
        spanGaps: true,
        points: { show: true, size: 7, fill: c },
      });
      const byRun = new Map(rowsByKey.get(k).map((p) => [p.r.run, p.f.ratio]));
      data.push(runs.map((run) => byRun.get(run) ?? null));
    });
    const flats = [{ v: 1, color: '#999', text: 'parity 1.0x' }];
    if (goal?.min != null) flats.push({ v: goal.min, color: '#c0392b', text: `goal ${goal.min}x` });
    const all = data
      .slice(1)
      .flat()
      .filter((v) => v != null);
    const lo = Math.min(...all, ...flats.map((f) => f.v));
    const hi = Math.max(...all, ...flats.map((f) => f.v));
    const pad = Math.max(0.02, (hi - lo) * 0.15);
    return new uPlot(
      {
        width: WIDTH,
        height: 240,
        legend: { live: false },
        series,
        scales: {
          x: { time: false, range: () => [-0.5, runs.length - 0.5] },
          y: { range: () => [lo - pad, hi + pad] },
        },
        axes: [
          runAxis(labels),
          { label: 'ratio (x)', size: 60, values: (_u, v) => v.map((x) => x.toFixed(2)) },
        ],
        hooks: { draw: [flatHook(flats)] },
      },
      data,
      b,
    );
  }

  // Values of one run against a swept x (streams, budget): one line per series spec.
  function againstX(parent, title, meta, xKey, xs, lines, flats = []) {
    const b = box(parent, title, meta, 'chart key');
    const log = xs[0] > 0 && xs[xs.length - 1] / xs[0] >= 8;
    const series = [{ label: xKey }];
    const data = [xs];
    lines.forEach((l, i) => {
      const c = l.color ?? COLORS[i % COLORS.length];
      series.push({
        label: l.label,
        stroke: c,
        width: 2,
        dash: l.dash,
        points: { show: true, size: 7, fill: c },
      });
      data.push(l.values);
    });
    return new uPlot(
      {
        width: WIDTH,
        height: 240,
        legend: { live: false },
        series,
        scales: { x: log ? { time: false, distr: 3, log: 2 } : { time: false }, y: yFromZero() },
        axes: [
          { splits: () => xs, label: xKey, size: 50 },
          { label: lines[0]?.unit ?? '', size: 70 },
        ],
        hooks: { draw: [flatHook(flats)] },
      },
      data,
      b,
    );
  }

  const keyEl = document.getElementById('key');
  const keyPlots = [];
  const goal = (id) => GOALS.find((g) => g.id === id);
  if (byGoal.get('decode').size)
    keyPlots.push(
      ratioOverRuns(
        keyEl,
        'Decode, one stream through the HTTP API / llama-bench tg128',
        byGoal.get('decode'),
        goal('decode'),
      ),
    );
  if (byGoal.get('prefill').size)
    keyPlots.push(ratioOverRuns(keyEl, 'Prefill 512 / llama-bench pp512', byGoal.get('prefill')));

  // Concurrency and stall: the latest current run per model that has the sweep.
  function latestPerModel(test) {
    const out = new Map();
    for (const r of current) {
      for (const f of r.figures) if (test(f)) out.set(modelOf(r, f), r);
    }
    return new Map(
      [...out].sort(([, a], [, b]) => Number(!a.machine.gpus?.length) - Number(!b.machine.gpus?.length)),
    );
  }
  const concRe =
    /^concurrency: (engine|llama-server) aggregate decode, (\d+) concurrent.*\(vs (batched-bench|llama-server)\)$/;
  for (const [model, r] of latestPerModel((f) => concRe.test(f.name))) {
    const pts = new Map();
    for (const f of r.figures) {
      const m = concRe.exec(f.name);
      if (!m || modelOf(r, f) !== model) continue;
      const n = Number(m[2]);
      if (!pts.has(n)) pts.set(n, {});
      const p = pts.get(n);
      if (m[1] === 'engine') p.engine = f.median;
      if (m[1] === 'llama-server') p.server = f.median;
      if (m[3] === 'batched-bench' && f.anchor) p.bb = f.anchor.median;
      if (m[1] === 'engine' && m[3] === 'batched-bench') p.ratio = f.ratio;
    }
    const xs = [...pts.keys()].sort((a, b) => a - b);
    const meta = `latest run ${r.commit.slice(0, 7)} (${r.date.slice(0, 10)}, ${gpuOf(r)}, ${r.file}); engine / batched-bench: ${xs
      .map((x) => `${x}: ${pts.get(x).ratio?.toFixed(2) ?? '—'}x`)
      .join(', ')}`;
    keyPlots.push(
      againstX(
        keyEl,
        `Serving concurrency, ${model}: aggregate decode vs streams`,
        meta,
        'concurrent streams',
        xs,
        [
          { label: 'engine', unit: 'tok/s', values: xs.map((x) => pts.get(x).engine ?? null) },
          {
            label: 'llama-server',
            unit: 'tok/s',
            values: xs.map((x) => pts.get(x).server ?? null),
            dash: [6, 4],
          },
          {
            label: 'llama-batched-bench S_TG',
            unit: 'tok/s',
            values: xs.map((x) => pts.get(x).bb ?? null),
            dash: [2, 3],
          },
        ],
      ),
    );
  }
  const stallRe = /^stall: (max inter-token gap|long prompt time to first token).*budget (\d+)$/;
  for (const [model, r] of latestPerModel((f) => stallRe.test(f.name))) {
    for (const which of ['max inter-token gap', 'long prompt time to first token']) {
      const figs = r.figures
        .filter((f) => stallRe.exec(f.name)?.[1] === which && modelOf(r, f) === model)
        .sort((a, b) => Number(stallRe.exec(a.name)[2]) - Number(stallRe.exec(b.name)[2]));
      if (!figs.length) continue;
      const xs = figs.map((f) => Number(stallRe.exec(f.name)[2]));
      const gap = which === 'max inter-token gap';
      const meta = `latest run ${r.commit.slice(0, 7)} (${r.date.slice(0, 10)}, ${gpuOf(r)}, ${r.file}); ${figs
        .map((f, i) => `${xs[i]}: ${fmt(f.median)} / ${fmt(f.anchor?.median)}`)
        .join(', ')} ms (engine / llama-server)`;
      keyPlots.push(
        againstX(
          keyEl,
          `Prefill stall, ${model}: budget -> ${gap ? 'max gap of running streams' : 'long prompt TTFT'}`,
          meta,
          'budget (n_batch)',
          xs,
          [
            { label: 'engine', unit: 'ms', values: figs.map((f) => f.median) },
            {
              label: 'llama-server, same flags',
              unit: 'ms',
              values: figs.map((f) => f.anchor?.median ?? null),
              dash: [6, 4],
            },
          ],
          gap ? [{ v: goal('stall').max, color: '#c0392b', text: `goal <= ${goal('stall').max} ms` }] : [],
        ),
      );
    }
  }
  for (const phase of ['decode', 'prefill']) {
    const rows = new Map(
      [...byGoal.get('rpc')]
        .filter(([k]) => k.endsWith(phase))
        .map(([k, v]) => [k.replace(`, ${phase}`, ''), v]),
    );
    if (rows.size)
      keyPlots.push(
        ratioOverRuns(keyEl, `ggml-RPC ${phase}: merged port / stock ggml-rpc-server`, rows, goal('rpc')),
      );
  }
  if (byGoal.get('combine').size)
    keyPlots.push(
      ratioOverRuns(
        keyEl,
        'COMBINE: head engine + peer engine / llama-bench --rpc stock, same split',
        byGoal.get('combine'),
      ),
    );

  // ---- every figure, grouped by suite ----------------------------------------------------------
  const chartsEl = document.getElementById('charts');
  const runsEl = document.getElementById('runs');
  const toggle = document.getElementById('show-variants');
  let plots = [];
  let sweeps = [];

  function drawChart(parent, g) {
    const runs = [...new Set(g.points.map((p) => p.r.run))].sort((a, b) => a - b);
    const labels = runs.map((i) => results[i].commit.slice(0, 7));
    const models = [...new Set(g.points.map((p) => p.model))];
    const last = g.points[g.points.length - 1].f;
    const ratio =
      last.ratio == null ? 'no anchor' : `ratio ${last.ratio.toFixed(3)} (${last.better} is better)`;
    const b = box(
      parent,
      g.name,
      `${fmt(last.median)} ${last.unit}; ${ratio}${last.anchor ? `; anchor: ${last.anchor.name}` : ''}${last.limit ? `; limit: ${last.limit.name}` : ''}`,
    );
    const series = [{ label: 'run', value: (_u, v) => (v == null ? '' : labels[v]) }];
    const data = [runs.map((_, i) => i)];
    // Series keyed by model: a suite that ran two models draws two lines, never one zigzag.
    models.forEach((m, i) => {
      const c = COLORS[i % COLORS.length];
      const pts = g.points.filter((p) => p.model === m);
      const byRun = new Map(pts.map((p) => [p.r.run, p.f]));
      const name = models.length > 1 || m ? `${m || 'model n/a'}: ` : '';
      series.push({
        label: `${name}${last.unit} (median)`,
        stroke: c,
        width: 2,
        spanGaps: true,
        points: { show: true, size: 8, fill: c },
      });
      data.push(runs.map((run) => byRun.get(run)?.median ?? null));
      if (pts.some((p) => p.f.anchor)) {
        series.push({
          label: `${name}anchor`,
          stroke: c,
          width: 1.5,
          dash: [6, 4],
          spanGaps: true,
          points: { show: true, size: 6, fill: '#fff', stroke: c },
        });
        data.push(runs.map((run) => byRun.get(run)?.anchor?.median ?? null));
      }
      if (pts.some((p) => p.f.limit)) {
        series.push({
          label: `${name}limit`,
          stroke: '#c0392b',
          width: 1,
          points: { show: true, size: 5, fill: '#c0392b' },
        });
        data.push(runs.map((run) => byRun.get(run)?.limit?.value ?? null));
      }
    });
    // With one model, the latest anchor and limit also as flat lines: with one run a series is a dot.
    const flats = [];
    if (models.length === 1) {
      if (last.anchor) flats.push({ v: last.anchor.median, color: COLORS[0], text: 'anchor' });
      if (last.limit) flats.push({ v: last.limit.value, color: '#c0392b', text: 'limit' });
    }
    return new uPlot(
      {
        width: WIDTH,
        height: 240,
        legend: { live: false },
        series,
        scales: { x: { time: false, range: () => [-0.5, runs.length - 0.5] }, y: yFromZero() },
        axes: [runAxis(labels), { label: last.unit, size: 70 }],
        hooks: { draw: [flatHook(flats)] },
      },
      data,
      b,
    );
  }

  function drawSweep(parent, g) {
    const points = [...g.figures].sort((a, b) => a.sweep.value - b.sweep.value);
    const unit = points[0].unit;
    const anchorName = points.find((f) => f.anchor)?.anchor.name;
    const meta = `run ${g.r.commit.slice(0, 7)} (${g.r.file}); x: ${g.sweep.key}; ${points
      .map(
        (f) =>
          `${f.sweep.value}: ${f.median.toPrecision(3)}${f.anchor ? ` / ${f.anchor.median.toPrecision(3)}` : ''}`,
      )
      .join(', ')} ${unit}${anchorName ? ` (figure / anchor: ${anchorName})` : ''}`;
    const xs = points.map((f) => f.sweep.value);
    const lines = [{ label: `median (${unit})`, unit, values: points.map((f) => f.median) }];
    if (anchorName)
      lines.push({
        label: 'anchor',
        unit,
        values: points.map((f) => f.anchor?.median ?? null),
        dash: [6, 4],
      });
    const p = againstX(parent, `${g.suite}: ${g.sweep.family}`, meta, g.sweep.key, xs, lines);
    p.root.parentElement.className = 'chart sweep';
    return p;
  }

  function renderRest(showVariants) {
    for (const p of [...plots, ...sweeps]) p.destroy();
    chartsEl.replaceChildren();
    runsEl.replaceChildren();
    const shown = showVariants ? results : current;
    const hidden = results.filter((r) => r.variant);
    const note = el(
      'p',
      { className: 'meta' },
      showVariants
        ? `Showing all ${results.length} result files, the ${hidden.length} superseded experiment runs among them.`
        : `${hidden.length} superseded experiment run(s) hidden: ${hidden.map((r) => r.file).join(', ') || 'none'}.`,
    );
    chartsEl.appendChild(note);
    const bySuite = new Map();
    for (const r of shown) {
      for (const f of r.figures) {
        if (!bySuite.has(r.suite)) bySuite.set(r.suite, new Map());
        const groups = bySuite.get(r.suite);
        if (!groups.has(f.name)) groups.set(f.name, { suite: r.suite, name: f.name, points: [] });
        groups.get(f.name).points.push({ r, f, model: r.model });
      }
    }
    plots = [];
    for (const [suite, groups] of bySuite) {
      const files = new Set([...groups.values()].flatMap((g) => g.points.map((p) => p.r.file)));
      const sec = el('details', { className: 'suite', open: true });
      sec.appendChild(el('summary', {}, `${suite}: ${groups.size} figure(s) over ${files.size} run(s)`));
      chartsEl.appendChild(sec);
      for (const g of groups.values()) plots.push(drawChart(sec, g));
    }
    // Sweeps: each figure family from the latest shown run that has it.
    const families = new Map();
    for (const r of shown) {
      for (const f of r.figures) {
        if (!f.sweep) continue;
        const key = `${r.suite} :: ${f.sweep.family}`;
        const g = families.get(key);
        if (!g || g.r.run < r.run) families.set(key, { suite: r.suite, sweep: f.sweep, r, figures: [f] });
        else if (g.r === r) g.figures.push(f);
      }
    }
    sweeps = [];
    if (families.size) {
      const sec = el('details', { className: 'suite', open: true });
      sec.appendChild(el('summary', {}, `sweeps (latest run of each): ${families.size}`));
      chartsEl.appendChild(sec);
      for (const g of families.values()) sweeps.push(drawSweep(sec, g));
    }

    const table = el('table');
    table.innerHTML =
      '<tr><th>run</th><th>suite</th><th>file</th><th>commit</th><th>date</th><th>machine</th></tr>';
    for (const r of shown) {
      const tr = el('tr');
      const m = r.machine;
      const gpu = m.gpus?.length ? `, ${m.gpus.join(' + ')}` : '';
      for (const v of [
        r.run,
        r.suite,
        r.file + (r.variant ? ` (${r.variant.why})` : ''),
        r.commit.slice(0, 10),
        r.date.slice(0, 19),
        `${m.cpu} x${m.cores}${gpu}, ${m.os}, node ${m.node}`,
      ])
        tr.appendChild(el('td', {}, v));
      table.appendChild(tr);
    }
    runsEl.appendChild(table);
    document.body.setAttribute('data-variants', showVariants ? 'shown' : 'hidden');
    selfCheck();
  }

  // Self-check for the headless test: non-transparent pixels per chart canvas.
  function selfCheck() {
    requestAnimationFrame(() =>
      requestAnimationFrame(() => {
        const counts = [];
        for (const canvas of document.querySelectorAll('.chart canvas')) {
          const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
          let n = 0;
          for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) n++;
          counts.push(n);
        }
        document.body.setAttribute('data-headline', String(headlineRows));
        document.body.setAttribute('data-keycharts', String(keyPlots.length));
        document.body.setAttribute('data-charts', String(plots.length));
        document.body.setAttribute('data-sweeps', String(sweeps.length));
        document.body.setAttribute('data-drawn', JSON.stringify(counts));
        document.body.setAttribute(
          'data-hidden-files',
          JSON.stringify(results.filter((r) => r.variant).map((r) => r.file)),
        );
      }),
    );
  }

  const initial = /(^#|&)variants\b/.test(location.hash);
  if (toggle) {
    toggle.checked = initial;
    toggle.addEventListener('change', () => renderRest(toggle.checked));
  }
  renderRest(initial);
})();
