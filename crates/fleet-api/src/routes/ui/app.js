// fleet's dashboard: plain DOM, no framework, no markup from data. Every name, value and
// line from the cluster is written with textContent or an attribute, never as HTML.
'use strict';

const WRITE_HEADERS = { 'X-Fleet-CSRF': '1', 'Content-Type': 'application/json' };
const ui = { page: 0, filter: '', role: 'none', here: null, route: null, journal: null, pending: null, confirm: null, errorFrom: null };

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'text') e.textContent = v;
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(typeof c === 'string' ? document.createTextNode(c) : c);
  }
  return e;
}

const enc = encodeURIComponent;

async function errorOf(r) {
  try {
    const body = await r.json();
    return `${r.status}: ${body.error.message}`;
  } catch (_) {
    return `${r.status} ${r.statusText}`;
  }
}

async function getJSON(path) {
  const r = await fetch(path, { headers: { Accept: 'application/json' } });
  if (!r.ok) throw new Error(await errorOf(r));
  return r.json();
}

async function write(method, path, body) {
  const init = { method, headers: WRITE_HEADERS };
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await fetch(path, init);
  if (!r.ok) throw new Error(await errorOf(r));
}

// An action's error stays until the next action; a read's until the next read succeeds.
function showError(e, from) {
  const box = $('error');
  if (!e && from === 'read' && ui.errorFrom === 'action') return;
  box.textContent = e ? String(e.message || e) : '';
  box.hidden = !e;
  ui.errorFrom = e ? from : null;
}

function mayAct() { return ui.role === 'operator' || ui.role === 'admin'; }

// An action asks first, in the page (no window.confirm): `what` says what it does.
function ask(what, act) {
  $('confirm-text').textContent = what;
  $('confirm').hidden = false;
  ui.confirm = act;
}

function answer(yes) {
  const act = ui.confirm;
  ui.confirm = null;
  $('confirm').hidden = true;
  if (yes && act) {
    act().then(() => { showError(null, 'action'); refresh(); }, (e) => showError(e, 'action'));
  }
}

function button(label, what, act) {
  const b = el('button', { type: 'button', 'data-action': label.toLowerCase(), text: label });
  b.addEventListener('click', () => ask(what, act));
  return b;
}

function route() {
  const h = location.hash || '#/';
  if (h.startsWith('#/unit/')) return { kind: 'unit', name: decodeURIComponent(h.slice(7)) };
  if (h.startsWith('#/machine/')) return { kind: 'machine', id: decodeURIComponent(h.slice(10)) };
  return { kind: 'cluster' };
}

function showCounts(c) {
  const box = $('counts');
  box.replaceChildren(
    el('span', { id: 'count-machines', text: `${c.machines} machines` }),
    el('span', { id: 'count-units', text: `${c.units} units` }),
    el('span', { id: 'count-active', class: 'chip shade-active', text: `active ${c.active}` }),
    el('span', { id: 'count-activating', class: 'chip shade-activating', text: `activating ${c.activating}` }),
    el('span', { id: 'count-failed', class: 'chip shade-failed', text: `failed ${c.failed}` }),
    el('span', { id: 'count-inactive', class: 'chip shade-inactive', text: `inactive ${c.inactive}` }),
    el('span', { id: 'count-unscheduled', text: `unscheduled ${c.unscheduled}` }),
  );
}

function chip(u) {
  return el('a', {
    class: `chip shade-${u.shade}`,
    href: `#/unit/${enc(u.name)}`,
    'data-unit': u.name,
    title: u.active ? `${u.active} (${u.sub}), desired ${u.desired}` : `no state published, desired ${u.desired}`,
    text: u.name,
  });
}

function metadataText(metadata) {
  return Object.entries(metadata).map(([k, v]) => `${k}=${v}`).join(', ');
}

function card(m) {
  const head = el('div', { class: 'head' },
    el('a', { class: 'id', href: `#/machine/${enc(m.id)}`, text: m.id.slice(0, 12) }),
    el('span', {},
      m.leader ? el('span', { class: 'badge leader', text: 'leader' }) : null,
      m.drained ? el('span', { class: 'badge drained', text: 'drained' }) : null));
  const meta = el('div', { class: 'meta', text: [m.ip, metadataText(m.metadata)].filter((s) => s).join(' · ') });
  return el('div', { class: 'card', 'data-machine': m.id }, head, meta,
    el('div', { class: 'chips' }, ...m.units.map(chip)));
}

