/* Trajectory board: batches, their progress, and each trajectory's turns as a timeline.
 *
 * Reads only the public API (relative URLs, so a path prefix in front of the gateway works):
 *   GET v1/states                       which states are terminal and which usable (the rule is the API's)
 *   GET v1/batches                      the list, polled
 *   GET v1/batches/{id}                 the selected batch's status, polled while it runs
 *   GET v1/batches/{id}/trajectories    its trajectories (first MAX_ROWS); the running ones polled, with
 *                                       the turns they finished so far
 *   GET v1/batches/{id}/events          SSE, read with fetch (EventSource cannot send a key)
 *   GET v1/trajectories/{id}            a trajectory that just finished, for its turns
 *
 * Every string from the API reaches the DOM as text (el() below); nothing is parsed as HTML.
 */
"use strict";
(() => {
  const KEY_STORE = "rollout-service.board.apiKey";
  const LIST_EVERY_MS = 3000;     // the batch list
  const STATUS_EVERY_MS = 1000;   // the selected batch, while it runs
  const RUNNING_EVERY_MS = 1000;  // which of its trajectories are running (no event for that)
  const MAX_ROWS = 200;           // trajectories shown per batch: the board stays bounded
  const MAX_FETCHES = 4;          // trajectories fetched at once after their events
  const MAX_TEXT = 4000;          // characters shown per message
  const STATES = ["completed", "truncated", "failed", "cancelled", "running", "queued"];  // display order
  let TERMINAL = new Set();  // filled from GET v1/states before anything is shown
  let USABLE = new Set();
  const PHASES = [["queue_s", "queue"], ["prefill_s", "prefill"], ["decode_s", "decode"], ["tool_s", "tool"]];

  const $ = (id) => document.getElementById(id);
  const sleep = (ms, signal) => new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
  });

  /** Build an element. Children and attribute values are always text, never HTML. */
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v == null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "style") Object.assign(node.style, v);
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c != null && c !== false) node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }

  // ---- formatting ----
  function secs(s) {
    if (s == null || !isFinite(s)) return "–";
    if (s < 0.001) return s === 0 ? "0" : "<1 ms";
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 60) return `${Number(s.toFixed(s < 10 ? 2 : 1))} s`;
    return `${Math.floor(s / 60)}m ${String(Math.round(s % 60)).padStart(2, "0")}s`;
  }
  const num = (x, d = 3) => (x == null ? "–" : Number(x.toFixed(d)).toString());
  const ago = (t) => {
    const s = Math.max(0, Date.now() / 1000 - t);
    return s < 60 ? `${Math.round(s)}s ago` : s < 3600 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
  };
  const clip = (s, n) => (s.length > n ? s.slice(0, n) + ` … (${s.length - n} more characters)` : s);
  const done = (b) => STATES.filter((s) => TERMINAL.has(s)).reduce((n, s) => n + (b.counts[s] || 0), 0);
  const turnTotal = (t) => PHASES.reduce((n, [k]) => n + (t.timings[k] || 0), 0);
  const trajTotal = (tr) => tr.turns.reduce((n, t) => n + turnTotal(t), 0);
  const badge = (state) => el("span", { class: `badge s-${state}` }, state);

  // ---- API ----
  let apiKey = localStorage.getItem(KEY_STORE) || "";
  class AuthNeeded extends Error {}
  class HttpError extends Error { constructor(status, msg) { super(msg); this.status = status; } }

  async function api(path, { headers = {}, signal } = {}) {
    const h = { Accept: "application/json", ...headers };
    if (apiKey) h.Authorization = `Bearer ${apiKey}`;
    const res = await fetch(path, { headers: h, signal, cache: "no-store" });
    if (res.status === 401) { needKey(); throw new AuthNeeded("API key needed"); }
    if (!res.ok) {
      let msg = res.statusText;
      try { msg = (await res.json()).error.message; } catch { /* not our error shape */ }
      throw new HttpError(res.status, msg);
    }
    return res;
  }
  const getJSON = async (path, signal) => (await api(path, { signal })).json();
  const enc = encodeURIComponent;

  // ---- header: connection, key, notices ----
  function setConn(state, text) {
    $("conn").dataset.state = state;
    $("conn-text").textContent = text || state;
  }
  function notice(kind, text) {
    const n = $("notice");
    if (!kind) { n.hidden = true; n.textContent = ""; return; }
    n.hidden = false; n.dataset.kind = kind; n.textContent = text;
  }
  function needKey() {
    setConn("key", apiKey ? "key refused" : "API key needed");
    notice("key", apiKey ? "The gateway refused this API key. Paste another one above."
      : "This gateway has auth on. Paste an API key above (it stays in this browser's localStorage).");
  }
  $("keyform").addEventListener("submit", (e) => {
    e.preventDefault();
    apiKey = $("apikey").value.trim();
    $("apikey").value = "";
    $("apikey").blur();
    if (apiKey) localStorage.setItem(KEY_STORE, apiKey); else localStorage.removeItem(KEY_STORE);
    restart();
  });
  $("forget").addEventListener("click", () => { apiKey = ""; localStorage.removeItem(KEY_STORE); restart(); });

  // ---- the batch list ----
  const batches = new Map();  // id -> BatchStatus
  let order = [];             // newest first
  let selected = null;        // id
  let view = null;            // BatchView of the selected batch
  let listAbort = new AbortController();

  async function pollList(signal) {
    while (!signal.aborted) {
      try {
        const list = await getJSON("v1/batches?limit=50", signal);
        order = list.map((b) => b.id);
        for (const b of list) {
          const shown = batches.get(b.id);
          if (shown && done(shown) > done(b)) continue;  // the selected batch's own poll was newer
          batches.set(b.id, b);
          if (view && view.id === b.id) { view.status = b; view.schedule(); }
        }
        notice(null);
        if (!view || !view.reconnecting) setConn("live", "live");
        if (!selected && order.length) select(fromHash() || order[0], false);
        renderList();
      } catch (e) {
        if (e instanceof AuthNeeded) return;
        if (!signal.aborted) { setConn("error", "gateway unreachable"); }
      }
      await sleep(LIST_EVERY_MS, signal);
    }
  }

  function renderList() {
    const ul = $("batch-list");
    $("batch-count").textContent = order.length ? `(${order.length})` : "";
    $("batch-empty").hidden = order.length > 0;
    ul.replaceChildren(...order.map((id) => {
      const b = batches.get(id);
      const n = done(b);
      return el("li", {
        class: "batch-item", "aria-selected": id === selected, dataset: { batchId: id, state: b.state },
        onclick: () => select(id, true),
      },
      el("div", { class: "line" }, el("span", { class: "bid" }, id), badge(b.state)),
      progressBar(b),
      el("div", { class: "line meta" },
        el("span", {}, `${b.env} · ${n} / ${b.num_trajectories}`), el("span", {}, ago(b.created_at))));
    }));
  }

  function progressBar(b) {
    const total = Math.max(b.num_trajectories, 1);
    return el("div", { class: "bar", title: STATES.map((s) => `${s}: ${b.counts[s] || 0}`).join("  ") },
      STATES.filter((s) => s !== "queued" && b.counts[s])
        .map((s) => el("span", { class: `s-${s}`, style: { width: `${(100 * b.counts[s]) / total}%` } })));
  }

  const fromHash = () => (location.hash.startsWith("#batch=") ? decodeURIComponent(location.hash.slice(7)) : null);
  window.addEventListener("hashchange", () => { const id = fromHash(); if (id && id !== selected) select(id, false); });

  function select(id, byUser) {
    if (byUser) history.replaceState(null, "", `#batch=${enc(id)}`);
    if (id === selected) return;
    selected = id;
    if (view) view.stop();
    view = new BatchView(id);
    view.start();
    renderList();
  }

  // ---- one selected batch ----
  class BatchView {
    constructor(id) {
      this.id = id;
      this.status = batches.get(id) || null;
      this.rows = new Map();   // trajectory id -> Trajectory
      this.order = [];
      this.open = new Set();   // expanded rows
      this.dom = new Map();    // trajectory id -> {key, node}
      this.want = new Set();   // trajectories to fetch again
      this.fetching = 0;
      this.reconnecting = false;
      this.abort = new AbortController();
      this.queued = false;
      this.statusSoon = null;
    }

    stop() { this.abort.abort(); }
    get signal() { return this.abort.signal; }
    get running() { return !this.status || !["completed", "cancelled"].includes(this.status.state); }

    async start() {
      this.render();
      try {
        await this.refreshStatus();
        await this.loadRows();
      } catch (e) {
        if (!(e instanceof AuthNeeded) && !this.signal.aborted) this.fail(e);
        return;
      }
      this.stream();
      this.poll();
    }

    fail(e) {
      const detail = $("detail");
      detail.replaceChildren(el("p", { class: "empty" }, e instanceof HttpError && e.status === 404
        ? `No batch ${this.id} (or not visible with this key).` : `Could not load batch ${this.id}: ${e.message}`));
    }

    async refreshStatus() {
      const s = await getJSON(`v1/batches/${enc(this.id)}`, this.signal);
      if (this.signal.aborted) return;
      this.status = s;
      batches.set(s.id, s);
      renderList();
      this.schedule();
    }

    async loadRows() {
      let cursor = 0;
      while (cursor != null && this.order.length < MAX_ROWS && !this.signal.aborted) {
        const limit = Math.min(100, MAX_ROWS - this.order.length);
        const page = await getJSON(`v1/batches/${enc(this.id)}/trajectories?cursor=${cursor}&limit=${limit}`, this.signal);
        for (const t of page.items) { if (!this.rows.has(t.id)) this.order.push(t.id); this.rows.set(t.id, t); }
        cursor = page.next_cursor;
      }
      this.schedule();
    }

    async poll() {
      let lastRunning = 0;
      while (!this.signal.aborted && this.running) {
        await sleep(STATUS_EVERY_MS, this.signal);
        try {
          await this.refreshStatus();
          if (Date.now() - lastRunning >= RUNNING_EVERY_MS && this.running && this.status.counts.running) {
            lastRunning = Date.now();
            const page = await getJSON(
              `v1/batches/${enc(this.id)}/trajectories?state=running&limit=${MAX_ROWS}`, this.signal);
            for (const t of page.items) {
              const old = this.rows.get(t.id);
              if (old && !TERMINAL.has(old.state)) { this.rows.set(t.id, t); }
            }
            this.schedule();
          }
        } catch (e) {
          if (e instanceof AuthNeeded) return;
        }
      }
      // Finished: pick up anything the stream did not deliver (e.g. it was down at the end).
      if (!this.signal.aborted) {
        for (const [id, t] of this.rows) if (!TERMINAL.has(t.state)) this.want.add(id);
        this.pump();
      }
    }

    /** SSE over fetch, so the Authorization header goes along; resumes with Last-Event-ID. */
    async stream() {
      let last = null;
      let backoff = 500;
      while (!this.signal.aborted) {
        try {
          const headers = { Accept: "text/event-stream" };
          if (last) headers["Last-Event-ID"] = last;
          const res = await api(`v1/batches/${enc(this.id)}/events`, { headers, signal: this.signal });
          this.reconnecting = false;
          setConn("live", "live");
          const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
          let buf = "";
          for (;;) {
            const { value, done: end } = await reader.read();
            if (end) break;
            buf += value;
            let cut;
            while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
              const block = buf.slice(0, cut);
              buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
              const ev = parseEvent(block);
              if (!ev) continue;
              if (ev.id) last = ev.id;
              if (ev.event === "done") { this.refreshStatus().catch(() => {}); return; }
              if (ev.event === "trajectory") this.onEvent(JSON.parse(ev.data));
            }
          }
          backoff = 500;
        } catch (e) {
          if (this.signal.aborted || e instanceof AuthNeeded) return;
          if (e instanceof HttpError && e.status === 404) return;
        }
        this.reconnecting = true;
        setConn("polling", "reconnecting");
        await sleep(backoff, this.signal);
        backoff = Math.min(backoff * 2, 10000);
      }
    }

    onEvent(ev) {
      const t = this.rows.get(ev.trajectory_id);
      if (!t) return;  // beyond MAX_ROWS
      if (t.state === ev.state && TERMINAL.has(t.state)) return;  // already have it (a replayed event)
      this.rows.set(t.id, { ...t, state: ev.state, reward: ev.reward, failure: ev.failure });
      this.want.add(t.id);
      this.pump();
      this.schedule();
      if (!this.statusSoon) {  // counts follow events closely, at most ~4 reads a second
        this.statusSoon = setTimeout(() => {
          this.statusSoon = null;
          if (!this.signal.aborted) this.refreshStatus().catch(() => {});
        }, 250);
      }
    }

    pump() {
      while (this.fetching < MAX_FETCHES && this.want.size && !this.signal.aborted) {
        const id = this.want.values().next().value;
        this.want.delete(id);
        this.fetching++;
        getJSON(`v1/trajectories/${enc(id)}`, this.signal)
          .then((t) => { this.rows.set(t.id, t); this.schedule(); })
          .catch(() => {})
          .finally(() => { this.fetching--; this.pump(); });
      }
    }

    schedule() {
      if (this.queued || this.signal.aborted) return;
      this.queued = true;
      requestAnimationFrame(() => { this.queued = false; if (!this.signal.aborted) this.render(); });
    }

    // ---- rendering ----
    render() {
      const detail = $("detail");
      if (!this.status) { detail.replaceChildren(el("p", { class: "empty" }, "Loading…")); return; }
      if (!this.shell) {
        this.shell = {
          head: el("div"), stats: el("div", { class: "stats" }), axis: el("div", { class: "axis" }),
          list: el("div", { class: "traj-list", id: "traj-list" }), more: el("div", { class: "more" }),
        };
        detail.replaceChildren(
          this.shell.head, this.shell.stats,
          el("div", { class: "trajs-head" }, el("h2", {}, "Trajectories"), el("span", { class: "muted" },
            "one bar per turn: time queued, prefill, decode and tool"),
          el("div", { class: "phase-legend" }, PHASES.map(([, p]) =>
            el("span", {}, el("span", { class: `legend-dot ph-${p}` }), p)))),
          el("div", { class: "grid thead" }, el("span", {}, "state"), el("span", {}, "trajectory"), this.shell.axis,
            el("span", { class: "num" }, "turns"), el("span", { class: "num" }, "reward")),
          this.shell.list, this.shell.more);
      }
      this.renderHead();
      const rows = this.order.map((id) => this.rows.get(id));
      const scale = niceMax(Math.max(0, ...rows.map((t) => trajTotal(t))));
      this.renderStats(rows);
      this.renderAxis(scale);
      const nodes = rows.map((t) => this.row(t, scale));
      const list = this.shell.list;
      if (nodes.length !== list.children.length || nodes.some((n, i) => list.children[i] !== n)) list.replaceChildren(...nodes);
      const n = this.status.num_trajectories;
      this.shell.more.textContent = n > this.order.length ? `Showing the first ${this.order.length} of ${n} trajectories.` : "";
    }

    renderHead() {
      const b = this.status;
      const n = done(b);
      const end = b.finished_at || (this.running ? Date.now() / 1000 : null);
      this.shell.head.replaceChildren(...[  // (replaceChildren would print a null child as "null")
        el("div", { class: "head" }, el("h1", { id: "batch-id" }, b.id), el("span", { id: "batch-state" }, badge(b.state)),
          el("span", { class: "chip" }, `env ${b.env}`), b.tenant !== "default" ? el("span", { class: "chip" }, `tenant ${b.tenant}`) : null,
          el("span", { class: "when" }, `created ${new Date(b.created_at * 1000).toLocaleTimeString()}`,
            end ? ` · ${b.finished_at ? "took" : "running for"} ${secs(end - b.created_at)}` : "")),
        Object.keys(b.metadata || {}).length
          ? el("div", { class: "chips" }, Object.entries(b.metadata).map(([k, v]) => el("span", { class: "chip" }, `${k}=${v}`)))
          : null,
        el("div", { class: "progress" }, progressBar(b),
          el("div", { class: "nums" },
            el("span", {}, el("span", { class: "big", id: "progress-text", dataset: { done: n, total: b.num_trajectories } },
              `${n} / ${b.num_trajectories}`), "done"),
            STATES.filter((s) => b.counts[s]).map((s) =>
              el("span", {}, el("span", { class: `legend-dot s-${s}` }), `${s} `, el("b", {}, b.counts[s])))))
      ].filter(Boolean));
    }

    renderStats(rows) {
      const fin = rows.filter((t) => t.turns.length);
      const usable = rows.filter((t) => USABLE.has(t.state));
      const rewards = usable.map((t) => t.reward).filter((r) => r != null);
      const turns = fin.flatMap((t) => t.turns);
      const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);
      const failures = {};
      for (const t of rows) if (t.failure) failures[t.failure.kind] = (failures[t.failure.kind] || 0) + 1;
      const engines = new Set(turns.map((t) => t.engine_id));
      const versions = [...new Set(turns.map((t) => t.policy_version))].sort((a, b) => a - b);
      const stat = (k, v, title) => el("div", { class: "stat", title }, el("div", { class: "k" }, k), el("div", { class: String(v).length > 7 ? "v small" : "v" }, v));
      this.shell.stats.replaceChildren(
        stat("mean reward", num(mean(rewards)), "over completed and truncated trajectories"),
        stat("usable", `${usable.length} / ${rows.length}`, "completed or truncated: fit for the loss"),
        stat("failures", Object.keys(failures).length
          ? Object.entries(failures).map(([k, n]) => `${k} ${n}`).join(", ") : "none"),
        stat("turns / traj", num(mean(fin.map((t) => t.turns.length)), 2)),
        stat("sampled tokens", turns.reduce((n, t) => n + t.output_ids.length, 0).toLocaleString()),
        stat("prefill / turn", secs(mean(turns.map((t) => t.timings.prefill_s))), "time to first token, mean over turns"),
        stat("decode / turn", secs(mean(turns.map((t) => t.timings.decode_s)))),
        stat("engines", engines.size ? [...engines].join(", ") : "–"),
        stat("policy versions", versions.length ? versions.map((v) => `v${v}`).join(", ") : "–"));
    }

    renderAxis(scale) {
      const ticks = [0, 0.25, 0.5, 0.75, 1];
      this.shell.axis.replaceChildren(...ticks.map((f, i) =>
        el("span", { class: i === ticks.length - 1 ? "last" : null, style: { left: `${f * 100}%` } }, secs(f * scale))));
    }

    row(t, scale) {
      const key = JSON.stringify([t.state, t.turns.length, t.reward, t.failure, t.attempts, scale, this.open.has(t.id)]);
      const have = this.dom.get(t.id);
      if (have && have.key === key) return have.node;
      const failure = t.failure && t.state !== "completed"
        ? el("span", { class: "badge fail", title: t.failure.message }, t.failure.kind) : null;
      const node = el("div", { class: `traj${this.open.has(t.id) ? " open" : ""}`, dataset: { trajId: t.id, state: t.state } },
        el("div", { class: "grid", onclick: () => this.toggle(t.id), title: "show turns" },
          el("span", {}, badge(t.state)),
          el("span", { class: "tid" }, t.id, el("span", { class: "gs" }, `group ${t.group_index} · sample ${t.sample_index}`)),
          this.track(t, scale),
          el("span", { class: "num turns-n" }, t.turns.length || "–"),
          el("span", { class: "num" }, failure || el("span", { class: rewardClass(t.reward) }, num(t.reward)))),
        this.open.has(t.id) ? this.expand(t) : null);
      this.dom.set(t.id, { key, node });
      return node;
    }

    toggle(id) {
      if (this.open.has(id)) this.open.delete(id); else this.open.add(id);
      this.render();
    }

    track(t, scale) {
      if (!t.turns.length) {
        const label = t.state === "running" ? "running…" : t.state === "queued" ? "queued" : t.state;
        return el("div", { class: "track" }, el("div", { class: `pending ${t.state}` }, label));
      }
      const more = t.state === "running" ? el("div", { class: "pending running next", title: "turn in progress" }) : null;
      return el("div", { class: "track" }, t.turns.map((turn) => {
        const total = turnTotal(turn);
        return el("div", {
          class: "turn", style: { width: `${(100 * total) / scale}%` },
          title: `turn ${turn.index} · ${turn.engine_id} · policy v${turn.policy_version} · ${secs(total)}\n`
            + PHASES.map(([k, p]) => `${p} ${secs(turn.timings[k])}`).join(" · ")
            + `\n${turn.output_ids.length} tokens sampled · ${turn.finish_reason} · reward ${num(turn.reward)}`,
        }, phaseSpans(turn, total));
      }), more);
    }

    expand(t) {
      return el("div", { class: "expand" },
        el("div", { class: "kv" },
          el("span", {}, "id ", el("b", { class: "mono" }, t.id)),
          el("span", {}, "env ", el("b", {}, t.env)),
          el("span", {}, "attempts ", el("b", {}, t.attempts)),
          el("span", {}, "active ", el("b", {}, secs(t.active_s))),
          el("span", {}, "reward ", el("b", {}, num(t.reward))),
          el("span", { class: "mono" }, "task ", el("b", {}, clip(JSON.stringify(t.task), 300)))),
        t.failure ? el("div", { class: "failure" }, el("span", { class: "badge s-failed" }, t.failure.kind), t.failure.message) : null,
        t.turns.length ? el("table", { class: "turns" },
          el("thead", {}, el("tr", {}, ["#", "engine", "policy", "prompt tok", "sampled tok", "finish", "", "queue",
            "prefill", "decode", "tool", "reward"].map((h, i) => el("th", { class: i > 5 && h ? "num" : null }, h)))),
          el("tbody", {}, t.turns.map((turn) => {
            const total = turnTotal(turn);
            return el("tr", { class: "turn-row" },
              el("td", {}, turn.index), el("td", { class: "engine mono" }, turn.engine_id),
              el("td", { class: "policy" }, `v${turn.policy_version}`),
              el("td", { class: "num" }, turn.prompt_ids.length), el("td", { class: "num" }, turn.output_ids.length),
              el("td", {}, turn.finish_reason),
              el("td", {}, el("div", { class: "minibar", title: secs(total) }, phaseSpans(turn, total))),
              PHASES.map(([k]) => el("td", { class: "num" }, secs(turn.timings[k]))),
              el("td", { class: "num turn-reward" }, num(turn.reward)));
          }))) : el("p", { class: "muted" }, t.state === "running" ? "No turn has finished yet." : "No turns."),
        t.messages.length ? el("details", {}, el("summary", {}, `conversation (${t.messages.length} messages)`),
          el("div", { class: "convo" }, t.messages.map((m) =>
            el("div", { class: `msg ${m.role}` }, el("div", { class: "role" }, m.role), el("pre", {}, clip(m.content, MAX_TEXT)))))) : null);
    }
  }

  function phaseSpans(turn, total) {
    return PHASES.filter(([k]) => turn.timings[k] > 0).map(([k, p]) =>
      el("span", { class: `ph-${p}`, style: { flexGrow: String(total ? turn.timings[k] / total : 1) } }));
  }
  const rewardClass = (r) => `reward ${r == null ? "none" : r > 0 ? "pos" : "zero"}`;

  /** A round number at or above x, so the axis reads 0 · 0.5 s · 1 s ... */
  function niceMax(x) {
    if (!(x > 0)) return 1;
    const p = 10 ** Math.floor(Math.log10(x));
    for (const m of [1, 2, 4, 5, 10]) if (m * p >= x) return m * p;
    return 10 * p;
  }

  function parseEvent(block) {
    const ev = { event: "message", data: "", id: null };
    let any = false;
    for (const line of block.split(/\r?\n/)) {
      if (!line || line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
      if (field === "event") ev.event = value;
      else if (field === "data") ev.data += (ev.data ? "\n" : "") + value;
      else if (field === "id") ev.id = value;
      any = true;
    }
    return any ? ev : null;
  }

  async function loadRules() {
    for (;;) {  // the rule is the API's (no copy here): wait for it, bounded retries apart
      try {
        const r = await getJSON("v1/states");
        TERMINAL = new Set(r.terminal);
        USABLE = new Set(r.usable);
        return;
      } catch (e) {
        if (e instanceof AuthNeeded) return;  // never: the rule is public; keep going regardless
        setConn("error", "gateway unreachable");
        await sleep(2000);
      }
    }
  }

  function restart() {
    $("apikey").placeholder = apiKey ? "API key saved in this browser" : "API key (only if the gateway has auth on)";
    listAbort.abort();
    listAbort = new AbortController();
    if (view) view.stop();
    view = null;
    const keep = selected;
    selected = null;
    notice(null);
    setConn("connecting", "connecting");
    if (keep) history.replaceState(null, "", `#batch=${enc(keep)}`);
    pollList(listAbort.signal);
  }

  setInterval(() => { if (order.length) renderList(); }, 10000);  // keeps "12s ago" fresh
  loadRules().then(restart);
})();
