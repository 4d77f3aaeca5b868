// The Leasehold status page: asks this node for /api/status once a second and draws
// the answer. Every name and value from the cluster goes into the page as text
// (textContent), never as markup.
"use strict";

const POLL_INTERVAL_MS = 1000;
const SEARCH_DEBOUNCE_MS = 250;
const TOKEN_KEY = "leasehold-admin-token";
const TABLES = ["locks", "semaphores", "elections", "sessions"];

const state = {
  offsets: { locks: 0, semaphores: 0, elections: 0, sessions: 0 },
  search: "",
  timer: null,
  lastAnswerMs: 0,
  pageRows: 50,
};

const $ = (id) => document.getElementById(id);

function element(tag, text, className) {
  const made = document.createElement(tag);
  if (text !== undefined && text !== null) made.textContent = String(text);
  if (className) made.className = className;
  return made;
}

function cell(row, content, className) {
  const td = element("td", undefined, className);
  if (content instanceof Node) td.appendChild(content);
  else if (content !== undefined && content !== null) td.textContent = String(content);
  row.appendChild(td);
  return td;
}

function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  // "Since" figures compare the leader's stamps with this node's clock: never below 0.
  ms = Math.max(0, ms);
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const seconds = ms / 1000;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const minutes = seconds / 60;
  if (minutes < 60) return `${Math.floor(minutes)} min ${Math.floor(seconds % 60)} s`;
  const hours = minutes / 60;
  if (hours < 48) return `${Math.floor(hours)} h ${Math.floor(minutes % 60)} min`;
  return `${Math.floor(hours / 24)} d ${Math.floor(hours % 24)} h`;
}

// A round trip in microseconds: "0.31 ms", "42 ms".
function roundTripText(us) {
  const ms = us / 1000;
  return ms < 10 ? `${ms.toFixed(2)} ms` : `${Math.round(ms)} ms`;
}

// This node's round trip to a member: the median of the recent ones, the last, and
// how long ago that was measured.
function roundTrip(member) {
  if (member.is_this_node) return "—";
  const trip = member.round_trip;
  if (trip === null || trip === undefined) return "not measured";
  return `${roundTripText(trip.median_us)} (median of ${trip.samples}; last ${roundTripText(trip.last_us)}, ` +
    `${duration(trip.measured_ms_ago)} ago)`;
}

function holderText(holder) {
  return `${holder.client_name} (session ${holder.session})`;
}

function queue(waiters, total) {
  if (total === 0) return element("span", "none", "muted");
  const list = element("ol", undefined, "queue");
  for (const waiter of waiters) {
    const item = element("li", `${waiter.client_name} (session ${waiter.session})`, "waiter");
    item.dataset.session = waiter.session;
    list.appendChild(item);
  }
  if (total > waiters.length) list.appendChild(element("li", `… and ${total - waiters.length} more`, "muted"));
  return list;
}

// A row of the locks, semaphores or elections table, opened with its tenant and name.
function namedRow(kind, item) {
  const row = element("tr", undefined, kind);
  row.dataset.tenant = item.tenant;
  row.dataset.name = item.name;
  cell(row, item.tenant);
  cell(row, item.name, "name");
  return row;
}

function fill(tableId, rows, draw) {
  const body = $(tableId).tBodies[0];
  const drawn = document.createDocumentFragment();
  for (const row of rows) drawn.appendChild(draw(row));
  body.replaceChildren(drawn);
}

function pager(name, table) {
  const box = document.querySelector(`.pager[data-table="${name}"]`);
  const first = table.matched === 0 ? 0 : table.offset + 1;
  const last = table.offset + table.rows.length;
  const searched = table.matched !== table.total ? ` matching, of ${table.total}` : "";
  const text = element("span", `${first}–${last} of ${table.matched}${searched}`);
  const previous = element("button", "Previous");
  previous.type = "button";
  previous.disabled = table.offset === 0;
  previous.onclick = () => move(name, -table.page_rows);
  const next = element("button", "Next");
  next.type = "button";
  next.disabled = last >= table.matched;
  next.onclick = () => move(name, table.page_rows);
  box.replaceChildren(previous, text, next);
  box.hidden = table.matched <= table.page_rows && table.offset === 0;
  $(`${name}-count`).textContent =
    table.matched === table.total ? `(${table.total})` : `(${table.matched} of ${table.total} match)`;
}

function move(name, by) {
  state.offsets[name] = Math.max(0, state.offsets[name] + by);
  poll();
}