function pager(o) {
  if (o.pages <= 1) return null;
  const prev = el('button', { type: 'button', text: 'previous' });
  const next = el('button', { type: 'button', text: 'next' });
  prev.disabled = o.page === 0;
  next.disabled = o.page + 1 >= o.pages;
  prev.addEventListener('click', () => { ui.page = o.page - 1; refresh(); });
  next.addEventListener('click', () => { ui.page = o.page + 1; refresh(); });
  return el('div', { class: 'pager' }, prev, el('span', { text: `page ${o.page + 1} of ${o.pages}` }), next);
}

async function overview(filter, perPage) {
  const q = new URLSearchParams({ page: String(ui.page), perPage: String(perPage), filter });
  const o = await getJSON(`/ui/api/overview?${q}`);
  ui.role = o.role;
  ui.here = o.here;
  showCounts(o.counts);
  return o;
}

async function renderCluster() {
  const o = await overview(ui.filter, 50);
  const parts = [
    el('h2', { text: `Machines (${o.matched})` }),
    pager(o),
    el('div', { class: 'grid', id: 'machines' }, ...o.machines.map(card)),
  ];
  if (o.unscheduled.length) {
    const rows = o.unscheduled.map((u) => el('tr', { 'data-unscheduled': u.name },
      el('td', {}, el('a', { href: `#/unit/${enc(u.name)}`, text: u.name })),
      el('td', { text: u.reason || 'not placed yet' })));
    parts.push(el('h2', { text: `Unscheduled (${o.counts.unscheduled})` }),
      el('table', { id: 'unscheduled' }, el('tr', {}, el('th', { text: 'unit' }), el('th', { text: 'why' })), ...rows));
  }
  $('view').replaceChildren(...parts.filter((p) => p));
}

function fileText(options) {
  const sections = new Map();
  for (const o of options) {
    if (!sections.has(o.section)) sections.set(o.section, []);
    sections.get(o.section).push(`${o.name}=${o.value}`);
  }
  return [...sections].map(([s, lines]) => `[${s}]\n${lines.join('\n')}`).join('\n\n');
}

async function unitParts(name) {
  const u = await getJSON(`/fleet/v1/units/${enc(name)}`);
  const states = (await getJSON(`/fleet/v1/state?unitName=${enc(name)}`)).states || [];
  let why = '';
  try { why = (await getJSON(`/fleet/v1/explain/${enc(name)}`)).summary || ''; } catch (e) { why = String(e.message); }
  await overview('', 1);
  const summary = el('p', { id: 'unit-summary' },
    `desired ${u.desiredState}, current ${u.currentState}`,
    u.machineID ? ` on ${u.machineID}` : ', on no machine');
  const rows = states.map((s) => el('tr', { 'data-state-machine': s.machineID },
    el('td', {}, el('a', { href: `#/machine/${enc(s.machineID)}`, text: s.machineID.slice(0, 12) })),
    el('td', { text: s.systemdLoadState }), el('td', { text: s.systemdActiveState }),
    el('td', { class: `shade-text-${s.systemdActiveState}`, text: s.systemdSubState })));
  const actions = mayAct() ? el('div', { class: 'actions', id: 'actions' },
    button('Start', `Start ${name}?`, () => write('PUT', `/fleet/v1/units/${enc(name)}`, { desiredState: 'launched' })),
    button('Stop', `Stop ${name}?`, () => write('PUT', `/fleet/v1/units/${enc(name)}`, { desiredState: 'loaded' })),
    button('Destroy', `Destroy ${name}? Its file and state are removed everywhere.`,
      () => write('DELETE', `/fleet/v1/units/${enc(name)}`).then(() => { location.hash = '#/'; })),
  ) : null;
  return [summary, actions,
    el('h2', { text: 'Where it runs' }),
    el('table', { id: 'unit-states' }, el('tr', {}, el('th', { text: 'machine' }), el('th', { text: 'load' }),
      el('th', { text: 'active' }), el('th', { text: 'sub' })), ...rows),
    el('h2', { text: 'Why' }), el('p', { id: 'unit-why', text: why }),
    el('h2', { text: 'Unit file' }), el('pre', { id: 'unit-file', text: fileText(u.options || []) })];
}

