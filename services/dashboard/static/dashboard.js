// Tessera dashboard: draws the cluster from server-sent events (api/v1/events), no polling.
//
// The server sends one "snapshot" (everything) and then "update" events carrying only the nodes
// whose view changed, the totals, the tenants, and the Pending table when it changed. The placed
// pods table is paged and filtered by the server (api/v1/pods/running), fetched again shortly
// after an update that changed nodes. Each node is one
// <article>, replaced as a whole when its view changes. The browser's EventSource reconnects by
// itself and the server answers a reconnect with a fresh snapshot.
//
// window.tesseraDashboard exposes the model and render timings (used by the browser test and
// benchmarks/dashboard.py).
"use strict";

(() => {
  const model = {
    nodes: new Map(), // name -> NodeView
    order: [],
    totals: null,
    fragmentation: null,
    pending: null,
    tenants: [],
    connected: false,
    generatedAt: null,
  };
  const RUNNING_PAGE = 20; // placed pods per page (api/v1/pods/running)
  const running = { offset: 0, filter: "", count: 0, timer: null, pods: [], asked: 0 };
  const perf = {
    snapshots: 0,
    updates: 0,
    lastRenderMs: 0,
    snapshotRenderMs: 0,
    firstSnapshotAtMs: null, // since navigation start
  };
  const ui = { filter: "", selected: null };
  window.tesseraDashboard = { model, perf, running, ready: false };

  const $ = (id) => document.getElementById(id);
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const esc = (value) => String(value).replace(/[&<>"']/g, (c) => ESCAPES[c]);
  // One unit for a pair, chosen by the larger value: "21.9 / 43.7 TiB", "40 / 80 GiB".
  function unitOf(mib) {
    if (mib >= 10 * 1024 * 1024) return [1024 * 1024, "TiB", 1];
    if (mib >= 1024) return [1024, "GiB", mib >= 10240 ? 0 : 1];
    return [1, "MiB", 0];
  }
  function memory(mib, of = mib) {
    const [scale, unit, digits] = unitOf(of);
    return `${(mib / scale).toFixed(digits)} ${unit}`;
  }
  function memoryPair(part, whole) {
    const [scale, unit, digits] = unitOf(Math.max(part, whole));
    return `${(part / scale).toFixed(digits)} / ${(whole / scale).toFixed(digits)} ${unit}`;
  }
  function age(seconds) {
    if (seconds < 90) return `${seconds.toFixed(0)} s`;
    if (seconds < 5400) return `${(seconds / 60).toFixed(0)} min`;
    if (seconds < 172800) return `${(seconds / 3600).toFixed(0)} h`;
    return `${(seconds / 86400).toFixed(0)} d`;
  }
  // "NVIDIA A100-SXM4-80GB" -> "A100": the full name is in the GPU's title and details.
  const shortModel = (model) => model.replace(/^(NVIDIA|Tesla)\s+/i, "").split(/[-\s]/)[0];
  const pct = (part, whole) => (whole > 0 ? Math.min(100, (100 * part) / whole) : 0);
  const clock = (epoch) => (epoch ? new Date(epoch * 1000).toLocaleTimeString() : "");
  const stamp = (epoch) => (epoch ? new Date(epoch * 1000).toLocaleString() : "");
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  // --- totals --------------------------------------------------------------------------------

  function meter(part, whole, cls) {
    return `<span class="meter ${cls}"><span style="width:${pct(part, whole).toFixed(2)}%"></span></span>`;
  }

  function card(label, value, detail, extra = "", cls = "") {
    return `<div class="card ${cls}"><div class="label">${label}</div><div class="value">${value}</div>${extra}<div class="detail">${detail}</div></div>`;
  }

  function renderTotals() {
    const t = model.totals;
    const f = model.fragmentation;
    if (!t) return;
    const memFree = `${memory(t.gpu_memory_free_mib)} free` +
      (t.gpu_memory_unavailable_mib ? ` · ${memory(t.gpu_memory_unavailable_mib)} on unhealthy GPUs` : "") +
      ` · ${memory(t.gpu_memory_used_mib)} in use now`;
    const gpuCores = (cores) => (cores / 100).toFixed(cores % 100 ? 1 : 0);
    let frag = card("Fragmentation", "n/a", "no placer has published statistics yet", "", "frag na");
    if (f && f.available) {
      frag = card(
        "Fragmentation",
        `${f.fragmentation_pct.toFixed(2)} %`,
        `${(f.fragmented_milli / 1000).toFixed(2)} GPUs stranded · ${esc(f.placer_id)}${f.profile ? ` (${esc(f.profile)})` : ""} · ${age(f.age_s)} ago`,
        "",
        `frag${f.stale ? " stale" : ""}`,
      );
    }
    $("totals").innerHTML = [
      card("Nodes", `${t.nodes_ready} / ${t.nodes}`, "ready / known"),
      card(
        "GPUs",
        `${t.gpus_healthy} / ${t.gpus}`,
        t.gpus_unhealthy ? `<span class="bad">${t.gpus_unhealthy} unhealthy</span>` : "all healthy",
        "",
        t.gpus_unhealthy ? "warn" : "",
      ),
      card(
        "GPU memory allocated",
        memoryPair(t.gpu_memory_allocated_mib, t.gpu_memory_total_mib),
        memFree,
        meter(t.gpu_memory_allocated_mib, t.gpu_memory_total_mib, "mem"),
      ),
      card(
        "Compute allocated",
        `${gpuCores(t.gpu_cores_allocated)} / ${gpuCores(t.gpu_cores_total)} GPUs`,
        `${gpuCores(t.gpu_cores_free)} GPUs of SMs free`,
        meter(t.gpu_cores_allocated, t.gpu_cores_total, "cores"),
      ),
      card(
        "Pods on GPUs",
        `${t.pods_allocated + t.pods_bound + t.pods_reserved}`,
        `${t.pods_allocated} allocated · ${t.pods_bound} bound · ${t.pods_reserved} reserved` +
          (t.pods_without_gpus ? ` · ${t.pods_without_gpus} placed without a GPU` : ""),
      ),
      card("Pending", `${t.pods_pending}`, "pods waiting for a fit", "", t.pods_pending ? "warn" : ""),
      frag,
      t.gpus_overcommitted
        ? card("Over-committed", `${t.gpus_overcommitted}`, "GPUs booked beyond capacity", "", "bad")
        : "",
      t.stray_slices
        ? card("Unlisted GPUs", `${t.stray_slices}`, "slices on GPUs no inventory lists", "", "warn")
        : "",
    ].join("");
    $("nodes-count").textContent = `${t.nodes} nodes · ${t.gpus} GPUs`;
  }

  // --- nodes ---------------------------------------------------------------------------------

  function sliceTitle(s) {
    return `${s.namespace}/${s.name} (${s.container}) · ${memory(s.memory_mib)} · ${s.cores}% SMs · ${s.state}`;
  }

  function gpuHtml(node, gpu) {
    // Bars are scaled to the GPU's memory (upper) and to 100 % of its SMs (lower); a GPU that
    // the inventory does not list is scaled to what its slices hold.
    const memScale = gpu.listed ? Math.max(gpu.memory_total_mib, gpu.allocated_memory_mib) : gpu.allocated_memory_mib;
    const coreScale = Math.max(100, gpu.allocated_cores);
    const mem = [];
    const cores = [];
    for (const s of gpu.slices) {
      mem.push(
        `<span class="slice s-${s.state}" style="width:${pct(s.memory_mib, memScale).toFixed(3)}%"` +
          ` data-pod-uid="${esc(s.pod_uid)}" data-namespace="${esc(s.namespace)}" data-pod="${esc(s.name)}"` +
          ` data-container="${esc(s.container)}" data-memory-mib="${s.memory_mib}" data-cores="${s.cores}"` +
          ` data-state="${s.state}" title="${esc(sliceTitle(s))}"></span>`,
      );
      cores.push(`<span class="slice s-${s.state}" style="width:${pct(s.cores, coreScale).toFixed(3)}%"></span>`);
    }
    const used = gpu.listed && gpu.memory_total_mib
      ? `<span class="used" style="left:${pct(gpu.memory_used_mib, memScale).toFixed(2)}%" title="in use now: ${memory(gpu.memory_used_mib)}"></span>`
      : "";
    const health = gpu.health === "healthy" ? "" : ` ${gpu.health}`;
    const cls = `gpu${health}${gpu.overcommitted ? " overcommitted" : ""}`;
    const reason = gpu.health === "healthy" ? "" : `<div class="reason">${esc(gpu.health)}${gpu.health_reason ? `: ${esc(gpu.health_reason)}` : ""}</div>`;
    const stats = gpu.listed
      ? `${sparkline(gpu.utilization_history)}${gpu.utilization_pct}% util · ${memoryPair(gpu.memory_used_mib, gpu.memory_total_mib)}`
      : "not in inventory";
    return (
      `<div class="${cls}" data-gpu-uuid="${esc(gpu.uuid)}" data-gpu-index="${gpu.index}" data-node="${esc(node.name)}">` +
      `<div class="gpu-label" title="${esc(gpu.model)} ${esc(gpu.uuid)}">GPU ${gpu.index} <small>${esc(shortModel(gpu.model))}</small></div>` +
      `<div class="bars"><div class="bar mem" title="memory: ${memory(gpu.allocated_memory_mib)} of ${memory(gpu.memory_total_mib)} allocated">${mem.join("")}${used}</div>` +
      `<div class="bar cores" aria-hidden="true" title="compute: ${gpu.allocated_cores}% of SMs allocated">${cores.join("")}</div></div>` +
      `<div class="gpu-stats">${stats}</div>${reason}</div>`
    );
  }

  // Utilisation over the last 10 minutes (the inventory's readings), as a small line.
  const HISTORY_S = 600;
  function sparkline(history) {
    if (!history || history.length < 2) return "";
    const end = history[history.length - 1][0];
    const points = history
      .map(([at, pct]) => `${(60 * (1 - (end - at) / HISTORY_S)).toFixed(1)},${(16 - (16 * pct) / 100).toFixed(1)}`)
      .join(" ");
    const values = history.map(([, pct]) => pct);
    const title = `utilisation, last ${age(end - history[0][0])}: ${Math.min(...values)}–${Math.max(...values)}%`;
    return `<svg class="spark" viewBox="0 0 60 16" preserveAspectRatio="none" role="img" aria-label="${title}"><title>${title}</title><polyline points="${points}"/></svg>`;
  }

  function nodeHtml(node) {
    const gpus = node.gpus.filter((g) => g.listed);
    const total = gpus.reduce((sum, g) => sum + g.memory_total_mib, 0);
    const allocated = gpus.reduce((sum, g) => sum + g.allocated_memory_mib, 0);
    const frag = node.fragmented_milli == null ? "" : ` · frag ${(node.fragmented_milli / 1000).toFixed(2)} GPU`;
    const problems = node.problems.map((p) => `<span class="badge">${esc(p)}</span>`).join("");
    const cls = `node${node.problems.length ? " has-problems" : ""}${node.ready === false ? " not-ready" : ""}`;
    return (
      `<article class="${cls}" data-node="${esc(node.name)}">` +
      `<header><h3 title="${node.inventory_observed_at ? `inventory of ${esc(stamp(node.inventory_observed_at))}` : "no inventory"}">${esc(node.name)}</h3><span class="node-sum">${plural(gpus.length, "GPU")} · ${memoryPair(allocated, total)}${frag}</span>${problems}</header>` +
      `<div class="gpus">${node.gpus.map((g) => gpuHtml(node, g)).join("") || '<div class="muted">no GPUs</div>'}</div>` +
      `</article>`
    );
  }

  function matches(node) {
    const f = ui.filter;
    if (!f) return true;
    if (node.name.toLowerCase().includes(f)) return true;
    return node.gpus.some((g) => g.slices.some((s) => `${s.namespace}/${s.name}`.toLowerCase().includes(f)));
  }

  function applyFilter(article, node) {
    article.hidden = !matches(node);
    const selector = ui.filter ? ".bar.mem .slice" : ".bar.mem .slice.match";
    for (const el of article.querySelectorAll(selector)) {
      const name = `${el.dataset.namespace}/${el.dataset.pod}`.toLowerCase();
      el.classList.toggle("match", ui.filter !== "" && name.includes(ui.filter));
    }
  }

  function fragment(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    return template.content;
  }

  function renderAllNodes() {
    const container = $("nodes");
    container.innerHTML = model.order.map((name) => nodeHtml(model.nodes.get(name))).join("");
    if (ui.filter) {
      for (const article of container.children) applyFilter(article, model.nodes.get(article.dataset.node));
    }
  }

  function renderChangedNodes(changed, reorder) {
    const container = $("nodes");
    const existing = new Map();
    for (const article of container.children) existing.set(article.dataset.node, article);
    for (const node of changed) {
      const fresh = fragment(nodeHtml(node)).firstElementChild;
      applyFilter(fresh, node);
      const old = existing.get(node.name);
      if (old) old.replaceWith(fresh);
      else container.appendChild(fresh);
      existing.set(node.name, fresh);
    }
    if (reorder) {
      for (const [name, article] of existing) {
        if (!model.nodes.has(name)) article.remove();
      }
      for (const name of model.order) container.appendChild(existing.get(name));
    }
  }

  // --- pending -------------------------------------------------------------------------------

  function renderPending() {
    const p = model.pending;
    if (!p) return;
    $("pending-count").textContent = `${p.count}`;
    $("pending-reasons").innerHTML = p.reasons
      .map((r) => `<span class="chip">${esc(r.reason)} <b>${r.pods}</b></span>`)
      .join("");
    const rows = p.pods.map((pod) => {
      const reasons =
        pod.kind === "queued"
          ? "<li>not decided by a placer yet</li>"
          : pod.kind === "invalid"
            ? "<li>invalid request (see the message)</li>"
            : pod.reasons.map((r) => `<li>${plural(r.nodes, "node")}: ${esc(r.reason)}</li>`).join("");
      const flag =
        pod.kind === "invalid"
          ? ' <span class="badge bad">invalid</span>'
          : pod.kind === "queued"
            ? ' <span class="badge">queued</span>'
            : pod.unresolvable
              ? ' <span class="badge bad">unresolvable</span>'
              : "";
      return (
        `<tr data-pod-uid="${esc(pod.pod_uid)}"><td>${esc(pod.namespace)}/<b>${esc(pod.name)}</b>${flag}</td>` +
        `<td><ul>${reasons}</ul></td><td>${pod.rejections}</td>` +
        `<td title="${esc(stamp(pod.first_rejected_at))}">${esc(clock(pod.first_rejected_at))}</td>` +
        `<td>${esc(pod.message)}</td></tr>`
      );
    });
    $("pending").tBodies[0].innerHTML = rows.length
      ? rows.join("")
      : '<tr class="empty"><td colspan="5">No pod is Pending.</td></tr>';
    const more = $("pending-more");
    more.hidden = p.count <= p.pods.length;
    more.textContent = `Showing the ${p.pods.length} oldest of ${p.count}; all of them: api/v1/pods/pending`;
  }

  // --- tenants -------------------------------------------------------------------------------

  function renderTenants() {
    const tenants = model.tenants || [];
    $("tenants-count").textContent = `${tenants.length}`;
    const rows = tenants.map((t) => {
      const shares = t.quota_gpus == null ? `${t.gpus}` : `${t.gpus} / ${t.quota_gpus}`;
      const gpuMeter = t.quota_gpus ? meter(t.gpus, t.quota_gpus, "cores") : "";
      const mem =
        t.quota_gpu_memory_mib == null
          ? memory(t.gpu_memory_mib)
          : memoryPair(t.gpu_memory_mib, t.quota_gpu_memory_mib);
      const memMeter = t.quota_gpu_memory_mib ? meter(t.gpu_memory_mib, t.quota_gpu_memory_mib, "mem") : "";
      return (
        `<tr data-tenant="${esc(t.tenant)}"><td><b>${esc(t.tenant)}</b></td><td>${t.pods}</td>` +
        `<td>${shares}${gpuMeter}</td><td>${mem}${memMeter}</td>` +
        `<td>${(t.core_milli / 1000).toFixed(2)} GPUs of SMs</td></tr>`
      );
    });
    $("tenants").tBodies[0].innerHTML = rows.length
      ? rows.join("")
      : '<tr class="empty"><td colspan="5">No tenant holds GPUs or has a quota (or no placer has published statistics yet).</td></tr>';
  }

  // --- placed pods (api/v1/pods/running: filtered and paged by the server) --------------------

  async function loadRunning() {
    const query = new URLSearchParams({ offset: running.offset, limit: RUNNING_PAGE, filter: running.filter });
    // Loads overlap (updates, paging, the filter); only the latest one asked may be shown, or an
    // older answer arriving last (an unfiltered page) would stay on screen.
    const asked = ++running.asked;
    let data;
    try {
      const response = await fetch(`api/v1/pods/running?${query}`);
      if (!response.ok) return;
      data = await response.json();
    } catch (error) {
      return; // the next update tries again
    }
    if (asked !== running.asked) return;
    if (data.count > 0 && data.offset >= data.count) {
      running.offset = Math.max(0, Math.floor((data.count - 1) / RUNNING_PAGE) * RUNNING_PAGE);
      return loadRunning();
    }
    running.count = data.count;
    running.pods = data.pods;
    renderRunning();
  }

  function refreshRunningSoon() {
    if (running.timer) return;
    running.timer = setTimeout(() => {
      running.timer = null;
      loadRunning();
    }, 500);
  }

  function renderRunning() {
    const rows = running.pods.map(
      (p) =>
        `<tr data-pod-uid="${esc(p.pod_uid)}"><td>${esc(p.namespace)}/<b>${esc(p.name)}</b></td>` +
        `<td>${esc(p.node)}</td><td><span class="state s-${esc(p.state)}">${esc(p.state)}</span></td>` +
        `<td>${p.gpus}</td><td>${p.gpus ? memory(p.gpu_memory_mib) : "–"}</td>` +
        `<td>${p.gpus ? `${p.gpu_cores}% SMs` : "–"}</td>` +
        `<td title="${esc(stamp(p.decided_at))}">${esc(clock(p.decided_at))}</td></tr>`,
    );
    $("running").tBodies[0].innerHTML = rows.length
      ? rows.join("")
      : `<tr class="empty"><td colspan="7">${running.filter ? "No placed pod matches the filter." : "No pod is placed."}</td></tr>`;
    const last = Math.min(running.offset + RUNNING_PAGE, running.count);
    $("running-count").textContent = `${running.count}`;
    $("running-page").textContent = running.count ? `${running.offset + 1}-${last} of ${running.count}` : "";
    $("running-prev").disabled = running.offset === 0;
    $("running-next").disabled = last >= running.count;
  }

  // --- details -------------------------------------------------------------------------------

  function findGpu(nodeName, uuid) {
    const node = model.nodes.get(nodeName);
    return node && node.gpus.find((g) => g.uuid === uuid);
  }

  function renderDetails() {
    const sel = ui.selected;
    const panel = $("details");
    if (!sel) {
      panel.hidden = true;
      return;
    }
    const gpu = findGpu(sel.node, sel.gpu);
    let html;
    if (!gpu) {
      html = "<p>This GPU is no longer shown.</p>";
    } else if (sel.pod) {
      const s = gpu.slices.find((x) => x.pod_uid === sel.pod && x.container === sel.container);
      html = s
        ? `<h3>${esc(s.namespace)}/${esc(s.name)}</h3><dl>` +
          `<dt>Container</dt><dd>${esc(s.container)}</dd><dt>State</dt><dd>${esc(s.state)}</dd>` +
          `<dt>GPU memory</dt><dd>${s.memory_mib} MiB</dd><dt>Compute</dt><dd>${s.cores}% of SMs</dd>` +
          `<dt>Node</dt><dd>${esc(sel.node)}</dd><dt>GPU</dt><dd>${gpu.index} · ${esc(gpu.uuid)}</dd>` +
          `<dt>Decided</dt><dd>${esc(stamp(s.decided_at))}</dd><dt>Pod UID</dt><dd>${esc(s.pod_uid)}</dd></dl>`
        : "<p>This slice has been released.</p>";
    } else {
      html =
        `<h3>${esc(sel.node)} · GPU ${gpu.index}</h3><dl>` +
        `<dt>UUID</dt><dd>${esc(gpu.uuid)}</dd><dt>Model</dt><dd>${esc(gpu.model)}</dd>` +
        `<dt>Health</dt><dd>${esc(gpu.health)}${gpu.health_reason ? `: ${esc(gpu.health_reason)}` : ""}</dd>` +
        `<dt>Memory</dt><dd>${gpu.allocated_memory_mib} of ${gpu.memory_total_mib} MiB allocated, ${gpu.memory_used_mib} MiB in use now</dd>` +
        `<dt>Compute</dt><dd>${gpu.allocated_cores}% of SMs allocated</dd>` +
        `<dt>Utilisation</dt><dd>${gpu.utilization_pct}%</dd><dt>Temperature</dt><dd>${gpu.temperature_c} °C</dd>` +
        `<dt>Power</dt><dd>${gpu.power_w.toFixed(0)} W</dd><dt>Slices</dt><dd>${gpu.slices.length}</dd></dl>`;
    }
    $("details-body").innerHTML = html;
    panel.hidden = false;
  }

  function onNodesClick(event) {
    const target = event.target;
    const gpuEl = target.closest(".gpu");
    if (!gpuEl) return;
    const slice = target.closest(".bar.mem .slice");
    ui.selected = {
      node: gpuEl.dataset.node,
      gpu: gpuEl.dataset.gpuUuid,
      pod: slice ? slice.dataset.podUid : null,
      container: slice ? slice.dataset.container : null,
    };
    renderDetails();
  }

  // --- stream --------------------------------------------------------------------------------

  function setConnection(state, text) {
    const el = $("connection");
    el.dataset.state = state;
    el.textContent = text;
  }

  function showConnected(connected) {
    model.connected = connected;
    const banner = $("banner");
    banner.hidden = connected;
    banner.textContent = connected ? "" : "The dashboard has lost NATS: showing the last known state until it reconnects.";
    setConnection(connected ? "live" : "stale", connected ? "live" : "NATS disconnected");
  }

  function timed(fn) {
    const start = performance.now();
    fn();
    void document.body.offsetHeight; // include style and layout in the measurement
    return performance.now() - start;
  }

  function onSnapshot(event) {
    const data = JSON.parse(event.data);
    const ms = timed(() => {
      const cluster = data.cluster;
      model.nodes = new Map(cluster.nodes.map((n) => [n.name, n]));
      model.order = cluster.nodes.map((n) => n.name);
      model.totals = cluster.totals;
      model.fragmentation = cluster.fragmentation;
      model.pending = data.pending;
      model.tenants = cluster.tenants;
      model.generatedAt = cluster.generated_at;
      renderTotals();
      renderPending();
      renderTenants();
      renderAllNodes();
      renderDetails();
    });
    loadRunning();
    perf.snapshots += 1;
    perf.lastRenderMs = ms;
    perf.snapshotRenderMs = ms;
    if (perf.firstSnapshotAtMs === null) perf.firstSnapshotAtMs = performance.now();
    showConnected(data.connected);
    $("updated").textContent = `updated ${clock(model.generatedAt)}`;
    window.tesseraDashboard.ready = true;
  }

  function onUpdate(event) {
    const data = JSON.parse(event.data);
    perf.lastRenderMs = timed(() => {
      for (const node of data.nodes) model.nodes.set(node.name, node);
      for (const name of data.removed) model.nodes.delete(name);
      if (data.order) model.order = data.order;
      model.totals = data.totals;
      model.fragmentation = data.fragmentation;
      model.tenants = data.tenants;
      model.generatedAt = data.generated_at;
      renderTotals();
      renderTenants();
      if (data.pending) {
        model.pending = data.pending;
        renderPending();
      }
      renderChangedNodes(data.nodes, data.order !== null || data.removed.length > 0);
      if (ui.selected) renderDetails();
    });
    perf.updates += 1;
    if (data.nodes.length || data.removed.length) refreshRunningSoon();
    showConnected(data.connected);
    $("updated").textContent = `updated ${clock(model.generatedAt)}`;
  }

  function onStatus(event) {
    const data = JSON.parse(event.data);
    setConnection("connecting", data.message || "loading");
  }

  function start() {
    $("nodes").addEventListener("click", onNodesClick);
    $("details-close").addEventListener("click", () => {
      ui.selected = null;
      renderDetails();
    });
    $("filter").addEventListener("input", (event) => {
      ui.filter = event.target.value.trim().toLowerCase();
      for (const article of $("nodes").children) applyFilter(article, model.nodes.get(article.dataset.node));
    });
    let filterTimer = null;
    $("running-filter").addEventListener("input", (event) => {
      clearTimeout(filterTimer);
      filterTimer = setTimeout(() => {
        running.filter = event.target.value.trim();
        running.offset = 0;
        loadRunning();
      }, 150);
    });
    $("running-prev").addEventListener("click", () => {
      running.offset = Math.max(0, running.offset - RUNNING_PAGE);
      loadRunning();
    });
    $("running-next").addEventListener("click", () => {
      running.offset += RUNNING_PAGE;
      loadRunning();
    });
    const source = new EventSource("api/v1/events");
    source.addEventListener("snapshot", onSnapshot);
    source.addEventListener("update", onUpdate);
    source.addEventListener("status", onStatus);
    source.addEventListener("error", () => setConnection("connecting", "reconnecting to the dashboard"));
    window.tesseraDashboard.source = source;
  }

  start();
})();
