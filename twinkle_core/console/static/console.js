// twinkle console: fills the server-rendered page from its JSON endpoints (named by <main data-*>), polling every
// few seconds. Text is only ever written with textContent: nothing from the data is parsed as HTML.
(function () {
  'use strict';
  const main = document.querySelector('main');
  if (!main) return;
  const data = main.dataset;
  const csrfMeta = document.querySelector('meta[name="csrf-token"]');
  const csrf = csrfMeta ? csrfMeta.content : '';
  const POLL_MS = Number(data.pollMs || 3000);
  const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#ca8a04', '#db2777'];

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => {
      if (v === null || v === undefined || v === false) return;
      if (k === 'text') e.textContent = String(v);
      else e.setAttribute(k, v === true ? '' : String(v));
    });
    (children || []).forEach((c) => e.append(c instanceof Node ? c : document.createTextNode(String(c))));
    return e;
  }

  function fmt(key, value) {
    if (value === null || value === undefined || value === '') return '–';
    if ((key === 'created' || key === 'updated' || key === 'finished') && typeof value === 'number') {
      return new Date(value * 1000).toLocaleString();
    }
    if (key === 'size' && typeof value === 'number') {
      const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
      let n = value, i = 0;
      while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
      return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
    }
    if (typeof value === 'number' && !Number.isInteger(value)) return value.toPrecision(4);
    return String(value);
  }

  async function getJSON(url) {
    const r = await fetch(url, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
    if (r.status === 401 && data.signin) { window.location.assign(data.signin); throw new Error('signed out'); }
    if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
    return r.json();
  }

  async function postJSON(url, body) {
    const r = await fetch(url, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json', 'X-CSRF-Token': csrf },
      body: JSON.stringify(body || {}),
    });
    const answer = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(answer.error || answer.detail || `HTTP ${r.status}`);
    return answer;
  }

  function status(message, isError) {
    let box = document.getElementById('status');
    if (!box) { box = el('p', { id: 'status', role: 'status' }); main.insertBefore(box, main.children[1] || null); }
    box.className = isError ? 'error' : 'ok';
    box.textContent = message;
  }

  function poll(fn) {
    const tick = () => fn().catch((e) => status(String(e.message || e), true)).finally(() => setTimeout(tick, POLL_MS));
    tick();
  }

  // ---- tables ---------------------------------------------------------------------------------------------------
  function fillTable(table, rows, render) {
    const body = table.tBodies[0];
    body.replaceChildren(...rows.map(render));
    if (!rows.length) {
      const cols = table.tHead ? table.tHead.rows[0].cells.length : 1;
      body.append(el('tr', { class: 'empty' }, [el('td', { colspan: cols, text: 'None.' })]));
    }
  }

  function keyedRow(table, row, first) {
    const keys = Array.from(table.tHead.rows[0].cells).map((th) => th.dataset.key).filter(Boolean);
    const tr = el('tr', { 'data-id': row.id });
    if (first) tr.append(first);
    keys.forEach((k) => {
      const value = row[k];
      if (k === 'name' && row.url) tr.append(el('td', {}, [el('a', { href: row.url, class: 'run-link', text: fmt(k, value) })]));
      else tr.append(el('td', { class: `col-${k}`, text: fmt(k, value) }));
    });
    return tr;
  }

  // ---- curves ---------------------------------------------------------------------------------------------------
  function smooth(values, weight) {
    if (!weight) return values;
    let last = 0, n = 0;
    return values.map((v) => {
      if (v === null || !Number.isFinite(v)) return null;
      last = last * weight + (1 - weight) * v; n += 1;
      return last / (1 - Math.pow(weight, n)); // debiased, as TensorBoard does
    });
  }

  function tick(v) {
    if (v === null || v === undefined) return '';
    if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e6)) return v.toExponential(0);
    return String(+v.toPrecision(4));
  }

  function logRange(u, min, max) {
    if (min === null || max === null) return [1, 10];
    if (!(max > min * 1.001)) return [min / 10, max * 10]; // a constant (a fixed learning rate) still shows
    return uPlot.rangeLog(min, max, 10, true);
  }

  function Curves(container) {
    const smoothing = document.getElementById('smoothing');
    const smoothingValue = document.getElementById('smoothing-value');
    const logscale = document.getElementById('logscale');
    let current = {}; let drawn = '';
    const redraw = () => { drawn = ''; draw(current); };
    if (smoothing) smoothing.addEventListener('input', () => { smoothingValue.textContent = smoothing.value; redraw(); });
    if (logscale) logscale.addEventListener('change', redraw);

    function draw(byRun) {
      current = byRun;
      const key = JSON.stringify(byRun);
      if (key === drawn) return;
      drawn = key;
      const names = new Set();
      Object.values(byRun).forEach((series) => Object.keys(series).forEach((m) => names.add(m)));
      container.replaceChildren();
      if (!names.size) { container.append(el('p', { class: 'empty', text: 'No metrics yet.' })); return; }
      const weight = smoothing ? Number(smoothing.value) : 0;
      const log = logscale && logscale.checked;
      const runs = Object.keys(byRun);
      // `<m>_low` / `<m>_high` next to `<m>` (an evaluation's interval, twinkle_core.eval): drawn as dashed lines
      // in <m>'s chart, not as charts of their own
      const bandOf = (m) => (m.endsWith('_low') ? m.slice(0, -4) : m.endsWith('_high') ? m.slice(0, -5) : null);
      Array.from(names).sort().filter((m) => !names.has(bandOf(m))).forEach((metric) => {
        const present = runs.filter((r) => byRun[r][metric]);
        const lines = [];  // [run index, label, [xs, ys], dashed]
        present.forEach((r, i) => {
          lines.push([i, r, byRun[r][metric], false]);
          ['_low', '_high'].forEach((end) => {
            if (byRun[r][metric + end]) lines.push([i, `${r} ${end.slice(1)}`, byRun[r][metric + end], true]);
          });
        });
        const tables = lines.map(([, , [xs, ys], dashed]) => {
          const shown = ys.map((y) => (log && !(y > 0) ? null : y));
          return [xs, dashed ? shown : smooth(shown, weight)];
        });
        const points = present.map((r) => byRun[r][metric][0].length);
        const banded = lines.some((line) => line[3]);
        const box = el('div', {
          class: 'chart', 'data-metric': metric, 'data-points': points.join(','), 'data-interval': String(banded),
        }, [
          el('h3', { text: metric }),
          el('p', {
            class: 'points',
            text: present.map((r, i) => `${r}: ${points[i]} points`).join(' · ') + (banded ? ' · dashed: 95% interval' : ''),
          }),
        ]);
        container.append(box);
        if (typeof uPlot === 'undefined') return;
        const joined = tables.length === 1 ? tables[0] : uPlot.join(tables);
        const series = [{ label: 'step' }].concat(lines.map(([i, label, , dashed]) => ({
          label, stroke: COLORS[i % COLORS.length], width: dashed ? 1 : 2, dash: dashed ? [4, 4] : undefined,
          spanGaps: true, points: { show: points[i] < 60 },
        })));
        const width = Math.max(300, (box.clientWidth || 400) - 24);
        new uPlot({
          width, height: 240, series,
          scales: { x: { time: false }, y: log ? { distr: 3, range: logRange } : {} },
          axes: [{ label: 'step' }, { values: (u, vals) => vals.map(tick) }],
        }, joined, box);
      });
    }
    return { draw };
  }

  // ---- page kinds -----------------------------------------------------------------------------------------------
  function runsPage() {
    const table = document.getElementById('runs');
    const curves = Curves(document.getElementById('charts'));
    const chosen = new Map(); // run id -> plotted?
    let runs = [];
    table.addEventListener('change', (e) => {
      if (e.target.matches('input.plot')) { chosen.set(e.target.value, e.target.checked); refreshCurves(); }
    });
    async function refreshCurves() {
      const ids = runs.filter((r) => chosen.get(r.id)).map((r) => r.id);
      const byRun = {};
      await Promise.all(ids.map(async (id) => {
        const answer = await getJSON(data.metricsUrl.replace('{run}', encodeURIComponent(id)));
        byRun[id] = answer.series;
      }));
      curves.draw(byRun);
    }
    poll(async () => {
      runs = (await getJSON(data.runsUrl)).runs;
      runs.forEach((r, i) => { if (!chosen.has(r.id)) chosen.set(r.id, i < 8); });
      fillTable(table, runs, (r) => keyedRow(table, r, el('td', {}, [
        el('input', { type: 'checkbox', class: 'plot', value: r.id, checked: chosen.get(r.id), 'aria-label': `plot ${r.id}` }),
      ])));
      await refreshCurves();
    });
  }

  function actionCell(row) {
    const cell = el('td', { class: 'actions' });
    if (row.download_url) cell.append(el('a', { href: row.download_url, class: 'download', text: 'Download' }));
    if (row.delete_url) {
      const button = el('button', { type: 'button', class: 'delete', text: 'Delete' });
      button.addEventListener('click', async () => {
        if (!window.confirm(`Delete checkpoint ${row.name}? This cannot be undone.`)) return;
        try { await postJSON(row.delete_url, {}); status(`Deleted ${row.name}.`); await refreshRun(); }
        catch (e) { status(`Delete failed: ${e.message}`, true); }
      });
      cell.append(button);
    }
    return cell;
  }

  let refreshRun = async () => {};
  function runPage() {
    const curves = Curves(document.getElementById('charts'));
    const tables = ['checkpoints', 'samplers', 'futures'].map((id) => document.getElementById(id));
    const facts = document.getElementById('run-facts');
    refreshRun = async () => {
      const answer = await getJSON(data.runUrl);
      facts.replaceChildren(...Object.entries(answer.run).map(([k, v]) => el('div', {}, [
        el('dt', { text: k.replace('_', ' ') }), el('dd', { class: `fact-${k}`, text: fmt(k, v) }),
      ])));
      tables.forEach((t) => fillTable(t, answer[t.id], (row) => {
        const tr = keyedRow(t, row);
        if (t.id === 'checkpoints') tr.append(actionCell(row));
        return tr;
      }));
      const metrics = await getJSON(data.metricsUrl);
      curves.draw({ [answer.run.id]: metrics.series });
    };
    poll(refreshRun);
  }

  function playgroundPage() {
    const form = document.getElementById('playground');
    const select = form.elements.checkpoint;
    const output = document.getElementById('completion');
    const tokens = document.getElementById('tokens');
    getJSON(data.checkpointsUrl).then((answer) => {
      select.replaceChildren(...answer.checkpoints.map((c) => el('option', { value: c.path, text: c.label })));
      if (data.selected) select.value = data.selected;
    }).catch((e) => status(String(e.message || e), true));
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      const button = form.querySelector('button[type="submit"]');
      button.disabled = true; status('Sampling…');
      try {
        const answer = await postJSON(data.sampleUrl, {
          model_path: select.value,
          prompt: form.elements.prompt.value,
          temperature: Number(form.elements.temperature.value),
          max_tokens: Number(form.elements.max_tokens.value),
        });
        output.textContent = answer.text;
        fillTable(tokens, answer.tokens, (t) => el('tr', {}, [
          el('td', { text: t.id }), el('td', { class: 'token-text', text: JSON.stringify(t.text) }), el('td', { text: fmt('', t.logprob) }),
        ]));
        status(`Sampled ${answer.tokens.length} tokens (${answer.stop_reason}).`);
      } catch (err) { status(`Sampling failed: ${err.message}`, true); }
      finally { button.disabled = false; }
    });
  }

  function operatorPage() {
    let previous = null;
    poll(async () => {
      const answer = await getJSON(data.operatorUrl);
      ['models', 'adapters', 'errors', 'gauges'].forEach((id) => {
        const table = document.getElementById(id);
        fillTable(table, answer[id], (row) => keyedRow(table, row));
      });
      const rate = document.getElementById('tokens-rate');
      if (previous && answer.time > previous.time) {
        rate.textContent = `${((answer.tokens_total - previous.tokens_total) / (answer.time - previous.time)).toFixed(1)} tokens/s`;
      } else if (!previous) rate.textContent = `${answer.tokens_total} tokens so far`;
      previous = answer;
    });
  }

  const pages = { runs: runsPage, run: runPage, playground: playgroundPage, operator: operatorPage };
  if (pages[data.page]) pages[data.page]();
})();
