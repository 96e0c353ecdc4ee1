// fleet's dashboard: plain DOM, no framework, no markup from data. Every name, value and
// line from the cluster is written with textContent or an attribute, never as HTML.
'use strict';

const WRITE_HEADERS = { 'X-Fleet-CSRF': '1', 'Content-Type': 'application/json' };
const ui = { page: 0, filter: '', role: 'none', here: null, route: null, streams: [], busy: false, again: false, pending: null, confirm: null, errorFrom: null };
// The event kinds of `fleetctl events` (fleet-registry's EventKind), for the events page's filter.
const KINDS = ['submitted', 'desired-changed', 'replaced', 'restart-requested', 'destroyed', 'drained',
  'undrained', 'metadata-set', 'scheduled', 'unscheduled', 'moved', 'unschedulable', 'reschedule-held',
  'reschedule-resumed', 'started', 'active', 'failed', 'restarted-by-systemd', 'stopped', 'removed'];
// The most event rows a table keeps (the oldest go first): a busy cluster's hour of events
// would otherwise grow the page without end.
const MAX_EVENT_ROWS = 500;

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
  if (h === '#/events' || h.startsWith('#/events?')) {
    const q = new URLSearchParams(h.slice(9));
    return { kind: 'events', unit: q.get('unit') || '', machine: q.get('machine') || '', type: q.get('kind') || '', since: q.get('since') || '15m' };
  }
  return { kind: 'cluster' };
}

// Streams of the page shown (journal, events): aborted when another page is shown.
function held() {
  const ctl = new AbortController();
  ui.streams.push(ctl);
  return ctl.signal;
}

function dropStreams() {
  for (const ctl of ui.streams) ctl.abort();
  ui.streams = [];
}

// Reads the held response at `path`, one JSON entity a line, until `signal` aborts.
async function followLines(path, signal, each) {
  const r = await fetch(path, { signal, headers: { Accept: 'application/x-ndjson' } });
  if (!r.ok) throw new Error(await errorOf(r));
  const reader = r.body.getReader();
  const text = new TextDecoder();
  let rest = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    rest += text.decode(value, { stream: true });
    const lines = rest.split('\n');
    rest = lines.pop();
    for (const line of lines) if (line.trim()) each(JSON.parse(line));
  }
}

function shortTime(t) { return t ? t.replace('T', ' ').replace(/\.\d+Z$/, 'Z') : ''; }

function machineLink(id) { return el('a', { href: `#/machine/${enc(id)}`, text: id.slice(0, 12) }); }

function eventRow(e) {
  const unit = e.unit ? el('a', { href: `#/unit/${enc(e.unit)}`, text: e.unit }) : null;
  const where = e.machine ? machineLink(e.machine) : null;
  const place = e.from ? el('span', {}, machineLink(e.from), ' → ', where) : where;
  return el('tr', { class: 'event', 'data-kind': e.kind, 'data-event-unit': e.unit || '' },
    el('td', { class: 'time', title: e.time, text: shortTime(e.time) }),
    el('td', {}, el('span', { class: `kind kind-${e.kind}`, text: e.kind })),
    el('td', {}, unit), el('td', {}, place),
    el('td', { text: e.reason || '' }),
    el('td', { class: 'muted', text: e.who || e.source || '' }));
}

// The events `query` matches (unit, machine, since), oldest first as `fleetctl events` prints
// them, then each new one as it is written: one held request (the API sends the page, then
// follows etcd's watch), so none falls between a read and a stream. `keep` filters more.
function eventLog(id, query, keep) {
  const rows = el('tbody');
  const head = el('tr', {}, ...['time', 'kind', 'unit', 'machine', 'reason', 'who'].map((h) => el('th', { text: h })));
  const box = el('div', { class: 'event-box' }, el('table', { id, class: 'events' }, el('thead', {}, head), rows));
  const note = el('p', { class: 'muted', id: `${id}-note`, text: 'no events yet' });
  const q = new URLSearchParams(Object.entries(query).filter(([, v]) => v));
  q.set('follow', 'true');
  followLines(`/fleet/v1/events?${q}`, held(), (e) => {
    if (keep && !keep(e)) return;
    const bottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    rows.append(eventRow(e));
    while (rows.rows.length > MAX_EVENT_ROWS) rows.deleteRow(0);
    note.hidden = true;
    if (bottom) box.scrollTop = box.scrollHeight;
  }).then(() => { note.hidden = false; note.textContent = 'the event stream ended: reload to follow again'; },
    (e) => { if (e.name !== 'AbortError') { note.hidden = false; note.textContent = String(e.message); } });
  return el('div', { class: 'event-log' }, note, box);
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
  $('role').textContent = o.role;
  $('role').title = `this client's role: ${o.role}`;
  showCounts(o.counts);
  return o;
}