function histogram(bounds, waited) {
  if (!waited || waited.count === 0) return element("span", "no acquires yet", "muted");
  const namespace = "http://www.w3.org/2000/svg";
  const width = 8 * (bounds.length + 1);
  const height = 28;
  const svg = document.createElementNS(namespace, "svg");
  svg.setAttribute("class", "histogram");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  // Cumulative counts to one bar per bucket, with the waits above the last bound.
  const counts = waited.cumulative.map((count, i) => count - (i === 0 ? 0 : waited.cumulative[i - 1]));
  counts.push(waited.count - waited.cumulative[waited.cumulative.length - 1]);
  const highest = Math.max(1, ...counts);
  counts.forEach((count, i) => {
    const bar = document.createElementNS(namespace, "rect");
    const barHeight = count === 0 ? 0 : Math.max(2, Math.round((count / highest) * height));
    bar.setAttribute("x", i * 8);
    bar.setAttribute("y", height - barHeight);
    bar.setAttribute("width", 6);
    bar.setAttribute("height", barHeight);
    const title = document.createElementNS(namespace, "title");
    const low = i === 0 ? 0 : bounds[i - 1];
    const range = i < bounds.length ? `${low}–${bounds[i]} s` : `over ${bounds[bounds.length - 1]} s`;
    title.textContent = `${count} acquires waited ${range}`;
    bar.appendChild(title);
    svg.appendChild(bar);
  });
  const box = element("span");
  box.appendChild(svg);
  box.appendChild(element("span", ` ${waited.count} acquires`, "muted"));
  return box;
}

function draw(report) {
  const node = report.node;
  $("cluster-name").textContent = node.cluster_name;
  const leader = node.leader_id === 0 ? "no leader known" : `leader: node ${node.leader_id}`;
  $("node-summary").textContent =
    `node ${node.id} · ${node.state} · term ${node.term} · ${leader} · commit ${node.commit_index} · ` +
    `applied ${node.applied_index} · last log ${node.last_log_index}` + (node.tls ? "" : " · PLAINTEXT");
  const now = report.now_unix_ms;

  fill("members", report.members, (member) => {
    const row = element("tr");
    row.dataset.node = member.id;
    const name = element("span", `node ${member.id}`);
    const who = element("span");
    who.appendChild(name);
    if (member.is_leader) who.appendChild(element("span", " leader", "badge leader"));
    if (member.is_this_node) who.appendChild(element("span", " this node", "badge"));
    cell(row, who);
    cell(row, member.role);
    cell(row, member.client_addr);
    cell(row, member.matched_index ?? "—", "number");
    cell(row, member.lag ?? "—", "number");
    cell(row, member.is_this_node ? "—" : duration(member.last_contact_ms));
    cell(row, roundTrip(member));
    return row;
  });
  const replication = report.replication;
  $("members-note").textContent =
    replication.reported_by === null
      ? `No replication progress: ${replication.problem}.`
      : replication.reported_by === node.id
        ? "Matched index, lag and last contact are this node's, as the leader: what each member acknowledged and when it last answered."
        : `Matched index, lag and last contact as the leader (node ${replication.reported_by}) reports them.`;
  $("members-note").textContent +=
    " Round trips are this node's own: heartbeats when it leads, a probe a second otherwise.";

  fill("tenants", report.tenants, (tenant) => {
    const row = element("tr");
    row.dataset.tenant = tenant.name;
    cell(row, tenant.name);
    // The admin's namespace has no quotas (the largest 32-bit number).
    const of = (used, most) => (most >= 4294967295 ? `${used}` : `${used} / ${most}`);
    cell(row, of(tenant.sessions, tenant.max_sessions), "number");
    cell(row, of(tenant.holds, tenant.max_holds), "number");
    cell(row, tenant.weight, "number");
    cell(row, tenant.max_ops_per_second === 0 ? "none" : `${tenant.max_ops_per_second}/s`, "number");
    cell(row, tenant.admitted, "number");
    cell(row, tenant.refused_early, "number");
    cell(row, tenant.overloaded, "number");
    cell(row, tenant.rate_limited, "number");
    cell(row, tenant.queued, "number");
    return row;
  });

  $("watched-section").hidden = report.watched.length === 0;
  fill("watched", report.watched, (watched) => {
    const row = element("tr");
    row.dataset.watch = watched.watch;
    cell(row, watched.watch);
    cell(row, watched.grants, "number");
    cell(row, watched.last_grant_unix_ms === 0 ? "none since this node started" : `${duration(now - watched.last_grant_unix_ms)} ago`);
    return row;
  });

  fill("locks", report.locks.rows, (lock) => {
    const row = namedRow("lock", lock);
    const holder = lock.holder;
    if (holder.held_back_until_ms !== null && holder.held_back_until_ms !== undefined) {
      const held = element("span", `held back until ${duration(Math.max(0, holder.held_back_until_ms - now))} from now (holder's session expired)`, "badge held-back");
      cell(row, held, "holder");
    } else {
      cell(row, holderText(holder), "holder");
    }
    cell(row, holder.token, "number token");
    cell(row, duration(now - holder.since_ms));
    cell(row, holder.lock_delay_ms ? duration(holder.lock_delay_ms) : "none");
    cell(row, queue(lock.waiters, lock.waiter_count), "waiters");
    return row;
  });
  pager("locks", report.locks);

  fill("semaphores", report.semaphores.rows, (semaphore) => {
    const row = namedRow("semaphore", semaphore);
    const full = semaphore.holder_count >= semaphore.limit;
    cell(row, element("span", `${semaphore.holder_count} of ${semaphore.limit}`, full ? "badge full" : "badge"), "held");
    const holders = element("ol", undefined, "queue");
    for (const holder of semaphore.holders) {
      holders.appendChild(element("li", `${holderText(holder)} · token ${holder.token} · ${duration(now - holder.since_ms)}`, "holder"));
    }
    if (semaphore.holder_count > semaphore.holders.length) {
      holders.appendChild(element("li", `… and ${semaphore.holder_count - semaphore.holders.length} more`, "muted"));
    }
    cell(row, holders);
    cell(row, queue(semaphore.waiters, semaphore.waiter_count), "waiters");
    cell(row, histogram(report.wait_buckets_seconds, semaphore.waited));
    return row;
  });
  pager("semaphores", report.semaphores);

  fill("elections", report.elections.rows, (election) => {
    const row = namedRow("election", election);
    cell(row, holderText(election.leader), "leader");
    cell(row, election.leader.value, "value");
    cell(row, election.leader.token, "number token");
    cell(row, duration(now - election.leader.since_ms));
    cell(row, queue(election.waiters, election.waiter_count), "waiters");
    return row;
  });
  pager("elections", report.elections);

  fill("sessions", report.sessions.rows, (session) => {
    const row = element("tr", undefined, "session");
    row.dataset.session = session.id;
    cell(row, session.id, "number");
    cell(row, session.tenant);
    cell(row, session.client_name, "client");
    cell(row, duration(session.ttl_ms));
    cell(row, session.since_keepalive_ms === null ? "known to the leader" : `≈ ${duration(session.since_keepalive_ms)}`);
    cell(row, session.lease_left_ms === null ? "—" : duration(session.lease_left_ms));
    cell(row, session.holds, "number");
    cell(row, session.waits, "number");
    return row;
  });
  pager("sessions", report.sessions);
}

