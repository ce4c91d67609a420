// The dashboard page script (plain browser JS, inlined by build.mjs). Draws one uPlot chart per
// figure name: the figure's median over runs, its anchor's median, and its limit as a flat line; then
// one chart per sweep family (figures with `sweep`) of its latest run: median and anchor against x.
// When done it records, for each canvas, how many pixels were drawn (data-drawn on <body>): the
// headless test reads that to know the charts really drew.
(() => {
  const results = window.HYDRA_RESULTS || [];
  const runs = results.map((r, i) => ({
    i,
    suite: r.suite,
    commit: r.commit,
    date: r.date,
    machine: r.machine,
    file: r.file,
  }));

  const runsEl = document.getElementById('runs');
  const table = document.createElement('table');
  table.innerHTML = '<tr><th>run</th><th>suite</th><th>commit</th><th>date</th><th>machine</th></tr>';
  for (const r of runs) {
    const tr = document.createElement('tr');
    const m = r.machine;
    const gpu = m.gpus?.length ? `, ${m.gpus.join(' + ')}` : '';
    for (const v of [
      r.i,
      r.suite,
      r.commit.slice(0, 10),
      r.date.slice(0, 19),
      `${m.cpu} x${m.cores}${gpu}, ${m.os}, node ${m.node}`,
    ]) {
      const td = document.createElement('td');
      td.textContent = String(v);
      tr.appendChild(td);
    }
    table.appendChild(tr);
  }
  runsEl.appendChild(table);

  // figure name -> [{run, figure}]
  const byName = new Map();
  results.forEach((r, run) => {
    for (const f of r.figures) {
      const key = `${r.suite} :: ${f.name}`;
      if (!byName.has(key)) byName.set(key, { suite: r.suite, name: f.name, points: [] });
      byName.get(key).points.push({ run, f });
    }
  });

  const charts = document.getElementById('charts');
  const bySuite = new Map();
  for (const g of byName.values()) {
    if (!bySuite.has(g.suite)) bySuite.set(g.suite, []);
    bySuite.get(g.suite).push(g);
  }
  const plots = [];
  for (const [suite, groups] of bySuite) {
    const h2 = document.createElement('h2');
    h2.textContent = suite;
    charts.appendChild(h2);
    for (const g of groups) plots.push(drawChart(charts, g));
  }

  function drawChart(parent, g) {
    const box = document.createElement('div');
    box.className = 'chart';
    const title = document.createElement('h3');
    const last = g.points[g.points.length - 1].f;
    title.textContent = g.name;
    const meta = document.createElement('div');
    meta.className = 'meta';
    const ratio =
      last.ratio == null ? 'no anchor' : `ratio ${last.ratio.toFixed(3)} (${last.better} is better)`;
    meta.textContent = `${last.median.toPrecision(4)} ${last.unit}; ${ratio}${last.anchor ? `; anchor: ${last.anchor.name}` : ''}${last.limit ? `; limit: ${last.limit.name}` : ''}`;
    box.appendChild(title);
    box.appendChild(meta);
    parent.appendChild(box);

    const xs = g.points.map((p) => p.run);
    const series = [{ label: 'run', value: (_u, v) => (v == null ? '' : label(v)) }];
    const data = [xs];
    series.push({
      label: `${last.unit} (median)`,
      stroke: '#1f6fd1',
      width: 2,
      points: { show: true, size: 8, fill: '#1f6fd1' },
    });
    data.push(g.points.map((p) => p.f.median));
    if (g.points.some((p) => p.f.anchor)) {
      series.push({
        label: 'anchor',
        stroke: '#e07b00',
        width: 2,
        dash: [6, 4],
        points: { show: true, size: 7, fill: '#e07b00' },
      });
      data.push(g.points.map((p) => (p.f.anchor ? p.f.anchor.median : null)));
    }
    if (g.points.some((p) => p.f.limit)) {
      series.push({
        label: 'limit',
        stroke: '#c0392b',
        width: 2,
        points: { show: true, size: 5, fill: '#c0392b' },
      });
      data.push(g.points.map((p) => (p.f.limit ? p.f.limit.value : null)));
    }
    const opts = {
      width: 560,
      height: 240,
      series,
      scales: {
        x: { time: false, range: (_u, min, max) => [min - 0.5, max + 0.5] },
        y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.15 : 1] },
      },
      axes: [
        { splits: () => xs, values: (_u, vals) => vals.map((v) => label(v)), size: 40 },
        { label: last.unit, size: 70 },
      ],
    };
    // The latest anchor and limit also as flat lines across the plot: with one run a series is a dot.
    const flat = [];
    if (last.anchor) flat.push({ v: last.anchor.median, color: '#e07b00', text: 'anchor' });
    if (last.limit) flat.push({ v: last.limit.value, color: '#c0392b', text: 'limit' });
    opts.hooks = {
      draw: [
        (u) => {
          const ctx = u.ctx;
          ctx.save();
          for (const line of flat) {
            const y = u.valToPos(line.v, 'y', true);
            ctx.strokeStyle = line.color;
            ctx.fillStyle = line.color;
            ctx.lineWidth = 1.5 * devicePixelRatio;
            ctx.setLineDash([8 * devicePixelRatio, 4 * devicePixelRatio]);
            ctx.beginPath();
            ctx.moveTo(u.bbox.left, y);
            ctx.lineTo(u.bbox.left + u.bbox.width, y);
            ctx.stroke();
            ctx.font = `${11 * devicePixelRatio}px system-ui`;
            ctx.fillText(line.text, u.bbox.left + 4, y - 4);
          }
          ctx.restore();
        },
      ],
    };
    return new uPlot(opts, data, box);
  }

  // Sweeps: for each figure family of the latest run that has it, the figure and its anchor against
  // the swept value (the prefill budget's trade-off: budget -> max gap, budget -> TTFT).
  const families = new Map();
  results.forEach((r, run) => {
    for (const f of r.figures) {
      if (!f.sweep) continue;
      const key = `${r.suite} :: ${f.sweep.family}`;
      const g = families.get(key);
      if (!g || g.run < run) families.set(key, { suite: r.suite, sweep: f.sweep, run, figures: [f] });
      else if (g.run === run) g.figures.push(f);
    }
  });
  const sweeps = [];
  if (families.size > 0) {
    const h2 = document.createElement('h2');
    h2.textContent = 'sweeps (latest run of each)';
    charts.appendChild(h2);
    for (const g of families.values()) sweeps.push(drawSweep(charts, g));
  }

  function drawSweep(parent, g) {
    const box = document.createElement('div');
    box.className = 'chart sweep';
    const title = document.createElement('h3');
    title.textContent = `${g.suite}: ${g.sweep.family}`;
    const points = [...g.figures].sort((a, b) => a.sweep.value - b.sweep.value);
    const unit = points[0].unit;
    const anchorName = points.find((f) => f.anchor)?.anchor.name;
    const meta = document.createElement('div');
    meta.className = 'meta';
    meta.textContent = `run ${g.run} (${label(g.run)}); x: ${g.sweep.key}; ${points
      .map(
        (f) =>
          `${f.sweep.value}: ${f.median.toPrecision(3)}${f.anchor ? ` / ${f.anchor.median.toPrecision(3)}` : ''}`,
      )
      .join(', ')} ${unit}${anchorName ? ` (figure / anchor: ${anchorName})` : ''}`;
    box.appendChild(title);
    box.appendChild(meta);
    parent.appendChild(box);
    const xs = points.map((f) => f.sweep.value);
    const log = xs[0] > 0 && xs[xs.length - 1] / xs[0] >= 8;
    const series = [
      { label: g.sweep.key },
      {
        label: `median (${unit})`,
        stroke: '#1f6fd1',
        width: 2,
        points: { show: true, size: 8, fill: '#1f6fd1' },
      },
    ];
    const data = [xs, points.map((f) => f.median)];
    if (anchorName) {
      series.push({
        label: 'anchor',
        stroke: '#e07b00',
        width: 2,
        dash: [6, 4],
        points: { show: true, size: 7, fill: '#e07b00' },
      });
      data.push(points.map((f) => (f.anchor ? f.anchor.median : null)));
    }
    const opts = {
      width: 560,
      height: 240,
      series,
      scales: {
        x: log ? { time: false, distr: 3, log: 2 } : { time: false },
        y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.15 : 1] },
      },
      axes: [
        { splits: () => xs, label: g.sweep.key, size: 50 },
        { label: unit, size: 70 },
      ],
    };
    return new uPlot(opts, data, box);
  }

  function label(run) {
    const r = runs[run];
    return r ? `${r.commit.slice(0, 7)}` : '';
  }

  // Self-check for the headless test: non-transparent pixels per chart canvas.
  requestAnimationFrame(() =>
    requestAnimationFrame(() => {
      const counts = [];
      for (const canvas of document.querySelectorAll('.chart canvas')) {
        const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        let n = 0;
        for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) n++;
        counts.push(n);
      }
      document.body.setAttribute('data-charts', String(plots.length));
      document.body.setAttribute('data-sweeps', String(sweeps.length));
      document.body.setAttribute('data-drawn', JSON.stringify(counts));
    }),
  );
})();