async function renderCluster() {
  const o = await overview(ui.filter, 50);
  const parts = [
    el('p', { class: 'links' }, el('a', { id: 'to-events', href: '#/events', text: 'the cluster\'s events, live \u2192' })),
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

function present(v) { return v !== undefined && v !== null && v !== ''; }

function ago(t) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(t)) / 1000));
  if (Number.isNaN(s)) return '';
  if (s < 120) return `${s}s ago`;
  if (s < 7200) return `${Math.round(s / 60)}m ago`;
  return `${Math.round(s / 3600)}h ago`;
}

// The per-machine states of a unit; restarts, since and the last exit only where some
// machine published them (older fleetds do not).
function statesTable(states) {
  const extra = [['restarts', 'restarts'], ['since', 'since'], ['exit', 'last exit']]
    .filter(([k]) => states.some((s) => present(s[k])));
  const cell = (s, k) => {
    if (!present(s[k])) return el('td', { class: `state-${k}` });
    const text = k === 'since' ? `${shortTime(s.since)} (${ago(s.since)})` : String(s[k]);
    return el('td', { class: `state-${k}`, text });
  };
  const rows = states.map((s) => el('tr', { 'data-state-machine': s.machineID },
    el('td', {}, machineLink(s.machineID)),
    el('td', { text: s.systemdLoadState }), el('td', { text: s.systemdActiveState }),
    el('td', { class: `shade-text-${s.systemdActiveState}`, text: s.systemdSubState }),
    ...extra.map(([k]) => cell(s, k))));
  const head = ['machine', 'load', 'active', 'sub', ...extra.map(([, h]) => h)];
  return el('table', { id: 'unit-states' }, el('tr', {}, ...head.map((h) => el('th', { text: h }))), ...rows);
}

async function unitParts(name) {
  const u = await getJSON(`/fleet/v1/units/${enc(name)}`);
  const states = (await getJSON(`/fleet/v1/state?unitName=${enc(name)}&view=full`)).states || [];
  let why = '';
  try { why = (await getJSON(`/fleet/v1/explain/${enc(name)}`)).summary || ''; } catch (e) { why = String(e.message); }
  await overview('', 1);
  const summary = el('p', { id: 'unit-summary' },
    `desired ${u.desiredState}, current ${u.currentState}`,
    u.machineID ? ` on ${u.machineID}` : ', on no machine');
  const actions = mayAct() ? el('div', { class: 'actions', id: 'actions' },
    button('Start', `Start ${name}?`, () => write('PUT', `/fleet/v1/units/${enc(name)}`, { desiredState: 'launched' })),
    button('Stop', `Stop ${name}?`, () => write('PUT', `/fleet/v1/units/${enc(name)}`, { desiredState: 'loaded' })),
    button('Destroy', `Destroy ${name}? Its file and state are removed everywhere.`,
      () => write('DELETE', `/fleet/v1/units/${enc(name)}`).then(() => { location.hash = '#/'; })),
  ) : null;
  const live = [summary, actions, el('h2', { text: 'Where it runs' }), statesTable(states),
    el('h2', { text: 'Why' }), el('p', { id: 'unit-why', text: why })];
  const file = [el('h2', { text: 'Unit file' }), el('pre', { id: 'unit-file', text: fileText(u.options || []) })];
  return { live, file, on: u.machineID };
}