async function followJournal(name, pre) {
  if (ui.journal) ui.journal.abort();
  const ctl = new AbortController();
  ui.journal = ctl;
  try {
    const r = await fetch(`/fleet/v1/units/${enc(name)}/journal?lines=50&follow=true`, { signal: ctl.signal });
    if (!r.ok) { pre.textContent = await errorOf(r); return; }
    const reader = r.body.getReader();
    const text = new TextDecoder();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      pre.textContent += text.decode(value, { stream: true });
      pre.scrollTop = pre.scrollHeight;
    }
  } catch (e) {
    if (e.name !== 'AbortError') pre.textContent += `\n${e.message}`;
  }
}

async function renderUnit(name, fresh) {
  const parts = await unitParts(name);
  if (fresh) {
    const journal = el('pre', { id: 'unit-journal' });
    $('view').replaceChildren(el('h2', { id: 'unit-name', text: name }), el('div', { id: 'unit-live' }, ...parts.filter((p) => p)),
      el('h2', { text: 'Journal' }), journal);
    const on = (await getJSON(`/fleet/v1/units/${enc(name)}`)).machineID;
    if (on && on === ui.here) followJournal(name, journal);
    else journal.textContent = on
      ? `The journal is streamed by the fleetd of machine ${on}: open the dashboard on its API (fleetctl ui), or fleetctl journal ${name}.`
      : 'The unit runs on no machine.';
  } else {
    $('unit-live').replaceChildren(...parts.filter((p) => p));
  }
}

async function renderMachine(id) {
  const o = await overview(id.toLowerCase(), 200);
  const m = o.machines.find((c) => c.id === id);
  if (!m) throw new Error(`machine ${id} is not registered`);
  const meta = Object.entries(m.metadata).map(([k, v]) => el('tr', {}, el('td', { text: k }), el('td', { text: v })));
  const actions = mayAct() ? el('div', { class: 'actions', id: 'actions' }, m.drained
    ? button('Undrain', `Undrain ${id}? It takes new units again.`, () => write('DELETE', `/fleet/v1/drains/${enc(id)}`))
    : button('Drain', `Drain ${id}? Its units move elsewhere.`, () => write('PUT', `/fleet/v1/drains/${enc(id)}`))) : null;
  $('view').replaceChildren(el('h2', { id: 'machine-id', text: id }),
    el('p', { text: [m.ip, m.leader ? 'engine leader' : '', m.drained ? 'drained' : ''].filter((s) => s).join(' · ') }),
    actions,
    el('h2', { text: 'Metadata' }), el('table', { id: 'machine-metadata' }, ...meta),
    el('h2', { text: `Units (${m.units.length})` }), el('div', { class: 'chips', id: 'machine-units' }, ...m.units.map(chip)));
}

async function refresh() {
  const r = route();
  const fresh = JSON.stringify(r) !== JSON.stringify(ui.route);
  if (fresh && ui.journal) { ui.journal.abort(); ui.journal = null; }
  // A new page shows nothing of the last one while it loads (no action on the wrong unit).
  if (fresh) $('view').replaceChildren(el('p', { class: 'muted', text: 'loading' }));
  ui.route = r;
  try {
    if (r.kind === 'unit') await renderUnit(r.name, fresh);
    else if (r.kind === 'machine') await renderMachine(r.id);
    else await renderCluster();
    showError(null, 'read');
  } catch (e) {
    showError(e, 'read');
  }
}

function soon() {
  if (ui.pending) return;
  ui.pending = setTimeout(() => { ui.pending = null; refresh(); }, 50);
}

function live() {
  const stream = new EventSource('/ui/api/changes');
  stream.addEventListener('change', soon);
  stream.addEventListener('open', () => { $('live').textContent = 'live'; });
  stream.addEventListener('error', () => { $('live').textContent = 'reconnecting'; });
}

document.addEventListener('DOMContentLoaded', () => {
  let typing = null;
  $('filter').addEventListener('input', (e) => {
    clearTimeout(typing);
    typing = setTimeout(() => { ui.filter = e.target.value; ui.page = 0; location.hash = '#/'; refresh(); }, 250);
  });
  $('confirm-yes').addEventListener('click', () => answer(true));
  $('confirm-no').addEventListener('click', () => answer(false));
  window.addEventListener('hashchange', refresh);
  refresh();
  live();
});
