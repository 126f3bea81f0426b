// Cellblock's dashboard, the Scans section: the latest `cellblock scan` report of each server.
// Every string from the API came from a scanned server or a file: it is only ever set as text
// (textContent, createElement), never parsed as HTML, and never made a link.
"use strict";

(() => {
  const SCANS_MS = 10000;
  let shownKey = "";
  let timer;

  const { byId, element } = window.cellblockDom;

  function lines(title, items, className) {
    const block = element("div", className);
    block.append(element("p", "scan-label", title));
    for (const item of items) block.append(element("div", "scan-line", item));
    if (items.length === 0) block.append(element("div", "scan-line empty", "(none)"));
    return block;
  }

  function scanCard(report) {
    const card = element("article", "scan");
    card.dataset.server = report.server;
    const head = element("div", "head");
    // the badge, as text: what the SVG of `--badge` says
    const badge = element("span", report.confined ? "badge confined" : "badge failed");
    badge.append(element("span", "badge-label", "cellblock"), element("span", "badge-value", report.badge));
    head.append(element("span", "what", report.server), badge, element("span", "when", report.when));
    card.append(head);
    card.append(element("p", "scan-config", report.config));
    card.append(element("p", "scan-command", `${report.scan} · ${report.tools} tools, ${report.calls} calls`));
    const counts = Object.entries(report.counts).map(([severity, count]) => `${severity} ${count}`);
    card.append(element("p", "scan-counts", counts.join(" · ")));
    const table = element("table", "findings");
    const header = document.createElement("tr");
    for (const name of ["severity", "tool", "what"]) header.append(element("th", "", name));
    table.append(header);
    for (const finding of report.findings) {
      const tr = document.createElement("tr");
      tr.className = `finding ${finding.severity}`;
      tr.append(element("td", "severity", finding.severity), element("td", "", finding.tool));
      tr.append(element("td", "", `${finding.code}: ${finding.text}`));
      table.append(tr);
    }
    card.append(table);
    if (report.more) card.append(element("p", "hint", `${report.more} more finding(s) not shown`));
    card.append(lines("proposed jail", report.proposed, "jail proposed"));
    card.append(lines("jail as configured", report.configured, "jail configured"));
    if (report.notes.length) card.append(lines("notes", report.notes, "jail notes"));
    return card;
  }

  function show(scans) {
    const key = JSON.stringify(scans);
    if (key === shownKey) return; // unchanged: leave the page as it is (a selection, a scroll)
    shownKey = key;
    byId("scans").replaceChildren(...scans.reports.map(scanCard));
    byId("scan-errors").replaceChildren(...scans.errors.map((error) => element("li", "", error)));
    byId("no-scans").hidden = scans.reports.length > 0;
  }

  async function load() {
    window.clearTimeout(timer);
    const csrf = window.sessionStorage.getItem("cellblock-csrf");
    try {
      const response = await fetch("/api/scans", {
        headers: { "X-CSRF-Token": csrf || "" },
        credentials: "same-origin",
        cache: "no-store",
      });
      const scans = await response.json();
      if (response.ok) show(scans);
      else byId("scan-errors").replaceChildren(element("li", "", scans.error || `HTTP ${response.status}`));
    } catch (error) {
      byId("scan-errors").replaceChildren(element("li", "", `the scan reports were not read: ${error}`));
    }
    timer = window.setTimeout(load, SCANS_MS);
  }

  // dashboard.js opens the session (and keeps its CSRF token in this tab's sessionStorage)
  document.addEventListener("cellblock:session", load, { once: true });
})();
