// Cellblock's dashboard. Every string from the API came from a server or a model: it is only ever
// set as text (textContent, createElement), never parsed as HTML, and never made a link.
"use strict";

(() => {
  const POLL_MS = 1000;
  const AUDIT_MS = 10000;
  const FILTERS = ["server", "tool", "decision", "kind"];
  const SCOPES = ["once", "session", "always"];
  const stored = window.sessionStorage; // this tab, this origin (port) only
  let csrf = stored.getItem("cellblock-csrf");
  const cards = new Map(); // approval id -> its card, kept while the call waits
  const reviews = new Map(); // server and catalog hash -> its card, kept while that catalog is held
  const offered = new Map(); // filter -> the choices its select shows (JSON), rebuilt only when they change
  const opened = new Map(); // gateway pid and server -> whether its details are open, kept across polls
  let auditTimer;
  let linked = null; // the approval a gateway's link opened this page at, until it is shown or gone

  const { byId, element } = window.cellblockDom;

  function say(text) {
    byId("status").textContent = text;
  }

  async function openSession() {
    const match = /^#secret=([A-Za-z0-9_-]+)$/.exec(window.location.hash);
    const link = /^#approval=([a-z2-7]{1,32})$/.exec(window.location.hash);
    // the secret leaves the address bar (and the history) before anything else happens
    if (window.location.hash) window.history.replaceState(null, "", window.location.pathname);
    if (link) linked = link[1];
    if (!match && csrf !== null) return true;
    // no secret (a gateway's approval link has none): the session this browser's cookie holds, if any
    const response = await fetch("/session", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(match ? { secret: match[1] } : {}),
      credentials: "same-origin",
    });
    if (!response.ok) return false;
    csrf = (await response.json()).csrf;
    stored.setItem("cellblock-csrf", csrf);
    return true;
  }

  async function api(path, body) {
    const init = { headers: { "X-CSRF-Token": csrf }, credentials: "same-origin", cache: "no-store" };
    if (body !== undefined) {
      init.method = "POST";
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(path, init);
  }

  async function answer(item, scope, card) {
    for (const button of card.querySelectorAll("button")) button.disabled = true;
    const path = scope === "deny" ? "/api/deny" : "/api/approve";
    const body = scope === "deny" ? { id: item.id } : { id: item.id, scope };
    let text;
    try {
      const response = await api(path, body);
      const reply = await response.json();
      text = reply.message || reply.error || `HTTP ${response.status}`;
      if (!reply.ok) for (const button of card.querySelectorAll("button")) button.disabled = false;
    } catch (error) {
      text = `not sent: ${error}`;
      for (const button of card.querySelectorAll("button")) button.disabled = false;
    }
    card.querySelector(".outcome").textContent = text;
    byId("last-answer").textContent = text;
  }

  function approvalCard(item) {
    const card = element("article", "approval");
    card.dataset.id = item.id;
    const head = element("div", "head");
    const what = item.kind === "tool" ? `${item.server} · ${item.tool}` : `${item.server} · ${item.kind} ${item.tool}`;
    head.append(element("span", "what", what), element("span", "left"));
    card.append(head, element("p", "identity", item.identity));
    if (item.asks) card.append(element("p", "asks", item.asks));
    const args = element("div", "arguments");
    args.setAttribute("aria-label", `arguments (${item.arguments.length}), in full, as escaped JSON`);
    for (const line of item.arguments) args.append(element("div", "argument", line));
    if (item.arguments.length === 0) args.append(element("div", "argument empty", "(no arguments)"));
    card.append(args);
    const buttons = element("div", "buttons");
    for (const scope of [...SCOPES, "deny"]) {
      const button = element("button", scope === "deny" ? "deny" : "allow", scope);
      button.type = "button";
      button.dataset.scope = scope;
      button.addEventListener("click", () => answer(item, scope, card));
      buttons.append(button);
    }
    card.append(buttons, element("p", "outcome"));
    return card;
  }

  function showApprovals(approvals) {
    const list = byId("approvals");
    const seen = new Set();
    for (const item of approvals) {
      seen.add(item.id);
      let card = cards.get(item.id);
      if (!card) {
        card = approvalCard(item);
        cards.set(item.id, card);
        list.append(card);
      }
      card.querySelector(".left").textContent = item.left === "expired" ? "expired" : `${item.left} left`;
      if (item.id === linked) {
        card.classList.add("linked");
        card.scrollIntoView({ block: "center" });
        linked = null;
      }
    }
    if (linked !== null) {
      byId("last-answer").textContent = `'${linked}' waits no more (answered, expired, or its gateway stopped)`;
      linked = null;
    }
    for (const [id, card] of cards) {
      if (!seen.has(id)) {
        card.remove();
        cards.delete(id);
      }
    }
    byId("no-approvals").hidden = approvals.length > 0;
  }

  async function approveCatalog(item, card) {
    const button = card.querySelector("button");
    if (button) button.disabled = true;
    let text;
    try {
      // bound to the hash this card shows: a catalog changed since is refused by the gateway
      const response = await api("/api/approve-catalog", { server: item.server, hash: item.hash });
      const reply = await response.json();
      text = reply.message || reply.error || `HTTP ${response.status}`;
    } catch (error) {
      text = `not sent: ${error}`;
    }
    card.querySelector(".outcome").textContent = text;
    byId("last-answer").textContent = text;
  }

  function diffClass(line) {
    const start = line.trimStart();
    if (/^(new|changed|removed) /.test(line)) return "diff-line item";
    if (start.startsWith("+") && !start.startsWith("+++")) return "diff-line add";
    if (start.startsWith("-") && !start.startsWith("---")) return "diff-line del";
    return "diff-line";
  }

  function reviewCard(item) {
    const card = element("article", "review");
    card.dataset.server = item.server;
    const head = element("div", "head");
    if (item.error) {
      head.append(element("span", "what", `${item.server} · cannot be shown`));
      card.append(head, element("p", "outcome", item.error));
      return card;
    }
    card.dataset.hash = item.hash;
    head.append(element("span", "what", `${item.server} · ${item.first ? "first contact" : "changed since approved"}`));
    card.append(head, element("p", "hash", `catalog sha256 ${item.hash}`));
    const tools = element("ul", "tools");
    tools.setAttribute("aria-label", "its tools");
    for (const tool of item.tools) {
      const entry = element("li", tool.unasked ? "tool unasked" : "tool");
      entry.append(element("span", "name", tool.name));
      if (tool.unasked) entry.append(element("span", "mark", "runs without asking"));
      tools.append(entry);
    }
    if (item.tools.length === 0) tools.append(element("li", "tool empty", "(no tools)"));
    const diff = element("div", "diff");
    for (const line of item.diff) diff.append(element("div", diffClass(line), line));
    const buttons = element("div", "buttons");
    const button = element("button", "allow", "approve");
    button.type = "button";
    button.addEventListener("click", () => approveCatalog(item, card));
    buttons.append(button);
    card.append(tools, diff, buttons, element("p", "outcome"));
    return card;
  }

  function showReview(review) {
    const list = byId("review");
    const seen = new Set();
    for (const item of review) {
      const key = `${item.server}\u0000${item.hash || ""}`;
      seen.add(key);
      if (!reviews.has(key)) {
        const card = reviewCard(item);
        reviews.set(key, card);
        list.append(card);
      }
    }
    for (const [key, card] of reviews) {
      if (!seen.has(key)) {
        card.remove();
        reviews.delete(key);
      }
    }
    byId("no-review").hidden = review.length > 0;
  }

  function row(cells, tag = "td") {
    const tr = document.createElement("tr");
    for (const cell of cells) tr.append(cell instanceof Node ? cell : element(tag, "", cell));
    return tr;
  }

  // a server's details: its lock, jail, package and last stderr lines, as text lines only
  function serverDetails(server, key) {
    const details = element("details", "server-details");
    details.dataset.server = server.name;
    const failing = server.stderr.length > 0;
    details.open = opened.has(key) ? opened.get(key) : failing; // open by default while it fails
    details.addEventListener("toggle", () => opened.set(key, details.open));
    const tail = failing ? ` · ${server.stderr.length} stderr line(s)` : "";
    details.append(element("summary", "", `lock ${server.lock}${tail}`));
    const lines = element("div", "detail-lines");
    if (server.start) lines.append(element("div", "detail start", `start ${server.start}`));
    for (const line of server.jail_lines) lines.append(element("div", "detail jail", line));
    if (server.package) lines.append(element("div", "detail package", `package ${server.package}`));
    details.append(lines);
    if (failing) {
      const stderr = element("div", "stderr");
      stderr.setAttribute("aria-label", "its last lines on stderr, secrets redacted");
      for (const line of server.stderr) stderr.append(element("div", "stderr-line", line));
      details.append(stderr);
    }
    const cell = element("td");
    cell.colSpan = 5;
    cell.append(details);
    const tr = element("tr", "server-details-row");
    tr.append(cell);
    return tr;
  }

  function showGateways(gateways) {
    const parts = [];
    for (const gateway of gateways) {
      const title = gateway.error
        ? `gateway ${gateway.pid}: ${gateway.error}`
        : `gateway ${gateway.pid} · ${gateway.config} · ${gateway.pending} pending`;
      parts.push(element("p", "gateway-title", title));
      if (!gateway.servers.length) continue;
      const table = element("table", "servers");
      table.append(row(["server", "state", "jail", "tools", "calls"], "th"));
      for (const server of gateway.servers) {
        const jail = element("td", server.network.startsWith("UNJAILED") ? "unjailed" : "", server.network);
        const name = element("td", "", server.name);
        for (const note of server.notes) name.append(element("div", "note", note));
        const calls = `${server.calls} (${server.fast_calls} on the fast path)`;
        table.append(row([name, element("td", "", server.state), jail, element("td", "", server.tools), element("td", "", calls)]));
        table.append(serverDetails(server, `${gateway.pid}\u0000${server.name}`));
      }
      parts.push(table);
    }
    byId("gateways").replaceChildren(...parts);
    byId("no-gateways").hidden = gateways.length > 0;
  }

  function fillFilter(name, choices) {
    const select = byId(`filter-${name}`);
    const key = JSON.stringify(choices);
    if (offered.get(name) === key) return;
    offered.set(name, key);
    const chosen = select.value;
    const options = [element("option", "", "any")];
    options[0].value = "";
    for (const choice of choices) {
      const option = element("option", "", choice);
      option.value = choice;
      options.push(option);
    }
    select.replaceChildren(...options);
    select.value = choices.includes(chosen) ? chosen : "";
  }

  function showAudit(audit) {
    const chain = byId("chain");
    chain.className = `chain ${audit.chain.state}`;
    chain.textContent = audit.chain.text;
    chain.dataset.state = audit.chain.state;
    for (const name of FILTERS) fillFilter(name, audit.choices[name]);
    const table = element("table", "events");
    table.id = "audit-events";
    table.append(row(["time", "event", "server", "tool", "decision", "details"], "th"));
    for (const event of audit.events) {
      const cells = [event.time, event.kind, event.server, event.tool, event.decision].map((text) => element("td", "", text));
      table.append(row([...cells, element("td", "details", event.details)]));
    }
    byId("audit-events").replaceWith(table);
    const unreadable = audit.unreadable ? `; ${audit.unreadable} unreadable line(s), not shown` : "";
    const summary = `${audit.events.length} newest of ${audit.matched} matching event(s) in ${audit.file}${unreadable}`;
    byId("audit-summary").textContent = audit.error || summary;
    document.dispatchEvent(new CustomEvent("cellblock-audit", { detail: audit })); // charts.js draws its charts
  }

  async function loadAudit() {
    window.clearTimeout(auditTimer);
    const query = new URLSearchParams();
    for (const name of FILTERS) {
      const value = byId(`filter-${name}`).value;
      if (value) query.set(name, value);
    }
    try {
      const response = await api(`/api/audit?${query}`);
      const audit = await response.json();
      if (response.ok) showAudit(audit);
      else byId("audit-summary").textContent = audit.error || `HTTP ${response.status}`;
    } catch (error) {
      byId("audit-summary").textContent = `the audit log was not read: ${error}`;
    }
    auditTimer = window.setTimeout(loadAudit, AUDIT_MS);
  }

  async function poll() {
    try {
      const response = await api("/api/state");
      if (response.status === 403) {
        say("This page's session is gone: open the address `cellblock dashboard` printed again.");
        return; // no retry: a new address is needed
      }
      const state = await response.json();
      showApprovals(state.approvals);
      showReview(state.review);
      showGateways(state.gateways);
      byId("errors").replaceChildren(...state.errors.map((error) => element("li", "", error)));
      say(`updated ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      say(`the dashboard does not answer (${error}); is \`cellblock dashboard\` still running?`);
    }
    window.setTimeout(poll, POLL_MS);
  }

  async function start() {
    const last = element("p", "outcome");
    last.id = "last-answer";
    byId("approvals").before(last);
    let opened = false;
    try {
      opened = await openSession();
    } catch (error) {
      say(`could not open a session: ${error}`);
      return;
    }
    if (!opened) {
      say("Not signed in: open the address `cellblock dashboard` printed (it carries this run's secret).");
      return;
    }
    // the other sections' scripts (scans.js) read with the session from here on
    document.dispatchEvent(new Event("cellblock:session"));
    poll();
    for (const name of FILTERS) byId(`filter-${name}`).addEventListener("change", loadAudit);
    byId("audit-refresh").addEventListener("click", loadAudit);
    loadAudit();
  }

  start();
})();