function showLogin(message) {
  $("status").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("token").focus();
}

async function poll() {
  clearTimeout(state.timer);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) {
    showLogin();
    return;
  }
  const query = new URLSearchParams();
  if (state.search) query.set("q", state.search);
  for (const name of TABLES) if (state.offsets[name]) query.set(name, state.offsets[name]);
  try {
    const answer = await fetch(`/api/status?${query}`, {
      headers: { Authorization: `Bearer ${token}` },
      cache: "no-store",
    });
    if (answer.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin("The node refused that token: it is not the admin credential (or it was rotated).");
      return;
    }
    if (!answer.ok) throw new Error(`${answer.status}: ${(await answer.text()).trim()}`);
    const report = await answer.json();
    $("login").hidden = true;
    $("status").hidden = false;
    draw(report);
    if (!state.lastAnswerMs) performance.mark("leasehold-first-draw");
    state.lastAnswerMs = Date.now();
    $("poll-error").textContent = "";
  } catch (error) {
    $("poll-error").textContent = `The node did not answer: ${error.message}. Showing what it said last.`;
  }
  state.timer = setTimeout(poll, POLL_INTERVAL_MS);
}

function showFreshness() {
  const freshness = $("freshness");
  if (!state.lastAnswerMs) return;
  const age = Date.now() - state.lastAnswerMs;
  freshness.textContent = age < 3 * POLL_INTERVAL_MS ? "live" : `last answer ${duration(age)} ago`;
  freshness.className = age < 3 * POLL_INTERVAL_MS ? "muted" : "stale";
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    poll();
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    clearTimeout(state.timer);
    showLogin();
  });
  let debounce = null;
  $("search").addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => {
      state.search = $("search").value.trim();
      for (const name of TABLES) state.offsets[name] = 0;
      poll();
    }, SEARCH_DEBOUNCE_MS);
  });
  setInterval(showFreshness, POLL_INTERVAL_MS);
  poll();
});
