// What answers cost and what is left of the plan, on the chat page: an info button in each answer's
// actions that opens a small panel with its tokens and cost, the conversation's total in the header,
// and the quota's words and bar in the sidebar. The server renders them for the page's owner
// (data-usage-* on each answer, templates/accounts/_quota.html); an answer's `generation.done` brings
// them for an answer written now (conversations.costs). static/chat/tree.js rebuilds an answer's
// actions row as the answer changes; this script watches for a new row and puts its button back.
// Everything goes in as text.
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const messages = document.getElementById("messages");
  if (!chat || !messages) return;
  const total = document.getElementById("conversation-usage");
  const quota = document.getElementById("quota");
  const quotaWords = document.getElementById("quota-words");
  const quotaBar = document.getElementById("quota-bar");
  // Feather's "info" icon (MIT), as the thumbs are drawn: no emoji.
  const INFO_ICON = "M12 22a10 10 0 1 0 0-20 10 10 0 0 0 0 20zM12 16v-4M12 8h.01";

  function number(value) {
    return Number(value || 0).toLocaleString("en-US");
  }

  function infoButton(el) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "link usage-info";
    b.title = "Tokens and cost of this answer";
    b.setAttribute("aria-label", b.title);
    b.setAttribute("aria-controls", panelId(el));
    b.setAttribute("aria-expanded", String(!!panelOf(el)));
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    const attributes = {viewBox: "0 0 24 24", width: "16", height: "16", fill: "none", stroke: "currentColor",
      "stroke-width": "2", "stroke-linecap": "round", "stroke-linejoin": "round", "aria-hidden": "true"};
    Object.keys(attributes).forEach(function (name) { svg.setAttribute(name, attributes[name]); });
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", INFO_ICON);
    svg.appendChild(path);
    b.appendChild(svg);
    b.addEventListener("click", function () { toggle(el); });
    return b;
  }

  function panelId(el) {
    return "usage-panel-" + (el.dataset.message || el.dataset.generation || "");
  }

  function panelOf(el) {
    return el.querySelector(":scope > .usage-panel");
  }

  function fill(panel, el) {
    const rows = [
      ["Prompt", number(el.dataset.usagePrompt) + " tokens"],
      ["Cached", number(el.dataset.usageCached) + " tokens of the prompt, from the cache"],
      ["Completion", number(el.dataset.usageCompletion) + " tokens"],
      ["Total", number(Number(el.dataset.usagePrompt || 0) + Number(el.dataset.usageCompletion || 0)) + " tokens"],
    ];
    if (el.dataset.usageCost) rows.push(["Cost", el.dataset.usageCost]);
    const list = document.createElement("dl");
    rows.forEach(function (row) {
      const term = document.createElement("dt");
      term.textContent = row[0];
      const value = document.createElement("dd");
      value.textContent = row[1];
      value.dataset.usage = row[0].toLowerCase();
      list.append(term, value);
    });
    panel.replaceChildren(list);
  }

  function toggle(el) {
    let panel = panelOf(el);
    const button = el.querySelector(":scope > .actions .usage-info");
    if (panel) {
      panel.remove();
    } else {
      panel = document.createElement("div");
      panel.className = "usage-panel";
      panel.id = panelId(el);
      panel.setAttribute("role", "group");
      panel.setAttribute("aria-label", "Tokens and cost of this answer");
      fill(panel, el);
      const actions = el.querySelector(":scope > .actions");
      if (actions) actions.after(panel);
      else el.appendChild(panel);
    }
    if (button) button.setAttribute("aria-expanded", String(!!panelOf(el)));
  }

  // An answer with its usage known gets the button in its actions row (the row tree.js made last).
  function ensure(el) {
    if (!el || !el.classList.contains("assistant") || el.dataset.usagePrompt === undefined) return;
    const actions = el.querySelector(":scope > .actions");
    if (!actions || actions.querySelector(".usage-info")) return;
    actions.appendChild(infoButton(el));
    const panel = panelOf(el);
    if (panel) actions.after(panel);  // an open panel stays under the row
  }

  function showQuota(status) {
    if (!quota || !status) return;
    quota.dataset.state = status.state;
    if (quotaWords) quotaWords.textContent = status.text;
    if (quotaBar) {
      quotaBar.hidden = status.limit === null || status.limit === undefined;
      if (!quotaBar.hidden) {
        quotaBar.max = status.limit;
        quotaBar.value = status.used;
      }
    }
  }

  chat.addEventListener("chat:frame", function (event) {
    const msg = event.detail;
    if (msg.type !== "generation.done") return;
    showQuota(msg.quota);
    const usage = msg.conversation_usage;
    if (total && usage && String(usage.conversation) === chat.dataset.conversation) total.textContent = usage.text;
    const el = messages.querySelector('article.message.assistant[data-generation="' + msg.generation + '"]');
    if (!el || !msg.usage) return;
    el.dataset.usagePrompt = msg.usage.prompt_tokens;
    el.dataset.usageCompletion = msg.usage.completion_tokens;
    el.dataset.usageCached = (msg.usage.prompt_tokens_details || {}).cached_tokens || 0;
    el.dataset.usageCost = msg.cost ? msg.cost.text : "";
    const panel = panelOf(el);
    if (panel) fill(panel, el);
    ensure(el);
  });

  new MutationObserver(function (records) {
    records.forEach(function (record) {
      record.addedNodes.forEach(function (node) {
        if (node.nodeType === 1 && node.classList.contains("actions")) ensure(node.closest("article.message"));
      });
    });
  }).observe(messages, {childList: true, subtree: true});
  messages.querySelectorAll("article.message.assistant").forEach(ensure);
})();