async function followJournal(name, pre) {
  try {
    const r = await fetch(`/fleet/v1/units/${enc(name)}/journal?lines=50&follow=true`, { signal: held() });
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

// The journal is streamed by the fleetd of the unit's machine: followed once the unit is
// placed here (it may be placed after its page opened), else the page says where to look.
function journalOf(name, on) {
  const pre = $('unit-journal');
  if (!pre || pre.dataset.following) return;
  if (on && on === ui.here) {
    pre.dataset.following = 'yes';
    pre.textContent = '';
    followJournal(name, pre);
  } else {
    pre.textContent = on
      ? `The journal is streamed by the fleetd of machine ${on}: open the dashboard on its API (fleetctl ui), or fleetctl journal ${name}.`
      : 'The unit runs on no machine.';
  }
}

// A fresh unit page starts its history's stream; a change re-reads the rest.
async function renderUnit(name, fresh) {
  const parts = await unitParts(name);
  const keep = (xs) => xs.filter((p) => p);
  if (fresh) {
    $('view').replaceChildren(el('h2', { id: 'unit-name', text: name }),
      el('div', { id: 'unit-live' }, ...keep(parts.live)),
      el('h2', { text: 'History' }), eventLog('unit-events', { unit: name }),
      el('h2', { text: 'Journal' }), el('pre', { id: 'unit-journal' }),
      el('div', { id: 'unit-file-live' }, ...parts.file));
  } else {
    $('unit-live').replaceChildren(...keep(parts.live));
    $('unit-file-live').replaceChildren(...parts.file);
  }
  journalOf(name, parts.on);
}

async function machineParts(id) {
  const o = await overview(id.toLowerCase(), 200);
  const m = o.machines.find((c) => c.id === id);
  if (!m) throw new Error(`machine ${id} is not registered`);
  const meta = Object.entries(m.metadata).map(([k, v]) => el('tr', {}, el('td', { text: k }), el('td', { text: v })));
  const actions = mayAct() ? el('div', { class: 'actions', id: 'actions' }, m.drained
    ? button('Undrain', `Undrain ${id}? It takes new units again.`, () => write('DELETE', `/fleet/v1/drains/${enc(id)}`))
    : button('Drain', `Drain ${id}? Its units move elsewhere.`, () => write('PUT', `/fleet/v1/drains/${enc(id)}`))) : null;
  return [el('p', { text: [m.ip, m.leader ? 'engine leader' : '', m.drained ? 'drained' : ''].filter((s) => s).join(' · ') }),
    actions,
    el('h2', { text: 'Metadata' }), el('table', { id: 'machine-metadata' }, ...meta),
    el('h2', { text: `Units (${m.units.length})` }), el('div', { class: 'chips', id: 'machine-units' }, ...m.units.map(chip))]
    .filter((p) => p);
}

// A fresh machine page starts the stream of its events; a change re-reads the rest.
async function renderMachine(id, fresh) {
  const parts = await machineParts(id);
  if (!fresh) {
    $('machine-live').replaceChildren(...parts);
    return;
  }
  $('view').replaceChildren(el('h2', { id: 'machine-id', text: id }),
    el('div', { id: 'machine-live' }, ...parts),
    el('h2', {}, 'Events ', el('a', { class: 'small', href: `#/events?machine=${enc(id)}`, text: 'filter all events' })),
    eventLog('machine-events', { machine: id }));
}

function eventFilters(r) {
  const input = (name, value, hint) => el('input', { id: `events-${name}`, name, value, placeholder: hint, autocomplete: 'off' });
  const kind = el('select', { id: 'events-kind', name: 'kind' }, el('option', { value: '', text: 'every kind' }),
    ...KINDS.map((k) => el('option', { value: k, text: k })));
  kind.value = r.type;
  const since = el('select', { id: 'events-since', name: 'since' },
    ...['5m', '15m', '1h', '24h'].map((v) => el('option', { value: v, text: `last ${v}` })));
  since.value = r.since;
  const form = el('form', { class: 'filters', id: 'events-filters' },
    input('unit', r.unit, 'unit'), input('machine', r.machine, 'machine ID'), kind, since,
    el('button', { type: 'submit', text: 'Follow' }));
  const go = (e) => {
    if (e) e.preventDefault();
    const q = new URLSearchParams();
    for (const f of ['unit', 'machine', 'kind', 'since']) {
      const v = form.elements[f].value.trim();
      if (v && !(f === 'since' && v === '15m')) q.set(f, v);
    }
    const s = q.toString();
    location.hash = s ? `#/events?${s}` : '#/events';
  };
  form.addEventListener('submit', go);
  kind.addEventListener('change', () => go());
  since.addEventListener('change', () => go());
  return form;
}

// The cluster's events, live: unit, machine and since are the API's filters (a new stream
// each), the kind is the page's.
async function renderEvents(r, fresh) {
  await overview('', 1);
  if (!fresh) return;
  const keep = r.type ? (e) => e.kind === r.type : null;
  $('view').replaceChildren(el('h2', { id: 'events-title', text: 'Events' }), eventFilters(r),
    eventLog('events', { unit: r.unit, machine: r.machine, since: r.since }, keep));
}

// One render at a time: a change or a new page while one runs renders again after it, so
// that a page's streams are started once and its live parts exist when re-read.
async function refresh() {
  if (ui.busy) { ui.again = true; return; }
  ui.busy = true;
  try {
    do {
      ui.again = false;
      await render();
    } while (ui.again);
  } finally {
    ui.busy = false;
  }
}

async function render() {
  const r = route();
  const fresh = JSON.stringify(r) !== JSON.stringify(ui.route);
  if (fresh) dropStreams();
  // A new page shows nothing of the last one while it loads (no action on the wrong unit).
  if (fresh) $('view').replaceChildren(el('p', { class: 'muted', text: 'loading' }));
  ui.route = r;
  try {
    if (r.kind === 'unit') await renderUnit(r.name, fresh);
    else if (r.kind === 'machine') await renderMachine(r.id, fresh);
    else if (r.kind === 'events') await renderEvents(r, fresh);
    else await renderCluster();
    showError(null, 'read');
  } catch (e) {
    // A page that could not be shown is shown afresh by the next render.
    if (fresh) ui.route = null;
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
